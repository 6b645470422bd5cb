"""The tokens the loop's requests cost, per role: prompt tokens (prefilled) and sampled tokens
(decoded), counted from every completion an endpoint returned to a design or an episode turn
(those of failed episodes too: the endpoint did that work), and their rates over the last
minute and over the run. `spade status` sets the sampled rate against what `spade bench
inference` measured (DESIGN §10)."""

from __future__ import annotations

import time
from collections import Counter, deque
from typing import Any

from spade_async.loop.metrics import Metrics

WINDOW_S = 60.0


class TokenUsage:
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self.prompt: Counter[str] = Counter()
        self.sampled: Counter[str] = Counter()
        self.requests: Counter[str] = Counter()
        self.started = time.monotonic()
        self._ticks: deque[tuple[float, int, int]] = deque()  # (time, sampled, prompt)

    def add(self, role: str, completion: Any) -> None:
        """One completion of `role` (agent or designer) came back."""
        sampled = int(completion.completion_tokens)
        prompt = len(completion.prompt_token_ids or ()) or int(
            (completion.usage or {}).get("prompt_tokens", 0))
        self.requests[role] += 1
        self.sampled[role] += sampled
        self.prompt[role] += prompt
        self._metrics.request_tokens.labels(role, "sampled").inc(sampled)
        self._metrics.request_tokens.labels(role, "prompt").inc(prompt)

    def tick(self, now: float | None = None) -> None:
        """A reading for the window's rate (telemetry calls it each status interval)."""
        now = time.monotonic() if now is None else now
        self._ticks.append((now, sum(self.sampled.values()), sum(self.prompt.values())))
        while len(self._ticks) > 1 and now - self._ticks[0][0] > WINDOW_S:
            self._ticks.popleft()

    def as_dict(self, now: float | None = None) -> dict[str, Any]:
        """Totals per role, and tokens/s over the run and over the last minute's readings."""
        now = time.monotonic() if now is None else now
        sampled, prompt = sum(self.sampled.values()), sum(self.prompt.values())
        run_s = now - self.started
        window = None
        if self._ticks and now - self._ticks[0][0] >= 1.0:  # a rate needs some time
            t0, s0, p0 = self._ticks[0]
            window = {"seconds": round(now - t0, 1),
                      "sampled_per_s": round((sampled - s0) / (now - t0), 2),
                      "prompt_per_s": round((prompt - p0) / (now - t0), 2)}
        return {
            "roles": {role: {"requests": self.requests[role], "sampled": self.sampled[role],
                             "prompt": self.prompt[role]}
                      for role in sorted(set(self.requests) | {"agent", "designer"})},
            "sampled": sampled, "prompt": prompt, "seconds": round(run_s, 1),
            "sampled_per_s": round(sampled / run_s, 2) if run_s > 0 else None,
            "prompt_per_s": round(prompt / run_s, 2) if run_s > 0 else None,
            "window": window,
        }


class CountingPool:
    """The endpoint pool (or one admitted stream's view of it) as one role's requests see it:
    every completion's tokens are counted under that role."""

    def __init__(self, pool: Any, usage: TokenUsage, role: str) -> None:
        self._pool, self._usage, self._role = pool, usage, role

    async def complete(self, *args: Any, **kw: Any) -> Any:
        out = await self._pool.complete(*args, **kw)
        self._usage.add(self._role, out)
        return out

    async def chat(self, *args: Any, **kw: Any) -> Any:
        out = await self._pool.chat(*args, **kw)
        self._usage.add(self._role, out)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)
