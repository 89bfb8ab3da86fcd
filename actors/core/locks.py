"""Conversation-group locking: which groups a RECEIVE may take, and the leases on those it took.

Plain Python. Locks live in memory only: a broker restart rolls back every open receive, as a
database restart rolls back open transactions. A lock has a lease; a holder that dies or lets its
lease run out loses the lock and the group's messages become receivable again.
"""

from __future__ import annotations

import heapq
import itertools
import uuid
from typing import Any

from actors.ids import random_bytes


class QueueIndex:
    """Which conversation groups of one queue have messages waiting, oldest first.

    `pending[g]` counts unreceived messages of group g. `ready` is a heap of (key, g) for the
    groups that have pending messages and are not locked, keyed by (a lower bound of) the queue
    position of their oldest waiting message; stale heap entries are skipped lazily.
    """

    def __init__(self) -> None:
        self.pending: dict[int, int] = {}
        self.depth = 0  # sum of pending
        self.removed = 0  # messages removed so far (readers' progress, for activation)
        self._key: dict[int, int] = {}  # the live heap key of each ready group
        self._heap: list[tuple[int, int]] = []

    def add(self, group: int, first_id: int, count: int, locked: bool) -> None:
        """`count` messages arrived for `group`, the first at queue position `first_id`."""
        before = self.pending.get(group, 0)
        self.pending[group] = before + count
        self.depth += count
        if before == 0 and not locked:
            self.make_ready(group, first_id)

    def make_ready(self, group: int, key: int) -> None:
        if self.pending.get(group, 0) > 0 and group not in self._key:
            self._key[group] = key
            heapq.heappush(self._heap, (key, group))

    def take(self, group: int) -> int | None:
        """Remove `group` from the ready set (it is being locked); its key, or None."""
        return self._key.pop(group, None)

    def remove(self, group: int, count: int) -> None:
        """`count` messages of `group` were removed from the queue."""
        before = self.pending.get(group, 0)
        left = before - count
        self.depth -= min(before, count)
        self.removed += min(before, count)
        if left > 0:
            self.pending[group] = left
        else:
            self.pending.pop(group, None)
            self._key.pop(group, None)

    def pop_ready(self) -> tuple[int, int] | None:
        """Take the oldest ready group out of the ready set: (key, group), or None."""
        while self._heap:
            key, g = heapq.heappop(self._heap)
            if self._key.get(g) == key:
                del self._key[g]
                return key, g
        return None

    def is_ready(self, group: int) -> bool:
        return group in self._key

    def ready_count(self) -> int:
        """How many groups a receive could lock now."""
        return len(self._key)


class Turn:
    """One RECEIVE call. However many groups it locked, rolling them back (by rollback, lease
    expiry or the holder's death) is one failed turn for poison counting: Service Broker counts
    rolled-back transactions, and one receive is one transaction."""

    __slots__ = ("counted",)

    def __init__(self) -> None:
        self.counted = False  # this turn's rollback has been counted toward poison


class Lock:
    """A conversation group held by one receiver until commit or rollback. (A slotted class,
    an extension type where compiled (locks.pxd): one is made per group received, and a
    dataclass's field factories cost twice as much.)"""

    __slots__ = (
        "lock_id", "group", "queue", "owner", "expires_at", "ready_key", "first_id", "last_id",
        "count", "received_at", "turn", "audit", "settled", "to_end",
    )  # fmt: skip

    def __init__(
        self,
        lock_id: str,
        group: int,
        queue: str,
        owner: str | None,
        expires_at: float,
        ready_key: int,  # the group's queue position, to put it back where it was on rollback
        first_id: int,  # queue positions of the received messages: [first_id, last_id]
        last_id: int,
        count: int,
        received_at: float,
        turn: Turn | None = None,
    ) -> None:
        self.lock_id, self.group, self.queue, self.owner = lock_id, group, queue, owner
        self.expires_at, self.ready_key, self.received_at = expires_at, ready_key, received_at
        self.first_id, self.last_id, self.count = first_id, last_id, count
        self.turn = Turn() if turn is None else turn
        self.audit: list[Any] = []  # the received rows, chunk by chunk (actors.store.audit)
        # committed in a group commit still open: released when it commits, no longer settleable
        self.settled = False
        # its last take held every message then waiting in the group: `last_id` ends a segment
        # (segments are never extended), so its commit has no segment to cut
        self.to_end = False

    def __repr__(self) -> str:
        return f"Lock({self.lock_id!r}, group={self.group}, queue={self.queue!r})"


class LockTable:
    """Leases on conversation groups. Lock ids are unique across broker restarts and carry 64
    random bits, so a lock can be settled only by whoever was handed its id."""

    def __init__(self, default_lease_s: float = 30.0) -> None:
        self.default_lease_s = default_lease_s
        self._prefix = uuid.uuid4().hex[:12]
        self._seq = itertools.count(1)
        self.by_id: dict[str, Lock] = {}
        self.by_group: dict[int, Lock] = {}

    def is_locked(self, group: int) -> bool:
        return group in self.by_group

    def acquire(
        self,
        group: int,
        queue: str,
        owner: str | None,
        now: float,
        lease_s: float | None,
        ready_key: int,
        first_id: int,
        last_id: int,
        count: int,
        turn: Turn | None = None,
    ) -> Lock:
        assert group not in self.by_group, "group already locked"
        lock = Lock(  # positional: one is made per group received
            f"{self._prefix}-{next(self._seq)}-{random_bytes(8).hex()}",
            group,
            queue,
            owner,
            now + (self.default_lease_s if lease_s is None else lease_s),
            ready_key,
            first_id,
            last_id,
            count,
            now,
            turn,
        )
        self.by_id[lock.lock_id] = lock
        self.by_group[group] = lock
        return lock

    def get(self, lock_id: str) -> Lock | None:
        return self.by_id.get(lock_id)

    def release(self, lock: Lock) -> None:
        self.by_id.pop(lock.lock_id, None)
        self.by_group.pop(lock.group, None)

    def renew(self, lock: Lock, now: float, lease_s: float | None = None) -> None:
        lock.expires_at = now + (self.default_lease_s if lease_s is None else lease_s)

    def expired(self, now: float) -> list[Lock]:
        return [lk for lk in self.by_id.values() if lk.expires_at <= now]

    def held_by(self, owner: str) -> list[Lock]:
        return [lk for lk in self.by_id.values() if lk.owner == owner]

    def owners(self) -> set[str]:
        return {lk.owner for lk in self.by_id.values() if lk.owner is not None}

    def next_expiry(self) -> float | None:
        return min((lk.expires_at for lk in self.by_id.values()), default=None)
