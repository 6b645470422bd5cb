"""Admission: how much work the daemon keeps in flight, sized to the endpoints' capacity
(DESIGN §10: endpoint saturation).

The daemon's work comes in three kinds: documents (or edit groups), whose G design requests go
to the designer's endpoint group; plays, whose K_u + K_h episodes each send one request after
another to the agent's group; and replays, plays of stored environments. An admitted item
reserves one *stream* per request it will keep going (a design, an episode). A group's demand is
what the pool counts as busy there (requests in flight or queued for a slot, the evaluation's
included) plus the streams admitted that have not sent their first request yet; new work is
admitted while the demand is below the group's capacity (the sum of its endpoints'
`max_concurrency`) plus a margin of a quarter of it. A stream between two requests (its
environment stepping in the sandbox, a back-off) does not count: more work comes in to cover
such gaps, and the margin keeps a few requests queued in the pool, so a slot that frees finds
one waiting. The last item admitted may overshoot by its width; the surplus queues.

Bounds beside capacity: the sandbox slots (episodes alive), the policy-lag limit (the daemon's
back-pressure from the trainer, applied before a new document or replay is admitted), the
bounded env queue, and the optional `daemon.documents_in_flight` / `envs_in_flight` caps.
Where designs and plays share a group, plays already accepted go first (they finish batches;
a new document only adds work before its batch), and one document is always let in so the
designer never starves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio

from spade_async.inference.pool import EndpointPool

# How often a waiting admission looks again when no stream of ours changed (the pool's count
# also moves with requests we do not track: the evaluation's, retries).
POLL_S = 0.05
MARGIN = 0.25  # requests kept queued beyond capacity, as a share of it


class Stream:
    """One request stream of an admitted item: starting (not yet sent a request), running,
    then ended."""

    __slots__ = ("admission", "group", "episode", "state")

    def __init__(self, admission: Admission, group: str, episode: bool) -> None:
        self.admission, self.group, self.episode = admission, group, episode
        self.state = "starting"

    def started(self) -> None:
        if self.state == "starting":
            self.state = "running"
            self.admission._starting[self.group] -= 1
            self.admission.notify()

    def end(self) -> None:
        if self.state != "ended":
            adm = self.admission
            if self.state == "starting":
                adm._starting[self.group] -= 1
            self.state = "ended"
            adm.streams[self.group] -= 1
            if self.episode:
                adm.episodes -= 1
            adm.notify()


class Reservation:
    """The streams of one item: `take()` hands the next to the request loop that uses it,
    `close()` ends the ones left (the item is over)."""

    def __init__(self, streams: list[Stream]) -> None:
        self._streams = streams
        self._next = 0

    def take(self) -> Stream:
        if self._next < len(self._streams):
            self._next += 1
            return self._streams[self._next - 1]
        # more requests than reserved (a retried round): one more stream, counted as well
        s = self._streams[0]
        extra = s.admission.reserve(s.group, 1, episodes=s.episode)._streams[0]
        self._streams.append(extra)
        self._next += 1
        return extra

    @property
    def left(self) -> int:
        return sum(s.state != "ended" for s in self._streams)

    def close(self) -> None:
        for s in self._streams:
            s.end()


class StreamPool:
    """The endpoint pool as one stream sees it: its first request marks it started."""

    def __init__(self, pool: EndpointPool, stream: Stream) -> None:
        self._pool, self._stream = pool, stream

    async def complete(self, *args: Any, **kw: Any) -> Any:
        self._stream.started()
        return await self._pool.complete(*args, **kw)

    async def chat(self, *args: Any, **kw: Any) -> Any:
        self._stream.started()
        return await self._pool.chat(*args, **kw)

    async def post(self, *args: Any, **kw: Any) -> Any:
        self._stream.started()
        return await self._pool.post(*args, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)


class Admission:
    def __init__(self, pool: EndpointPool, *, agent_group: str, designer_group: str,
                 sandbox_slots: int, max_documents: int | None = None,
                 max_plays: int | None = None, queue_size: int = 8,
                 plays_queued: Callable[[], int] = lambda: 0) -> None:
        self.pool = pool
        self.agent_group, self.designer_group = agent_group, designer_group
        self.sandbox_slots = sandbox_slots
        self.max_documents, self.max_plays = max_documents, max_plays
        self.queue_size = queue_size
        self._plays_queued = plays_queued  # accepted environments waiting in the env stream
        self.streams: dict[str, int] = {}  # streams alive, per group
        self._starting: dict[str, int] = {}  # of which not yet sent a request
        self.documents = 0  # documents and edit groups in flight
        self.plays = 0  # plays in flight
        self.episodes = 0  # episode streams alive (each holds a sandbox slot while it runs)
        self.holding_play = False  # the dispatcher holds a play waiting for room
        self._changed = anyio.Event()

    # ---- what is free ----------------------------------------------------------------------

    def capacity(self, group: str) -> int:
        return self.pool.capacity(group)

    def demand(self, group: str) -> int:
        return self.pool.busy(group) + self._starting.get(group, 0)

    def room(self, group: str) -> int:
        """Requests more `group` could take before its queue is as long as the margin."""
        cap = self.capacity(group)
        return cap + max(1, round(cap * MARGIN)) - self.demand(group)

    @property
    def shared(self) -> bool:
        """Designs and episodes go to the same endpoints."""
        return self.agent_group == self.designer_group

    def plays_waiting(self) -> int:
        return self._plays_queued() + self.holding_play

    def can_play(self, episodes: int) -> bool:
        """Room for a play of `episodes` episodes (always for the first one: work accepted
        must progress, whatever the endpoints' state)."""
        if self.plays == 0:
            return True
        if self.max_plays is not None and self.plays >= self.max_plays:
            return False
        return (self.room(self.agent_group) > 0
                and self.episodes + episodes <= self.sandbox_slots)

    def can_design(self) -> bool:
        """Room for a new document, edit group or replay (always for the first document)."""
        if self.documents == 0:
            return True
        if self.max_documents is not None and self.documents >= self.max_documents:
            return False
        if self.shared and self.plays_waiting():
            return False  # accepted environments first: they finish batches
        if self.room(self.designer_group) <= 0:
            return False
        # Separate groups: the designer's endpoints stay busy while the agent's work through
        # the queue, but never beyond a full queue of accepted environments (their designs
        # would only grow stale waiting).
        return self.shared or self.plays_waiting() < self.queue_size

    async def wait(self, ready: Callable[[], bool]) -> None:
        """Until `ready()`: woken when a stream of ours changes, and every POLL_S at most."""
        while not ready():
            event = self._changed
            with anyio.move_on_after(POLL_S):
                await event.wait()

    # ---- reservations ----------------------------------------------------------------------

    def reserve(self, group: str, n: int, *, episodes: bool = False) -> Reservation:
        self.streams[group] = self.streams.get(group, 0) + n
        self._starting[group] = self._starting.get(group, 0) + n
        if episodes:
            self.episodes += n
        return Reservation([Stream(self, group, episodes) for _ in range(n)])

    def notify(self) -> None:
        """Something admission depends on changed: look again now."""
        self._changed.set()
        self._changed = anyio.Event()

    def as_dict(self) -> dict[str, object]:
        groups = sorted({self.agent_group, self.designer_group})
        return {"documents": self.documents, "plays": self.plays, "episodes": self.episodes,
                "plays_waiting": self.plays_waiting(),
                "groups": {g: {"capacity": self.capacity(g), "busy": self.pool.busy(g),
                               "streams": self.streams.get(g, 0),
                               "starting": self._starting.get(g, 0)} for g in groups}}
