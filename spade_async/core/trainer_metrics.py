"""The trainer's `metrics.jsonl` as the other processes read it (`spade status`, `spade report`):
one JSON line per event, `"event": "step"` for an optimizer step. What a step line may carry
(older files lack some keys; every reader here tolerates that):

  step, version, time, loss, staleness_mean, logprob_abs_diff_mean, grad_norm, lr, step_s
  samples            samples trained this step (agent_samples, designer_samples: by role)
  tokens             trained (scored) tokens;  tokens_per_s: of those, per second
  real_tokens        sequence tokens of the step's samples;  seq_tokens_per_s: per second
  computed_tokens    positions run through the model, padding included
  padding_ratio      computed_tokens / real_tokens
  kl_base            mean KL of the policy to the base model on the scored tokens (or null)
  logprob_abs_diff_base   mean |log pi - log pi_base| (or null)
  dropped            this step's drops, reason -> count (stale, designer_cap, ...; the
                     token-level first_token_masked is no sample and is left out)
  totals             {"trained": N, "dropped": {reason: N}} over the trainer's life
  buffered           samples taken from the spool but not trained yet

Files written before `totals` existed are summed line by line instead: one line per batch
(a step or a "skipped" batch, with that batch's `dropped`), the last line of a batch counting
when a restart trained it again. Reads stream; nothing here writes."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from spade_async.core.rolling import iter_jsonl, tail_bytes

TAIL_BYTES = 65536


def tail_events(path: Path, nbytes: int = TAIL_BYTES) -> list[dict]:
    """The events of the file's last `nbytes` (a cut first line is skipped); [] without one."""
    lines = tail_bytes(path, nbytes).decode(errors="replace").splitlines()
    return [e for e in map(_event, lines) if e is not None]


def events(path: Path) -> Iterator[dict]:
    """Every event of the file and its rolled segments, streamed (a torn or foreign line is
    skipped)."""
    yield from iter_jsonl(path)


def _event(line: str) -> dict | None:
    try:
        e = json.loads(line)
    except ValueError:
        return None
    return e if isinstance(e, dict) else None


def _totals(e: dict) -> dict | None:
    t = e.get("totals")
    return t if isinstance(t, dict) and "trained" in t else None


def _count(x: Any) -> int:
    return int(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else 0


# Counted in `dropped` by the trainer but not a sample: a sample whose first token was masked
# loses that token only, and is still trained.
NOT_SAMPLE_DROPS = frozenset({"first_token_masked"})


def _add_dropped(into: Counter[str], dropped: Any) -> None:
    if isinstance(dropped, dict):
        for k, v in dropped.items():
            if str(k) not in NOT_SAMPLE_DROPS:
                into[str(k)] += _count(v)


def trainer_ledger(path: Path, tail: list[dict] | None = None) -> dict[str, Any] | None:
    """What became of the samples the trainer took, over its life: trained, dropped by reason,
    buffered (taken, not trained yet; None where the file does not say). From the newest line
    with `totals` (plus the drops of lines after it); an older file is summed. None: no
    events at all."""
    tail = tail_events(path) if tail is None else tail
    found = _from_totals(tail)
    if found is not None:
        return found
    trained, dropped, last_totals, after = 0, Counter[str](), None, Counter[str]()
    per_batch: dict[Any, tuple[int, dict]] = {}
    n = 0
    for e in events(path):
        n += 1
        if _totals(e) is not None:
            last_totals, after = e, Counter()
            continue
        if last_totals is not None:
            _add_dropped(after, e.get("dropped"))
        trained_here = _count(e.get("samples")) if e.get("event") == "step" else 0
        if "seq" in e:  # one line per batch in older files: a retrained batch's last line
            per_batch[e["seq"]] = (trained_here, e.get("dropped") or {})
        else:
            trained += trained_here
            _add_dropped(dropped, e.get("dropped"))
    if not n:
        return None
    if last_totals is not None:
        return _ledger(last_totals, after, "totals")
    for t, d in per_batch.values():
        trained += t
        _add_dropped(dropped, d)
    return {"trained": trained, "dropped": dict(sorted(dropped.items())), "buffered": None,
            "source": "summed"}


def _from_totals(evs: list[dict]) -> dict[str, Any] | None:
    after: Counter[str] = Counter()
    for e in reversed(evs):
        if _totals(e) is not None:
            return _ledger(e, after, "totals")
        _add_dropped(after, e.get("dropped"))
    return None


def _ledger(e: dict, after: Counter[str], source: str) -> dict[str, Any]:
    t = _totals(e) or {}
    dropped: Counter[str] = Counter()
    _add_dropped(dropped, t.get("dropped"))
    dropped.update(after)
    buffered = e.get("buffered", t.get("buffered"))
    return {"trained": _count(t.get("trained")), "dropped": dict(sorted(dropped.items())),
            "buffered": _count(buffered) if buffered is not None else None, "source": source}


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def step_figures(s: dict) -> dict[str, float | None]:
    """One step's throughput and drift, from the keys it has: padded/real, trained and
    sequence tokens per second, KL and mean |delta log p| to the base model."""
    real, computed, secs = _num(s.get("real_tokens")), _num(s.get("computed_tokens")), \
        _num(s.get("step_s"))
    pad = _num(s.get("padding_ratio"))
    if pad is None and real and computed is not None:
        pad = computed / real
    tps = _num(s.get("tokens_per_s"))
    if tps is None and secs and _num(s.get("tokens")) is not None:
        tps = _num(s.get("tokens")) / secs  # type: ignore[operator]
    seq = _num(s.get("seq_tokens_per_s"))
    if seq is None and secs and real is not None:
        seq = real / secs
    return {"padding_ratio": pad, "tokens_per_s": tps, "seq_tokens_per_s": seq,
            "kl_base": _num(s.get("kl_base")),
            "logprob_abs_diff_base": _num(s.get("logprob_abs_diff_base"))}


def step_stats(steps: list[dict]) -> dict[str, Any]:
    """Over these step lines: how many, steps per hour, mean samples per step, padded/real
    and tokens per second (ratios of sums where the lines carry the counts, else means of
    their per-step figures), and the last KL and |delta log p| to the base model."""
    out: dict[str, Any] = {"steps": len(steps), "steps_per_hour": None,
                           "samples_per_step": None, "padding_ratio": None,
                           "tokens_per_s": None, "seq_tokens_per_s": None, "kl_base": None,
                           "logprob_abs_diff_base": None}
    if not steps:
        return out
    times = [t for t in (_num(s.get("time")) for s in steps) if t is not None]
    if len(times) >= 2 and max(times) > min(times):
        out["steps_per_hour"] = round((len(times) - 1) / (max(times) - min(times)) * 3600, 2)
    samples = [_count(s.get("samples")) for s in steps if "samples" in s]
    if samples:
        out["samples_per_step"] = round(sum(samples) / len(samples), 2)
    figs = [step_figures(s) for s in steps]

    def ratio(num: str, den: str) -> float | None:
        rows = [(_num(s.get(num)), _num(s.get(den))) for s in steps]
        rows = [(a, b) for a, b in rows if a is not None and b]
        return sum(a for a, _ in rows) / sum(b for _, b in rows) if rows else None

    def mean(key: str) -> float | None:
        xs = [f[key] for f in figs if f[key] is not None]
        return sum(xs) / len(xs) if xs else None

    for key, (num, den) in (("padding_ratio", ("computed_tokens", "real_tokens")),
                            ("tokens_per_s", ("tokens", "step_s")),
                            ("seq_tokens_per_s", ("real_tokens", "step_s"))):
        v = ratio(num, den)
        v = mean(key) if v is None else v
        out[key] = None if v is None else round(v, 3 if key == "padding_ratio" else 1)
    for key in ("kl_base", "logprob_abs_diff_base"):
        last = next((f[key] for f in reversed(figs) if f[key] is not None), None)
        out[key] = None if last is None else round(last, 6)
    return out

