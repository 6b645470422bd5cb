"""The trainer: a separate torch process (torchrun; DDP or FSDP2; gloo on CPU, NCCL on GPU)
that consumes regret batches from the spool exactly once, trains LoRA adapters or full weights
with a clipped policy-gradient loss, checkpoints, and publishes versions into the inference
servers (DESIGN §8).

Modules: data (batch -> micro-batches), model (plain torch/peft model
code and weight export), loss (the loss and its metrics), parallel (process group, DDP/FSDP2),
checkpoint (DCP + trainer state, atomic), step (one optimizer step), export (version N onto
disk), versions (weights/vN and current.json), publish (endpoints + current.json), swap (a
package: one weight-swap backend per module: vllm-lora, vllm-reload, vllm-nccl, none),
nccl_transfer (GPU data plane for vllm-nccl), loop (the training loop), launcher (the entry
point).

Of spade_async it imports only the shared core (`spade_async.core`), the batch schema
(`spade_async.core.spool`), the endpoint pool its swaps post through, the config and logging; never
the daemon's internals (tests/test_layout.py).
"""
