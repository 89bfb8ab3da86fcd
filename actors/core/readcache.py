"""A write-through cache of waiting messages, so a receive that follows a send needs no SELECT.

Plain Python. A group is cached only while the cache holds *all* of its waiting messages, in
queue order: caching starts when a message arrives for a group with none waiting, and anything
that changes a group other than by appending or taking its oldest messages drops it (it is then
read from the store until it is empty again). The store stays the truth; a broker restart starts
with an empty cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Rows are the store's insert tuples:
# (id, group_no, endpoint_no, seq, type, body, status, sent_at, arrived_at)
StoredRow = tuple[Any, ...]
ROW_OVERHEAD = 64  # bytes counted per row on top of its body


class ReadCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._rows: dict[int, list[StoredRow]] = {}
        self._sizes: dict[int, int] = {}

    def arrived(self, group: int, rows: Sequence[StoredRow], nbytes: int, was_empty: bool) -> None:
        """Rows were committed to `group`; `was_empty`: it had no waiting messages before."""
        cached = self._rows.get(group)
        if cached is None:
            if not was_empty or self.bytes + nbytes > self.max_bytes:
                return
            cached = self._rows[group] = []
            self._sizes[group] = 0
        elif self.bytes + nbytes > self.max_bytes:
            self.drop(group)
            return
        cached.extend(rows)
        self._sizes[group] += nbytes
        self.bytes += nbytes

    def take(self, group: int, skip: int, limit: int | None) -> list[tuple[Any, ...]] | None:
        """The waiting messages after the first `skip`, as receive rows; None if not cached."""
        cached = self._rows.get(group)
        if cached is None:
            return None
        end = len(cached) if limit is None else skip + limit
        return [(r[0], r[2], r[3], r[4], r[5], r[7], r[8]) for r in cached[skip:end]]

    def consumed(self, group: int, count: int) -> None:
        """The oldest `count` waiting messages of `group` were committed."""
        cached = self._rows.get(group)
        if cached is None:
            return
        if count >= len(cached):  # all of it (the usual case): its size is known
            self.drop(group)
            return
        gone = cached[:count]
        del cached[:count]
        size = ROW_OVERHEAD * len(gone)
        for r in gone:
            size += len(r[5])
        self._sizes[group] -= size
        self.bytes -= size
        if not cached:
            self.drop(group)

    def drop(self, group: int) -> None:
        if self._rows.pop(group, None) is not None:
            self.bytes -= self._sizes.pop(group)

    def __contains__(self, group: int) -> bool:
        return group in self._rows
