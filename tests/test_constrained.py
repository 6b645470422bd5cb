"""Choice-constrained samples: the allowed sets reconstructed from bytes, their trip through the
spool, and the trainer scoring them under the constrained distribution."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spade_async.core.spool.batch import Sample, SampleError
from spade_async.core.spool.files import FileSpool
from spade_async.inference.constrained import (
    ConstraintError,
    TokenBytes,
    choice_allowed_sets,
    chosen,
)
from trainer.data import collate, select_samples
from trainer.model import constrained_lse

CHOICES = ['{"digits": 1, "ops": "+"}', '{"digits": 2, "ops": "+"}', '{"digits": 1, "ops": "*"}']


@pytest.fixture(scope="module")
def tok(checkpoint):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(checkpoint))


@pytest.fixture(scope="module")
def vocab(tok):
    return TokenBytes(tok, [tok.eos_token_id])


def test_token_bytes_round_trip_the_tokenizer(tok, vocab):
    text = 'Ünïcode "quotes", digits 12345 and\ttabs\n'
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert vocab.text_bytes(ids) == text.encode()
    assert vocab.bytes[tok.eos_token_id] is None  # a special token spells no text


def test_allowed_sets_for_canonical_and_odd_tokenizations(tok, vocab):
    eos = tok.eos_token_id
    canonical = tok(CHOICES[1], add_special_tokens=False)["input_ids"] + [eos]
    # one byte-level token per character: a path the server may take too
    by_char = [vocab.ids_of[c.encode()][0] for c in CHOICES[1]] + [eos]
    for sampled in (canonical, by_char):
        sets = choice_allowed_sets(vocab, CHOICES, sampled)
        assert len(sets) == len(sampled)
        assert all(t in s for t, s in zip(sampled, sets, strict=True))
        assert sets[-1] == [eos]  # only the stop token once a choice is complete
        assert chosen(vocab, CHOICES, sampled) == CHOICES[1]
    # the step choosing the digit allows exactly the digits some choice has there
    sets = choice_allowed_sets(vocab, CHOICES, by_char)
    k = CHOICES[1].index("2")
    digits = {t for t in sets[k] if (vocab.bytes[t] or b"").isdigit()}
    assert {vocab.bytes[t] for t in digits} == {b"1", b"2"}


def test_a_token_outside_the_constraint_is_refused(tok, vocab):
    bad = tok('{"digits": 3', add_special_tokens=False)["input_ids"]
    with pytest.raises(ConstraintError, match="outside the"):
        choice_allowed_sets(vocab, CHOICES, bad)
    assert chosen(vocab, CHOICES, bad) is None


def _sample(sid: str, tokens: list[int], mask: list[int], lps: list[float], allowed,
            move: str = "edit") -> Sample:
    return Sample(sample_id=sid, role="designer", env_id="e", policy_version=0,
                  token_ids=tokens, loss_mask=mask, behaviour_logprobs=lps, advantage=1.0,
                  reward=0.5, move=move, allowed_tokens=allowed)


def test_spool_checks_and_keeps_allowed_sets(tmp_path):
    ok = _sample("a", [5, 6, 7, 8], [0, 0, 1, 1], [0, 0, -0.5, 0.0], [[7, 9], [8]])
    free = _sample("b", [5, 6, 7], [0, 1, 1], [0, -1.0, -2.0], None, move="write")
    with FileSpool(tmp_path, writer=True) as spool:
        spool.write([ok, free])
        batch = spool.claim_next(0)
    got = {s.sample_id: s for s in batch.samples()}
    assert got["a"].allowed_tokens == [[7, 9], [8]] and got["a"].move == "edit"
    assert got["b"].allowed_tokens is None
    with pytest.raises(SampleError, match="2 sets for 1 sampled"):
        _sample("c", [5, 6, 7], [0, 0, 1], [0, 0, -1.0], [[7], [7]]).validate()
    with pytest.raises(SampleError, match="does not hold the sampled token 7"):
        _sample("d", [5, 6, 7], [0, 0, 1], [0, 0, -1.0], [[9]]).validate()


def test_constrained_lse_matches_masked_logsumexp():
    torch.manual_seed(0)
    logits = torch.randn(4, 11, dtype=torch.float64, requires_grad=True)
    lse = torch.logsumexp(logits, -1)
    allowed = {0: [1, 3, 4], 2: [7]}  # rows 1 and 3 unconstrained
    pos = torch.tensor([p for p, ids in allowed.items() for _ in ids])
    tok = torch.tensor([t for ids in allowed.values() for t in ids])
    got = constrained_lse(logits, lse, pos, tok)
    want = lse.clone()
    for p, ids in allowed.items():
        want[p] = torch.logsumexp(logits[p, ids], -1)
    torch.testing.assert_close(got, want)
    # a forced token (one allowed id) has log-prob exactly 0 and no gradient through it
    lp = logits[2, 7] - got[2]
    lp.backward()
    assert float(lp.detach()) == 0.0 and float(logits.grad.abs().sum()) == 0.0


def test_collate_maps_allowed_sets_onto_trained_tokens(tmp_path):
    # sample "a" has its first token marked: the trainer drops it, and its allowed set too
    a = _sample("a", [3, 4, 5, 6], [1, 0, 1, 1], [-0.1, 0, -0.2, 0.0], [[3, 2], [5, 1], [6]])
    b = _sample("b", [2, 3, 4], [0, 1, 1], [0, -1.0, -2.0], None, move="write")
    with FileSpool(tmp_path, writer=True) as spool:
        spool.write([b, a])
        batch = spool.claim_next(0)
    sel = select_samples(batch, current_version=0, max_staleness=1,
                         role_weights={"designer": 1.0})
    by_id = {s.sample_id: s for s in sel.samples}
    assert [list(x) for x in by_id["a"].allowed] == [[5, 1], [6]]
    mb = collate(sel.samples)
    # flat order: row b's two tokens, then row a's two
    assert mb.allowed_pos.tolist() == [2, 2, 3] and mb.allowed_tok.tolist() == [5, 1, 6]
    assert mb.edit.tolist() == [False, False, True, True]
    assert np.isclose(mb.behaviour_logprobs.tolist(), [-1.0, -2.0, -0.2, 0.0]).all()
