"""The memory's capacity: PLR's level buffer has a fixed size, and so does ours.

Past `max_accepted` accepted environments, the upkeep deletes the lowest-ranked played ones (by
their best variant's replay score, then the longest unplayed, then id) with their variants'
stats; an environment never played, or played within `retire_grace_s` (its plays may still be
in flight), is never retired. Past `max_rejected` rejected designs, the oldest rows go. The run
records (designs, plays, episodes) keep what each one was and did.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from memory_db.records import EnvStats
from memory_db.replay import score_of


def to_retire(accepted: set[str], stats: Mapping[str, EnvStats], env_of: Mapping[str, str], *,
              keep: int, score: str, now: datetime, grace_s: float) -> list[str]:
    """The accepted environments to delete so that at most `keep` remain (fewer when too few
    are eligible); none when `keep` is 0 (no limit)."""
    excess = len(accepted) - keep
    if keep <= 0 or excess <= 0:
        return []
    rank: dict[str, tuple[float, int]] = {}  # env -> (best variant score, latest visit)
    recent: set[str] = set()
    for vid, s in stats.items():
        env = env_of.get(vid, vid)
        if env not in accepted or s.episodes_unhinted <= 0:
            continue
        if s.updated_at is not None and (now - s.updated_at).total_seconds() < grace_s:
            recent.add(env)
        sc, tick = score_of(s, score), -1 if s.last_tick is None else s.last_tick
        prev = rank.get(env)
        rank[env] = (max(prev[0], sc), max(prev[1], tick)) if prev else (sc, tick)
    order = sorted((sc, tick, env) for env, (sc, tick) in rank.items() if env not in recent)
    return [env for _, _, env in order[:excess]]


def oldest_beyond(rows: list[tuple[str, datetime]], keep: int) -> list[str]:
    """Of (id, created_at) rows, the ids past the newest `keep` (none when `keep` is 0)."""
    if keep <= 0 or len(rows) <= keep:
        return []
    ordered = sorted(rows, key=lambda r: (r[1], r[0]))
    return [i for i, _ in ordered[:len(rows) - keep]]
