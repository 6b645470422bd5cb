#!/usr/bin/env bash
# A GPU node's environment, .venv-gpu: CUDA torch 2.13.0 (PyPI's Linux wheel) and vllm 0.32.0
# (the `gpu` extra) for BOTH the inference servers and the trainer, so the vllm-nccl weight
# transfer has one vLLM (one NCCL wire format, one init schema) on both sides; the trainer
# refuses to start when a server reports another version. Safe to run twice.
#   SPADE_VLLM_PYTHON=.venv-gpu/bin/python bash scripts/inference.sh ...   (each server)
#   SPADE_VENV=.venv-gpu bash scripts/trainer.sh                           (the trainer)
# Not run by setup.sh or the tests (no GPU there): this path is checked against vLLM's source
# and the test fakes; see the README's "GPU weight sync" section.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
step() { printf '[setup-gpu] %s\n' "$*" >&2; }
if [ -f .venv-gpu/.spade-ready ] && [ ! pyproject.toml -nt .venv-gpu/.spade-ready ]; then
  exit 0
fi
command -v nvidia-smi >/dev/null || step "warning: no nvidia-smi here; installing anyway"
[ -x .venv-gpu/bin/python ] || "$PY" -m venv .venv-gpu
step "installing torch 2.13.0 (CUDA) and vllm 0.32.0 into .venv-gpu"
.venv-gpu/bin/pip install -q torch==2.13.0
.venv-gpu/bin/pip install -q -e '.[train,memory,report,eval,gpu]'
.venv-gpu/bin/python - <<'PY'
import torch, vllm
print(f"[setup-gpu] torch {torch.__version__} (CUDA {torch.version.cuda}), vllm {vllm.__version__}")
from vllm.distributed.weight_transfer.nccl_common import trainer_init  # noqa: F401
PY
touch .venv-gpu/.spade-ready
