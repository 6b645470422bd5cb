#!/usr/bin/env bash
# Builds .venv-games, the venv of the TextArena game suite (spade_async/evals/games.py); safe to
# run twice. textarena pulls openai, chess and the rest of its agent stack, and its import needs
# nltk, rich, requests and websockets at versions nobody here pins, so it gets its own venv with
# exactly these packages, --no-deps. The games the suite plays need no data from the network
# (games_worker.py refuses sockets and nltk downloads).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
step() { printf '[setup] %s\n' "$*" >&2; }

TEXTARENA_VERSION=0.7.4
PACKAGES=(
  "textarena==$TEXTARENA_VERSION"
  nltk==3.9.2 click==8.5.1 joblib==1.6.0 regex==2026.12.2 tqdm==4.70.1
  rich==15.0.0 markdown-it-py==4.3.0 mdurl==0.1.2 Pygments==2.21.0
  requests==2.34.2 urllib3==2.8.0 idna==3.21 certifi==2026.10.19.post1
  charset-normalizer==3.5.3 websockets==17.4
)
stamp=.venv-games/.spade-ready
check() {
  printf '{"op": "ping"}\n{"op": "reset", "game": "TowerOfHanoi-v0", "seed": 0}\n' \
    | .venv-games/bin/python -I spade_async/evals/games_worker.py \
    | .venv-games/bin/python -I -c '
import json, sys
ping, reset = (json.loads(line) for line in sys.stdin)
sys.exit(ping["result"]["textarena"] != sys.argv[1] or "Tower of Hanoi" not in
         reset["result"]["observation"])' "$TEXTARENA_VERSION"
}

if [ -f "$stamp" ] && check 2>/dev/null; then
  exit 0  # ready: say nothing, like setup.sh
fi
rm -f "$stamp"
if [ ! -x .venv-games/bin/python ]; then
  step "creating .venv-games"
  "$PY" -m venv .venv-games
fi
step "installing textarena $TEXTARENA_VERSION and what its import needs (--no-deps) into .venv-games"
.venv-games/bin/pip install -q --no-deps "${PACKAGES[@]}"
if ! check; then
  step "error: the TextArena game worker does not start in .venv-games"
  exit 1
fi
touch "$stamp"
step ".venv-games is ready (textarena $TEXTARENA_VERSION)"
