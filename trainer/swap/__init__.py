"""Weight-swap backends: put policy version N into one running inference server.

One small class per backend (DESIGN §5), each in its own module, all on the lifecycle in
`base` and driven through the pool's pinned-endpoint POSTs so they share its deadlines, retries
and error messages: `lora` (vllm-lora), `reload` (vllm-reload), `nccl` (vllm-nccl), `none` (an
external API); `factory` picks one per endpoint. This package never decides *when* to swap: the
trainer's publisher (trainer/publish.py) does, after each published step.
"""
