#!/usr/bin/env bash
# The `trainer` process: consumes the daemon's regret batches from the spool, trains, and
# publishes versions into the inference servers (configs' [trainer] section). One process by
# default; SPADE_TRAIN_NPROC=N runs N ranks under torchrun (gloo on CPU, NCCL on GPUs).
# Extra arguments go to `spade-train` unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
cfg=${SPADE_CONFIG:-configs/embedded.toml}
bash scripts/wait-endpoints.sh "$cfg"
nproc=${SPADE_TRAIN_NPROC:-1}
if [ "$nproc" -gt 1 ]; then
  exec .venv/bin/torchrun --standalone --nproc-per-node "$nproc" -m trainer --config "$cfg" "$@"
fi
exec .venv/bin/spade-train --config "$cfg" "$@"
