#!/usr/bin/env bash
# The `trainer` process: consumes the daemon's regret batches from the spool, trains, and
# publishes versions into the inference servers (configs' [trainer] section). One process by
# default; SPADE_TRAIN_NPROC=N runs N ranks under torchrun (gloo on CPU, NCCL on GPUs), on this
# node alone, or across nodes with SPADE_TORCHRUN_ARGS="--nnodes 2 --node-rank R --rdzv-backend
# c10d --rdzv-endpoint HOST:29500" (see configs/multi-node.toml).
# SPADE_VENV picks the environment (default .venv; a GPU node: .venv-gpu from
# scripts/setup-gpu.sh, which has the servers' vLLM for the vllm-nccl weight transfer).
# Extra arguments go to `spade-train` unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
cfg=${SPADE_CONFIG:-configs/embedded.toml}
bash scripts/wait-endpoints.sh "$cfg"
venv=${SPADE_VENV:-.venv}
nproc=${SPADE_TRAIN_NPROC:-1}
if [ "$nproc" -gt 1 ] || [ -n "${SPADE_TORCHRUN_ARGS:-}" ]; then
  # shellcheck disable=SC2086  # the torchrun arguments are words on purpose
  exec "$venv/bin/torchrun" ${SPADE_TORCHRUN_ARGS:---standalone} --nproc-per-node "$nproc" \
    -m trainer --config "$cfg" "$@"
fi
exec "$venv/bin/spade-train" --config "$cfg" "$@"
