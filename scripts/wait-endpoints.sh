#!/usr/bin/env bash
# Wait (up to 10 minutes) until every endpoint of config $1 answers; the Procfile's daemon and
# trainer start in step with the inference servers this way.
set -euo pipefail
cd "$(dirname "$0")/.."
for _ in $(seq 600); do
  .venv/bin/spade endpoints check --config "$1" --json >/dev/null 2>&1 && exit 0
  sleep 1
done
echo "warning: endpoints of $1 still down after 10 minutes; starting anyway" >&2
