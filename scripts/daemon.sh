#!/usr/bin/env bash
# The `daemon` process: waits for the inference server, then runs `spade run` on the config.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
cfg=${SPADE_CONFIG:-configs/embedded.toml}
for _ in $(seq 600); do
  .venv/bin/spade endpoints check --config "$cfg" --json >/dev/null 2>&1 && break
  sleep 1
done
exec .venv/bin/spade run --config "$cfg" "$@"
