"""Coalescing: one process's concurrent calls to a broker travel together.

An actor call costs about a millisecond of the broker's CPU on these machines, whatever it
carries; a small verb costs a few tens of microseconds. A process with many concurrent callers
of one handle (100 coroutines, each a business transaction of one message) would spend nearly
all of the broker on calls. So the async handle sends its callers' apply / settle / receive
calls as batches: a call joins the batch being gathered; a batch goes when fewer than
`max_inflight` batches are on the way, so under light load a call goes at once, and under heavy
load batches grow by themselves (no timer, no added latency) up to `max_batch` calls, beyond
which several go together. The broker answers each call of a batch on its own and group-commits
their changes (actors.groupcommit). Calls keep the order the callers made them in: a batch is
one numbered call of the handle (actors.ordering), its calls start in the order given.

A receive that waits cannot sit in a batch without holding the batch's other answers, so in a
batch it takes only what is there; if it gets nothing (and settles nothing: a settle's answer is
never held behind a wait), it waits through a watch: one `wait_take` call per queue at a time
for all of the handle's waiting receives. It carries what each of them would take; once a group
is ready the broker takes for them there and then, in order, so a waiting receive gets its
messages in the round trip that brought the news. Receives that began waiting after that call
went, and any the broker's take missed (a receive for one conversation, say), are woken to try
again, as many as the broker says groups are still ready. A receive whose caller left before
its taken messages came back hands them back (`abandon` rolls them back at once).

Plain Python on the caller's event loop, no Ray: the Ray handle supplies `send` and `wait`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

Call = tuple[str, tuple[Any, ...]]
Outcome = tuple[bool, Any]  # (True, result) or (False, the error)
SendBatch = Callable[[list[Call]], Awaitable[list[Outcome]]]
# wait_take(queue, timeout, takes): the groups still ready, and an outcome per take; a take is a
# waiting receive's arguments (as the broker's receive takes them), its wait what is left of it
WaitTake = Callable[[str, float, list[tuple[Any, ...]]], Awaitable[tuple[int, list[Outcome]]]]
Abandon = Callable[[Any], Awaitable[Any]]  # give back what was taken for a caller who left

log = logging.getLogger("raybroker")

MAX_INFLIGHT = 3  # batches on the way: one being applied, one waiting at the broker, one more
# Calls per batch. Many more callers than this go as several batches on the way together, so
# the broker applies one while another's answers travel back and its callers make their next
# calls (100 producers and 100 consumers of one message each: ~1.35x the messages/s of one
# batch of 200). Fewer per batch and a Ray call's own cost (~1 ms) starts to show.
MAX_BATCH = 100
MAX_BATCH_BYTES = 8 << 20  # body bytes per batch (each call is already within the call limit)
WATCH_MAX_S = 1.0  # one wait_take call waits at most this long (waiters come and go)
_TRY = object()  # a waiter's wake-up: groups are ready, try to receive


class _Queued:
    __slots__ = ("call", "size", "future")

    def __init__(self, call: Call, size: int, future: asyncio.Future) -> None:
        self.call, self.size, self.future = call, size, future


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
        self.batches = 0  # batches sent (for tests and tuning)

    async def call(self, method: str, args: tuple[Any, ...]) -> Any:
        """Send `method(*args)` with whatever else is being called; its own result or error."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queue.append(_Queued((method, args), _size(args), future))
        self._schedule(loop)
        return await future  # cancelled before it went: dropped from its batch (see _take)

    async def receive(
        self, args: tuple[Any, ...], wait: float, empty: Callable[[Any], bool]
    ) -> Any:
        """A receive: `args` as the broker's receive takes them (queue, wait, options, owner,
        settle, reader); waits up to `wait` seconds for messages, as the verb does."""
        deadline = time.monotonic() + wait
        result = await self.call("receive", args)
        if not empty(result) or args[4] is not None:
            return result  # got something, or settled something: answer now
        take = (args[0], 0.0, *args[2:])
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return result
            watch = self._watch(args[0])
            got = await watch.until_ready(left, take, empty)
            if got is None:
                continue  # its time is up (the loop's check returns)
            if got is not _TRY:
                return got  # the broker took for it as groups became ready
            try:
                result = await self.call("receive", take)
            finally:
                watch.tried()
            if not empty(result):
                return result

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
            outcomes = await self.send([q.call for q in batch])
        except BaseException as exc:  # the whole batch failed (the broker is gone, say)
            for q in batch:
                if not q.future.done():
                    q.future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            for q, (ok, value) in zip(batch, outcomes, strict=True):
                if q.future.done():
                    continue
                if ok:
                    q.future.set_result(value)
                else:
                    q.future.set_exception(value)
        finally:
            self._inflight -= 1
            self._schedule(asyncio.get_running_loop())


class _Waiter:
    __slots__ = ("deadline", "future", "take", "empty")

    def __init__(
        self, deadline: float, future: asyncio.Future, take: tuple[Any, ...], empty: Any
    ) -> None:
        self.deadline, self.future, self.take, self.empty = deadline, future, take, empty


class _Watch:
    """The handle's waiting receives on one queue, and the one `wait_take` call for them."""

    def __init__(self, owner: Coalescer, queue: str) -> None:
        self.owner, self.queue = owner, queue
        self.waiters: deque[_Waiter] = deque()
        self.task: asyncio.Task | None = None
        self.trying = 0  # woken waiters still trying to receive
        self.all_tried = asyncio.Event()

    async def until_ready(
        self, timeout: float, take: tuple[Any, ...], empty: Callable[[Any], bool]
    ) -> Any:
        """What the broker took for this receive; `_TRY` once groups are ready that it should
        try to receive itself; None when `timeout` ran out first."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self.waiters.append(_Waiter(time.monotonic() + timeout, future, take, empty))
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._run())
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            pass
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                self._left(future.result())  # answered, but its caller left first
            raise
        finally:
            if not future.done():
                future.cancel()  # its waiter left: the watch skips it, gives back its take
        # answered as its time ran out, or before: what came is its answer
        return future.result() if future.done() and not future.cancelled() else None

    def _left(self, answer: Any) -> None:
        if answer is _TRY:
            self.tried()  # woken, but it will not try
        else:
            asyncio.ensure_future(self._abandon(answer))

    def tried(self) -> None:
        """A woken waiter has tried to receive."""
        self.trying -= 1
        if self.trying <= 0:
            self.all_tried.set()

    async def _run(self) -> None:
        while True:
            now = time.monotonic()
            self.waiters = deque(w for w in self.waiters if not w.future.done())
            if not self.waiters:
                return
            sent = list(self.waiters)
            timeout = min(WATCH_MAX_S, max(w.deadline for w in sent) - now)
            takes = [(w.take[0], w.deadline - now, *w.take[2:]) for w in sent]
            try:
                ready, outcomes = await self.owner.wait(self.queue, timeout, takes)
            except Exception as exc:  # the waiters hear it through their own next call
                for w in self.waiters:
                    if not w.future.done():
                        w.future.set_exception(exc)
                self.waiters.clear()
                return
            for w, (ok, value) in zip(sent, outcomes, strict=True):
                if ok and w.empty(value):
                    continue  # nothing for it: it waits on
                if w.future.done():  # its caller left: give back what was taken for it
                    if ok:
                        self._left(value)
                elif ok:
                    w.future.set_result(value)
                else:
                    w.future.set_exception(value)
            self.all_tried.clear()
            while ready > 0 and self.waiters:
                w = self.waiters.popleft()
                if not w.future.done():
                    w.future.set_result(_TRY)
                    self.trying += 1
                    ready -= 1
            if self.trying > 0:
                # the woken try before the broker is asked again, or the same ready groups
                # would wake more waiters than there are groups
                await self.all_tried.wait()

    async def _abandon(self, taken: Any) -> None:
        try:
            await self.owner.abandon(taken)
        except Exception:  # its locks' lease runs out instead
            log.debug("giving back what a departed receive took failed", exc_info=True)


def _size(args: tuple[Any, ...]) -> int:
    return sum(len(a) for a in args if isinstance(a, bytes | bytearray))
