"""Group commit: concurrent callers' changes in one store transaction, each answered on its own.

Every changing verb (apply, settle, a receive's settle part) is queued here instead of committing
alone. The queue is flushed on the event loop's next turn, so whatever arrived meanwhile (calls
from many clients, the verbs of one client's coalesced batch) shares one SQLite transaction:
one commit's cost (a WAL write, an fsync under durability "full") spread over all of them. Each
caller's change runs on a savepoint of its own (`UnitOfWork.group`): one that fails is undone
alone and its caller gets its own error; the others commit. If the commit itself fails, nothing
of the group was applied and every caller in it gets that error.

A change may have a `take` that runs after the commit (a receive's take, after its settle part):
a take reads and locks in memory and writes nothing, so it never waits for or spoils a commit.
Plain Python on the broker's event loop, no Ray; the flush is synchronous, so nothing else
touches the store while a group is open.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import Callable
from typing import Any

from actors.core.work import UnitOfWork
from actors.errors import BrokerError

Change = Callable[[], Any]


class _Waiting:
    __slots__ = ("change", "take", "tag", "request_id", "shares", "future")

    def __init__(
        self,
        change: Change | None,
        take: Change | None,
        tag: str | None,
        request_id: str | None,
        shares: bool,
        future: asyncio.Future,
    ) -> None:
        self.change, self.take, self.tag, self.future = change, take, tag, future
        self.request_id, self.shares = request_id, shares


class GroupCommit:
    """Queues changes and commits them together; `after_commit` runs once per committed group."""

    def __init__(self, uow: UnitOfWork, after_commit: Callable[[], None]) -> None:
        self.uow = uow
        self.after_commit = after_commit
        self._queued: list[_Waiting] = []
        self._loop: asyncio.AbstractEventLoop | None = None  # the one the next flush runs on
        self.groups = 0  # groups committed (for tests and the metrics)
        self.changes = 0  # changes committed in them

    async def submit(
        self, change: Change | None, take: Change | None = None, tag: str | None = None
    ) -> Any:
        """Run `change` in the next group commit (then `take`, if the change succeeded) and
        return the take's result, or else the change's; raise the caller's own error."""
        return await self.enqueue(change, take, tag)

    def enqueue(
        self,
        change: Change | None,
        take: Change | None = None,
        tag: str | None = None,
        request_id: str | None = None,
        shares: bool = False,
    ) -> asyncio.Future:
        """`submit` without a coroutine: the answer's future. `tag`: set as the error's
        `during` when the change (not the take) fails. `request_id`: the change's, so the
        group looks up every retry at once (see `UnitOfWork.group`). `shares`: the change may
        share one unit with its neighbours that may too (`UnitOfWork.shared`): all its
        effects go through one `UnitOfWork.run`."""
        if self._queued:  # a flush is due on the loop that queued the first of them
            loop = self._loop
        else:  # (asking for the running loop costs Python 3.11 a getpid system call)
            loop = self._loop = asyncio.get_running_loop()
            loop.call_soon(self._flush)
        future = loop.create_future()
        self._queued.append(_Waiting(change, take, tag, request_id, shares, future))
        return future

    def _flush(self) -> None:
        batch, self._queued = self._queued, []
        outcomes = self._commit(
            [w.change for w in batch], [w.request_id for w in batch], [w.shares for w in batch]
        )
        for w, (ok, value) in zip(batch, outcomes, strict=True):
            if w.future.cancelled():
                # the caller stopped waiting: what committed stays committed, and nothing is
                # taken for it (its take would hold groups nobody reads until their lease ends)
                continue
            if ok and w.take is not None:
                ok, value = _attempt(w.take)
            elif not ok and w.tag is not None:
                with contextlib.suppress(Exception):  # a failed commit's error is everyone's
                    value = copy.copy(value)
                value.during = w.tag  # the caller learns which half of its call failed
            if ok:
                w.future.set_result(value)
            else:
                w.future.set_exception(value)

    def _commit(
        self, changes: list[Change | None], request_ids: list[str | None], shares: list[bool]
    ) -> list[tuple[bool, Any]]:
        outcomes: list[tuple[bool, Any]] = [(True, None)] * len(changes)
        if not any(c is not None for c in changes):
            return outcomes
        ran = [False] * len(changes)
        try:
            with self.uow.group(request_ids):
                for run in _runs(changes, shares):
                    results = self.uow.shared([changes[i] for i in run]) if len(run) > 1 else None
                    if results is not None:  # all of them went, as one unit
                        for i, result in zip(run, results, strict=True):
                            outcomes[i], ran[i] = (True, result), True
                        continue
                    for i in run:  # each on its own: one that fails is undone alone
                        ok, value = outcomes[i] = _attempt(changes[i])
                        ran[i] = ok
                        if not ok and self.uow.tx_lost:  # a fault ended the transaction
                            raise value
        except Exception as exc:  # the commit failed: none of the group was applied
            for i in range(len(changes)):
                if ran[i] or (changes[i] is not None and outcomes[i][0]):
                    outcomes[i] = (False, exc)
            return outcomes
        self.groups += 1
        self.changes += sum(ran)
        self.after_commit()
        return outcomes


def _runs(changes: list[Change | None], shares: list[bool]) -> list[list[int]]:
    """The changes' positions, in order, as runs: a run of neighbours that may share a unit,
    or one change alone."""
    runs: list[list[int]] = []
    sharing = False  # whether the last run is one that shares
    for i, change in enumerate(changes):
        if change is None:
            continue
        if shares[i] and sharing:
            runs[-1].append(i)
        else:
            runs.append([i])
            sharing = shares[i]
    return runs


def _attempt(fn: Change) -> tuple[bool, Any]:
    try:
        return True, fn()
    except BrokerError as exc:
        return False, exc
    except Exception as exc:  # a bug: its caller sees it, the group's other callers go on
        return False, exc
