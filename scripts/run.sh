#!/usr/bin/env bash
# The README's run command: installs what is missing (safe to run twice), then brings up the
# Procfile stack (inference, daemon, trainer) with honcho until Ctrl-C.
#   bash scripts/run.sh            the embedded CPU default (configs/embedded.toml), runs until stopped
#   bash scripts/run.sh --smoke    bounded: configs/smoke.toml, stops by itself once the trainer
#                                  has published two new versions and the daemon sampled with them
# SPADE_CONFIG=F picks another config for every process; other arguments go to `honcho start`.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
smoke=0
args=()
for a in "$@"; do
  case $a in
    --smoke) smoke=1 ;;
    *) args+=("$a") ;;
  esac
done
if [ "$smoke" = 1 ]; then
  export SPADE_CONFIG=${SPADE_CONFIG:-configs/smoke.toml}
fi
export SPADE_CONFIG=${SPADE_CONFIG:-configs/embedded.toml}
bash scripts/setup.sh
# honcho stops the whole stack when one process exits; the wrapper says which one and why, in
# one line, and keeps the whole log in <data_dir>/run/stack.log (see spade_async/cli/supervise.py).
stack=(.venv/bin/python -m spade_async.cli.supervise --config "$SPADE_CONFIG" --
       .venv/bin/honcho start "${args[@]}")
if [ "$smoke" = 0 ]; then
  exec "${stack[@]}"
fi
start=$(date +%s)
rc=0
"${stack[@]}" || rc=$?
echo "[smoke] the stack stopped after $(( $(date +%s) - start )) s (honcho rc=$rc); what it did:" >&2
.venv/bin/spade status --config "$SPADE_CONFIG" >&2 || rc=1
reason=$(.venv/bin/spade status --config "$SPADE_CONFIG" --json 2>/dev/null \
         | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin).get("stop_reason") or "")' || true)
if [ "$reason" != stop_after_versions ]; then
  echo "[smoke] error: the daemon did not reach daemon.stop_after_versions (stop reason: ${reason:-none})" >&2
  [ "$rc" != 0 ] || rc=1
fi
echo "[smoke] plots: .venv/bin/spade report --config $SPADE_CONFIG" >&2
exit "$rc"
