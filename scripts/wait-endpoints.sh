#!/usr/bin/env bash
# Wait (up to 10 minutes) until every endpoint of config $1 answers; the Procfile's daemon and
# trainer start in step with the inference servers this way.
set -euo pipefail
cd "$(dirname "$0")/.."
# Exit 3 of the check: all up, but a role cannot run there; `spade run` says why at start.
for _ in $(seq 600); do
  rc=0
  .venv/bin/spade endpoints check --config "$1" --json >/dev/null 2>&1 || rc=$?
  { [ "$rc" = 0 ] || [ "$rc" = 3 ]; } && exit 0
  sleep 1
done
echo "warning: endpoints of $1 still down after 10 minutes; starting anyway" >&2
