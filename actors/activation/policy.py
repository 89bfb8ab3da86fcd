"""How many readers an activated queue needs; when its reader pool grows, waits, keeps a spare.

Plain Python with an injected clock. The broker's reader pools (`actors/activation/pools.py`) ask
`PoolPolicy` what to do and only carry it out: start readers, make or kill the spare reader.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from actors.model.catalog import Activation
from actors.model.limits import Limits

BACKLOG_TARGET_S = Limits.backlog_target_s


def readers_to_start(
    depth: int,
    last_depth: int,
    running: int,
    max_readers: int,
    drained_per_s: float = 0.0,
    target_s: float = BACKLOG_TARGET_S,
) -> int:
    """How many readers to add now. One when messages wait and none reads; one more while the
    queue keeps growing, or while its backlog would take the running readers more than
    `target_s` (BACKLOG_TARGET_S) to drain; up to `max_readers`. Readers leave on their own when
    idle."""
    if depth <= 0 or running >= max_readers:
        return 0
    if running == 0 or depth > last_depth:
        return 1
    return 1 if depth > drained_per_s * target_s else 0


@dataclass(frozen=True)
class Decision:
    """What a queue's reader pool should do now."""

    start: int = 0  # readers to start
    make_spare: bool = False  # start an idle reader actor that waits for the next activation
    drop_spare: bool = False  # kill the spare actor


@dataclass
class QueueState:
    """A queue's pool bookkeeping, as of its last look."""

    last_depth: int = 0
    last_removed: int = 0
    last_check: float = 0.0
    next_check: float = 0.0
    backoff_until: float = 0.0  # after a reader could not run: no new ones before this
    started: int = 0  # readers started so far
    spare: bool = False  # a spare reader actor exists


class PoolPolicy:
    """Per-queue reader-pool decisions. The caller reports what happened (a reader failed or
    ended, a spare was taken) and carries out each `Decision`."""

    def __init__(self, clock: Callable[[], float], limits: Limits | None = None) -> None:
        self.clock = clock
        self.tunables = limits or Limits()  # growth_check_s, failed_start_backoff_s, backlog_...
        self.queues: dict[str, QueueState] = {}

    def state(self, queue: str) -> QueueState:
        return self.queues.setdefault(queue, QueueState())

    def decide(
        self, queue: str, activation: Activation | None, depth: int, removed: int, running: int
    ) -> Decision:
        """Look at `queue` (`depth` waiting or locked, `removed` so far, `running` readers) with
        its activation as it stands (None: it should have no readers)."""
        s = self.state(queue)
        drop = s.spare and (activation is None or activation.placement != "pool")
        if drop:  # running readers are retired at their next receive; the spare goes now
            s.spare = False
        if activation is None:
            return Decision(drop_spare=drop)
        now = self.clock()
        if now < s.backoff_until:
            return Decision(drop_spare=drop)
        # one started actor waits for the next activation; a reader that goes idle becomes the
        # spare (it is warm), so none is made while readers run
        make = activation.placement == "pool" and not s.spare and running == 0
        if make:
            s.spare = True
        if running and now < s.next_check:
            return Decision(make_spare=make, drop_spare=drop)
        rate = (removed - s.last_removed) / max(now - s.last_check, 1e-3)
        n = readers_to_start(
            depth,
            s.last_depth,
            running,
            activation.max_readers,
            rate,
            self.tunables.backlog_target_s,
        )
        s.last_depth, s.last_removed = depth, removed
        s.last_check, s.next_check = now, now + self.tunables.growth_check_s
        s.started += n
        return Decision(start=n, make_spare=make, drop_spare=drop)

    def spare_taken(self, queue: str) -> None:
        """A pool reader started in the spare actor (or in a new one, if there was none)."""
        self.state(queue).spare = False

    def spare_gone(self, queue: str) -> None:
        """The spare actor was killed outside a decision (the broker shutting down)."""
        self.state(queue).spare = False

    def reader_failed(self, queue: str) -> None:
        """A reader could not run (bad handler, broken actor): start no new one for a while."""
        self.state(queue).backoff_until = self.clock() + self.tunables.failed_start_backoff_s

    def reader_ended(self, queue: str, activation: Activation | None, warm: bool = True) -> bool:
        """A pool reader's actor is free again; True if it becomes the spare. Only a warm one
        (its reader left normally) does, when there is no spare and activation is still on."""
        s = self.state(queue)
        if not warm or s.spare or activation is None:
            return False
        s.spare = True
        return True
