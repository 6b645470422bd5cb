"""Test and benchmark helpers: a tiny random Llama checkpoint, synthetic spool batches, configs.

Never used by the trainer itself.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from spade_async.core.spool.batch import Sample
from spade_async.core.spool.files import FileSpool


def tiny_llama(out: Path, *, vocab: int = 256, hidden: int = 64, layers: int = 2,
               seed: int = 0) -> Path:
    """A randomly initialised LlamaForCausalLM (bf16 on disk, tied embeddings, like SmolLM2)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, tie_word_embeddings=True, dtype="bfloat16")
    torch.manual_seed(seed)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
    return out


def synthetic_sample(rng: np.random.Generator, sample_id: str, *, vocab: int,
                     length: tuple[int, int] = (12, 40), policy_version: int = 0,
                     role: str = "agent") -> Sample:
    """A prompt followed by 'sampled' tokens with plausible behaviour log-probs."""
    n = int(rng.integers(*length))
    prompt = int(rng.integers(2, n - 1))
    mask = [0] * prompt + [1] * (n - prompt)
    logprobs = [0.0] * prompt + [float(np.float32(-rng.random() * 3 - 0.05))
                                 for _ in range(n - prompt)]
    return Sample(
        sample_id=sample_id, role=role,  # type: ignore[arg-type]
        env_id=f"env-{sample_id}", policy_version=policy_version,
        token_ids=[int(t) for t in rng.integers(3, vocab, n)], loss_mask=mask,
        behaviour_logprobs=logprobs, advantage=float(np.float32(rng.normal())),
        reward=float(np.float32(rng.random())), episode_id=f"ep-{sample_id}")


def write_batches(spool_dir: Path, n_batches: int, *, skip: int = 0, samples_per_batch: int = 6,
                  vocab: int = 256, seed: int = 0, policy_version: int = 0) -> list[int]:
    """Append batches `skip .. skip + n_batches - 1` of the synthetic stream `seed` (agent and
    designer samples); returns their seqs. The stream is the same however it is cut."""
    rng = np.random.default_rng(seed)
    seqs = []
    with FileSpool(spool_dir, writer=True) as spool:
        for b in range(skip + n_batches):
            samples = [synthetic_sample(rng, f"b{b}-s{i}", vocab=vocab,
                                        policy_version=policy_version,
                                        role="designer" if i % 3 == 0 else "agent")
                       for i in range(samples_per_batch)]
            if b >= skip:
                seqs.append(spool.write(samples))
    return seqs


def write_config(path: Path, data_dir: Path, *, checkpoint_name: str,
                 endpoints: list[tuple[str, str, str]] = (), served_name: str = "policy",
                 swap_options: str = "", extra: str = "") -> Path:
    """A SPADE TOML config; endpoints as (name, base_url, weight_swap type), `swap_options`
    TOML lines added to every endpoint's weight_swap table."""
    lines = [f'[paths]\ndata_dir = "{data_dir}"\n',
             f'[model]\nserved_name = "{served_name}"\ncheckpoint_name = "{checkpoint_name}"\n',
             "[pool]\nbackoff_initial_s = 0.05\nwait_for_endpoint_s = 5\n"]
    for name, url, swap in endpoints:
        lines.append(f'[[endpoints]]\nname = "{name}"\nbase_url = "{url}"\n'
                     f'request_timeout_s = 120\n[endpoints.weight_swap]\ntype = "{swap}"\n'
                     + swap_options)
    path.write_text("\n".join(lines) + extra)
    return path


def write_trainer_config(path: Path, **values: object) -> Path:
    def toml(v: object) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str | Path):
            return f'"{v}"'
        if isinstance(v, list | tuple):
            return "[" + ", ".join(toml(x) for x in v) + "]"
        return repr(v)

    path.write_text("[trainer]\n" + "".join(f"{k} = {toml(v)}\n" for k, v in values.items()))
    return path
