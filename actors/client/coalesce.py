"""Coalescing: one process's concurrent calls to a broker travel together.

An actor call costs about a millisecond of the broker's CPU on these machines, whatever it
carries; a small verb costs a few tens of microseconds. A process with many concurrent callers
of one handle (100 coroutines, each a business transaction of one message) would spend nearly
all of the broker on calls. So the async handle sends its callers' apply / settle / receive
calls as batches: a call joins the batch being gathered; a batch goes when fewer than
`max_inflight` batches are on the way, so under light load a call goes at once, and under heavy
load batches grow by themselves (no timer, no added latency) up to `max_batch` calls, beyond
which several go together. The broker answers each call of a batch on its own and group-commits
their changes (actors.service.group_commit). Calls keep the order the callers made them in: a batch
is one numbered call of the handle (actors.calls.ordering), its calls start in the order given.

A receive that waits cannot sit in a batch without holding the batch's other answers, so in a
batch it takes only what is there; if it gets nothing (and settles nothing: a settle's answer is
never held behind a wait), it waits in a `wait_take` call: the receives of a handle that begin
waiting on a queue in the same turn of its event loop share one, which carries what each of
them would take. The broker takes for them there and then, in order, as soon as there is
something to take, so a waiting receive gets its messages in the round trip that brought the
news. One that got nothing (others took what came) waits on in the next call. A receive that
settles nothing, made while none of the handle's calls are gathered or on their way, has no
batch to share: it goes to `wait_take` at once (one call, not two, for a reader between
messages), which takes what is there first, as the batch would have. A receive whose
caller left before its taken messages came back hands them back (`abandon`: the broker returns
them to the queue without counting a rollback toward poison; nobody tried to process them),
but for a receive under a lock its caller already holds: what that reads stays under the lock.

A receive's arguments name its lock holder: (holder id, a handle the broker watches it by). In a
batch (or a shared wait) the handle goes once per holder; later receives of the same holder carry
its id alone, which the broker reads as the holder introduced earlier in the same call (a Ray
object reference in every one of 100 receives cost both processes a few tenths of a
millisecond per call).

Plain Python on the caller's event loop, no Ray: the Ray handle supplies `send` and `wait`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import operator
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from actors.calls.envelope import held_lock

Call = tuple[str, tuple[Any, ...]]
Outcome = tuple[bool, Any]  # (True, result) or (False, the error)
SendBatch = Callable[[list[Call]], Awaitable[list[Outcome]]]
# wait_take(queue, timeout, takes): an outcome per take; a take is a waiting receive's arguments
# (as the broker's receive takes them), its wait what is left of it
WaitTake = Callable[[str, float, list[tuple[Any, ...]]], Awaitable[list[Outcome]]]
Abandon = Callable[[Any], Awaitable[Any]]  # give back what was taken for a caller who left

log = logging.getLogger("raybroker")

MAX_INFLIGHT = 3  # batches on the way: one being applied, one waiting at the broker, one more
# Calls per batch. Many more callers than this go as several batches on the way together, so
# the broker applies one while another's answers travel back and its callers make their next
# calls (100 producers and 100 consumers of one message each: ~1.35x the messages/s of one
# batch of 200). Fewer per batch and a Ray call's own cost (~1 ms) starts to show.
MAX_BATCH = 100
MAX_BATCH_BYTES = 8 << 20  # body bytes per batch (each call is already within the call limit)
WATCH_MAX_S = 1.0  # one wait_take call waits at most this long (then its waiters go again)


class _Queued:
    __slots__ = ("call", "size", "future", "empty")

    def __init__(
        self, call: Call, size: int, future: asyncio.Future, empty: Callable[[Any], bool] | None
    ) -> None:
        self.call, self.size, self.future = call, size, future
        self.empty = empty  # a receive's: whether its answer took nothing (else None)


class Coalescer:
    """Batches one handle's concurrent calls on one event loop."""

    def __init__(
        self,
        send: SendBatch,
        wait: WaitTake,
        abandon: Abandon,
        max_inflight: int = MAX_INFLIGHT,
        max_batch: int = MAX_BATCH,
    ) -> None:
        self.send, self.wait, self.abandon = send, wait, abandon
        self.max_inflight, self.max_batch = max_inflight, max_batch
        self._queue: deque[_Queued] = deque()
        self._inflight = 0
        self._scheduled = False
        self._watches: dict[str, _Watch] = {}
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop it serves, once called
        self.batches = 0  # batches sent (for tests and tuning)

    async def call(
        self, method: str, args: tuple[Any, ...], empty: Callable[[Any], bool] | None = None
    ) -> Any:
        """Send `method(*args)` with whatever else is being called; its own result or error.
        `empty` (a receive's): what a receive whose caller left after it went took is given
        back."""
        loop = self._loop
        if loop is None:  # (asking each time costs Python 3.11 a getpid system call)
            loop = self._loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queue.append(_Queued((method, args), _size(args), future, empty))
        self._schedule(loop)
        return await future  # cancelled before it went: dropped from its batch (see _take)

    async def receive(self, args: tuple[Any, ...], wait: float, nothing: Any) -> Any:
        """A receive: `args` as the broker's receive takes them (queue, wait, options, owner,
        settle, reader); waits up to `wait` seconds for messages, as the verb does. `nothing`:
        the answer of a receive that took nothing."""
        deadline = time.monotonic() + wait
        empty = functools.partial(operator.eq, nothing)
        # what a receive under its caller's own lock returns stays under that lock, the
        # caller's: never given back, even if the caller leaves
        keep = held_lock(args) is not None
        if wait > 0 and args[4] is None and not keep and self.idle():
            # nothing to share a batch with, nothing to settle: a batch of this receive alone
            # would only take what is there, and `wait_take` does that first too (one call, not
            # two, for a reader that waits on a quiet queue between messages)
            got = await self._watch(args[0]).wait(wait, args, empty)
            return nothing if got is None else got
        result = await self.call("receive", args, None if keep else empty)
        if not empty(result) or args[4] is not None:
            return result  # got something, or settled something: answer now
        left = deadline - time.monotonic()
        if left <= 0:
            return result
        got = await self._watch(args[0]).wait(left, args, empty, keep)
        return result if got is None else got

    def idle(self) -> bool:
        """Whether none of this handle's calls are gathered or on their way (a call made now
        goes alone, ordered after every call before it)."""
        return not self._queue and not self._inflight

    def give_back(self, taken: Any) -> None:
        """Hand back (`abandon`) what the broker took for a receive whose caller left."""
        asyncio.ensure_future(self._abandon(taken))

    async def _abandon(self, taken: Any) -> None:
        try:
            await self.abandon(taken)
        except Exception:  # its locks' lease runs out instead
            log.debug("giving back what a departed receive took failed", exc_info=True)

    def _watch(self, queue: str) -> _Watch:
        watch = self._watches.get(queue)
        if watch is None:
            watch = self._watches[queue] = _Watch(self, queue)
        return watch

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        # on the loop's next turn, so every caller ready in this one joins the batch
        if not self._scheduled and self._inflight < self.max_inflight and self._queue:
            self._scheduled = True
            loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        while self._inflight < self.max_inflight:
            batch = self._take()
            if not batch:
                return
            self._inflight += 1
            self.batches += 1
            asyncio.ensure_future(self._send(batch))

    def _take(self) -> list[_Queued]:
        batch: list[_Queued] = []
        size = 0
        while self._queue and len(batch) < self.max_batch:
            q = self._queue[0]
            if batch and size + q.size > MAX_BATCH_BYTES:
                break
            self._queue.popleft()
            if q.future.cancelled():
                continue  # its caller gave up before it went: it never happens
            batch.append(q)
            size += q.size
        return batch

    async def _send(self, batch: list[_Queued]) -> None:
        try:
            outcomes = await self.send(holders_once([q.call for q in batch]))
        except BaseException as exc:  # the whole batch failed (the broker is gone, say)
            for q in batch:
                if not q.future.done():
                    q.future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            for q, (ok, value) in zip(batch, outcomes, strict=True):
                if q.future.done():  # its caller left after it went
                    if ok and q.empty is not None and not q.empty(value):
                        self.give_back(value)
                    continue
                if ok:
                    q.future.set_result(value)
                else:
                    q.future.set_exception(value)
        finally:
            self._inflight -= 1
            self._schedule(asyncio.get_running_loop())


class _Waiter:
    __slots__ = ("deadline", "future", "args", "empty", "keep")

    def __init__(
        self,
        deadline: float,
        future: asyncio.Future,
        args: tuple[Any, ...],
        empty: Any,
        keep: bool = False,
    ) -> None:
        self.deadline, self.future, self.args, self.empty = deadline, future, args, empty
        self.keep = keep  # what it takes is never given back (see `Coalescer.receive`)


class _Watch:
    """The handle's waiting receives on one queue: each is in one `wait_take` call at a time,
    and those that begin waiting in the same turn share one."""

    def __init__(self, owner: Coalescer, queue: str) -> None:
        self.owner, self.queue = owner, queue
        self.unsent: list[_Waiter] = []
        self.waiting = 0  # receives waiting now

    async def wait(
        self,
        timeout: float,
        args: tuple[Any, ...],
        empty: Callable[[Any], bool],
        keep: bool = False,
    ) -> Any:
        """What the broker took for this receive, or None if `timeout` ran out first."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._send_soon(_Waiter(time.monotonic() + timeout, future, args, empty, keep), loop)
        self.waiting += 1
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            pass
        except asyncio.CancelledError:
            if not keep and future.done() and not future.cancelled() and future.exception() is None:
                self.owner.give_back(future.result())  # taken for it; its caller left first
            raise
        finally:
            self.waiting -= 1
            if not future.done():
                future.cancel()  # its caller left: what is taken for it is given back
        # answered as its time ran out, or before: what came is its answer
        return future.result() if future.done() and not future.cancelled() else None

    def _send_soon(self, waiter: _Waiter, loop: asyncio.AbstractEventLoop) -> None:
        if not self.unsent:  # on the loop's next turn, with every waiter that comes in this one
            loop.call_soon(self._send)
        self.unsent.append(waiter)

    def _send(self) -> None:
        waiters = [w for w in self.unsent if not w.future.done()]
        self.unsent = []
        if waiters:
            asyncio.ensure_future(self._call(waiters))

    async def _call(self, waiters: list[_Waiter]) -> None:
        now = time.monotonic()
        timeout = max(0.0, min(WATCH_MAX_S, max(w.deadline for w in waiters) - now))
        takes = [(w.args[0], max(0.0, w.deadline - now), *w.args[2:]) for w in waiters]
        takes = [args for _, args in holders_once([("receive", t) for t in takes])]
        try:
            outcomes = await self.owner.wait(self.queue, timeout, takes)
        except Exception as exc:  # the call failed as a whole (the broker is gone, say)
            for w in waiters:
                if not w.future.done():
                    w.future.set_exception(exc)
            return
        loop = asyncio.get_running_loop()
        for w, (ok, value) in zip(waiters, outcomes, strict=True):
            if w.future.done():
                if ok and not w.keep and not w.empty(value):
                    self.owner.give_back(value)
            elif not ok:
                w.future.set_exception(value)
            elif not w.empty(value):
                w.future.set_result(value)
            elif w.deadline > time.monotonic():
                self._send_soon(w, loop)  # others took what came: it waits on
            # else its time is up: its own timeout answers it


HOLDER = 3  # where a receive's arguments (and a take) name the lock holder


def holders_once(calls: list[Call]) -> list[Call]:
    """`calls` with each lock holder's handle given once: a receive whose holder an earlier
    receive of the list named carries the holder's id alone."""
    named: set[str] = set()
    out: list[Call] = []
    for method, args in calls:
        holder = args[HOLDER] if method == "receive" else None
        if type(holder) is tuple:
            if holder[0] in named:
                args = (*args[:HOLDER], holder[0], *args[HOLDER + 1 :])
            else:
                named.add(holder[0])
        out.append((method, args))
    return out


def _size(args: tuple[Any, ...]) -> int:
    size = 0
    for a in args:
        if isinstance(a, (bytes, bytearray)):
            size += len(a)
    return size
