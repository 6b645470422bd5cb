#!/usr/bin/env bash
# Installs what is missing (safe to run twice), then runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q -e '.[test]'
set +e
.venv/bin/python -m pytest -q "$@"
rc=$?
set -e
# pytest exit 5 means no test ran: that is a failure, not a pass.
[ "$rc" -eq 5 ] && { echo "no tests were collected" >&2; exit 1; }
exit "$rc"
