#!/usr/bin/env bash
# The `daemon` process: waits for the inference server, then runs `spade run` on the config.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
cfg=${SPADE_CONFIG:-configs/embedded.toml}
bash scripts/wait-endpoints.sh "$cfg"
exec .venv/bin/spade run --config "$cfg" "$@"
