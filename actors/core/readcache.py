"""A write-through cache of waiting messages, so a receive that follows a send needs no SELECT.

Plain Python. A group is cached only while the cache holds *all* of its waiting messages, in
queue order: caching starts when a message arrives for a group with none waiting, and anything
that changes a group other than by appending or taking its oldest messages drops it (it is then
read from the store until it is empty again). The store stays the truth; a broker restart starts
with an empty cache.
"""

from __future__ import annotations

from typing import Any

# Runs are the store's (actors.store.segments): (first_id, group_no, endpoint_no, first_seq,
# type, bodies, status, sent_at, arrived_at), a send's messages on one endpoint.
Run = tuple[Any, ...]
ROW_OVERHEAD = 64  # bytes counted per message on top of its body


class ReadCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._runs: dict[int, list[Run]] = {}
        self._taken: dict[int, int] = {}  # messages of a group's first run already consumed
        self._sizes: dict[int, int] = {}
        self._counts: dict[int, int] = {}  # messages in a group's cached runs, consumed or not

    def arrived(self, group: int, run: Run, nbytes: int, was_empty: bool) -> None:
        """A run was committed to `group`; `was_empty`: it had no waiting messages before."""
        cached = self._runs.get(group)
        if cached is None:
            if not was_empty or self.bytes + nbytes > self.max_bytes:
                return
            cached = self._runs[group] = []
            self._taken[group] = 0
            self._sizes[group] = 0
            self._counts[group] = 0
        elif self.bytes + nbytes > self.max_bytes:
            self.drop(group)
            return
        if type(run[5]) is not tuple:  # a receive hands these bodies out: none may change them
            run = (*run[:5], tuple(run[5]), *run[6:])
        cached.append(run)
        self._counts[group] += len(run[5])
        self._sizes[group] += nbytes
        self.bytes += nbytes

    def take(self, group: int, skip: int, limit: int | None) -> list[tuple[Any, ...]] | None:
        """The waiting messages after the first `skip`, as received runs (first id,
        endpoint_no, first seq, type, bodies, sent_at, arrived_at; `actors.runs.Run`);
        None if not cached."""
        cached = self._runs.get(group)
        if cached is None:
            return None
        skip += self._taken[group]
        out: list[tuple[Any, ...]] = []
        left = limit
        for first_id, _, ep, seq, mt, bodies, _, sent, arrived in cached:
            n = len(bodies)
            if skip >= n:
                skip -= n
                continue
            end = n if left is None else min(n, skip + left)
            part = bodies if skip == 0 and end == n else bodies[skip:end]
            out.append(
                (first_id + skip, ep, seq + skip if seq >= 0 else -1, mt, part, sent, arrived)
            )
            if left is not None:
                left -= end - skip
                if left <= 0:
                    break
            skip = 0
        return out

    def waiting(self, group: int) -> int | None:
        """How many messages of `group` wait (received or not), if it is cached."""
        counted = self._counts.get(group)
        return None if counted is None else counted - self._taken[group]

    def consumed(self, group: int, count: int) -> None:
        """The oldest `count` waiting messages of `group` were committed."""
        cached = self._runs.get(group)
        if cached is None:
            return
        taken = self._taken[group]  # of the first run
        if count >= self._counts[group] - taken:  # all of it (the usual case)
            self.drop(group)
            return
        size = 0
        while count:
            bodies = cached[0][5]
            k = min(count, len(bodies) - taken)
            size += sum(map(len, bodies[taken : taken + k])) + ROW_OVERHEAD * k
            count -= k
            taken += k
            if taken == len(bodies):
                del cached[0]
                self._counts[group] -= taken
                taken = 0
        self._taken[group] = taken
        self._sizes[group] -= size
        self.bytes -= size

    def drop(self, group: int) -> None:
        if self._runs.pop(group, None) is not None:
            self.bytes -= self._sizes.pop(group)
            del self._taken[group], self._counts[group]

    def __contains__(self, group: int) -> bool:
        return group in self._runs
