#!/usr/bin/env bash
# Builds .venv-bfcl, the venv of the BFCL multi-turn eval suite (spade_async/evals/bfcl.py);
# safe to run twice. bfcl-eval's own pins (numpy==1.26.4, filelock, networkx, ...) clash with
# .venv, and its full install is ~6 GB (torch, CUDA wheels, API SDKs), so it gets its own venv
# with --no-deps: the multi-turn executor, checker and backends need only mpmath (MathAPI).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
step() { printf '[setup] %s\n' "$*" >&2; }

BFCL_VERSION=2026.3.23
stamp=.venv-bfcl/.spade-ready
# Importing some bfcl modules writes result/ score/ dirs under BFCL_PROJECT_ROOT (default:
# site-packages); the check below keeps that in a scratch dir.
check() {
  local scratch rc=0
  scratch=$(mktemp -d)
  BFCL_PROJECT_ROOT="$scratch" .venv-bfcl/bin/python -c '
import importlib.metadata as md, sys
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call
from bfcl_eval.eval_checker.multi_turn_eval.func_source_code.math_api import MathAPI
sys.exit(md.version("bfcl-eval") != sys.argv[1])' "$BFCL_VERSION" || rc=$?
  rm -rf "$scratch"
  return $rc
}

if [ -f "$stamp" ] && check 2>/dev/null; then
  exit 0  # ready: say nothing, like setup.sh
fi
rm -f "$stamp"
if [ ! -x .venv-bfcl/bin/python ]; then
  step "creating .venv-bfcl"
  "$PY" -m venv .venv-bfcl
fi
step "installing bfcl-eval $BFCL_VERSION (--no-deps) and mpmath into .venv-bfcl"
.venv-bfcl/bin/pip install -q --no-deps "bfcl-eval==$BFCL_VERSION" mpmath==1.3.0
if ! check; then
  step "error: the bfcl multi-turn checker does not import in .venv-bfcl"
  exit 1
fi
touch "$stamp"
step ".venv-bfcl is ready (bfcl-eval $BFCL_VERSION)"
