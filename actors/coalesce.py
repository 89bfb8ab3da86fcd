"""Coalescing: one process's concurrent calls to a broker travel together.

An actor call costs about a millisecond of the broker's CPU on these machines, whatever it
carries; a small verb costs a few tens of microseconds. A process with many concurrent callers
of one handle (100 coroutines, each a business transaction of one message) would spend nearly
all of the broker on calls. So the async handle sends its callers' apply / settle / receive
calls as batches: a call joins the batch being gathered; a batch goes when fewer than
`max_inflight` batches are on the way, so under light load a call goes at once, and under heavy
load batches grow by themselves (no timer, no added latency). The broker answers each call of a
batch on its own and group-commits their changes (actors.groupcommit). Calls keep the order the
callers made them in: a batch is one numbered call of the handle (actors.ordering), its calls
start in the order given.

A receive that waits cannot sit in a batch without holding the batch's other answers, so in a
batch it takes only what is there; if it gets nothing (and settles nothing: a settle's answer is
never held behind a wait), it waits through a watch: one `wait_ready` call per queue at a time
for all of the handle's waiting receives, which then try again, as many as the broker says
groups are ready.

Plain Python on the caller's event loop, no Ray: the Ray handle supplies `send` and `wait`.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

Call = tuple[str, tuple[Any, ...]]
SendBatch = Callable[[list[Call]], Awaitable[list[tuple[bool, Any]]]]
WaitReady = Callable[[str, float], Awaitable[int]]

MAX_INFLIGHT = 3  # batches on the way: one being applied, one waiting at the broker, one more
MAX_BATCH = 512  # calls per batch
MAX_BATCH_BYTES = 8 << 20  # body bytes per batch (each call is already within the call limit)
WATCH_MAX_S = 1.0  # one wait_ready call waits at most this long (waiters come and go)


class _Queued:
    __slots__ = ("call", "size", "future")

    def __init__(self, call: Call, size: int, future: asyncio.Future) -> None:
        self.call, self.size, self.future = call, size, future


class Coalescer:
    """Batches one handle's concurrent calls on one event loop."""

    def __init__(
        self,
        send: SendBatch,
        wait: WaitReady,
        max_inflight: int = MAX_INFLIGHT,
        max_batch: int = MAX_BATCH,
    ) -> None:
        self.send, self.wait = send, wait
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
            if await watch.until_ready(left):
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


class _Watch:
    """The handle's waiting receives on one queue, and the one `wait_ready` call for them."""

    def __init__(self, owner: Coalescer, queue: str) -> None:
        self.owner, self.queue = owner, queue
        self.waiters: deque[tuple[float, asyncio.Future[bool]]] = deque()
        self.task: asyncio.Task | None = None
        self.trying = 0  # woken waiters still trying to receive
        self.all_tried = asyncio.Event()

    async def until_ready(self, timeout: float) -> bool:
        """True once the broker says a group is ready (try to receive), False on timeout."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        self.waiters.append((time.monotonic() + timeout, future))
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._run())
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.result():
                self.tried()  # woken, but its caller left before trying
            raise
        finally:
            if not future.done():
                future.cancel()  # its waiter left: the watch skips it

    def tried(self) -> None:
        """A woken waiter has tried to receive."""
        self.trying -= 1
        if self.trying <= 0:
            self.all_tried.set()

    async def _run(self) -> None:
        while True:
            now = time.monotonic()
            live = [(d, f) for d, f in self.waiters if not f.done()]
            for d, f in live:
                if d <= now:
                    f.set_result(False)
            self.waiters = deque((d, f) for d, f in live if d > now)
            if not self.waiters:
                return
            timeout = min(WATCH_MAX_S, max(d for d, _ in self.waiters) - now)
            try:
                ready = await self.owner.wait(self.queue, timeout)
            except Exception as exc:  # the waiters hear it through their own next call
                for _, f in self.waiters:
                    if not f.done():
                        f.set_exception(exc)
                self.waiters.clear()
                return
            self.all_tried.clear()
            while ready > 0 and self.waiters:
                _, f = self.waiters.popleft()
                if not f.done():
                    f.set_result(True)
                    self.trying += 1
                    ready -= 1
            if self.trying > 0:
                # the woken try before the broker is asked again, or the same ready groups
                # would wake more waiters than there are groups
                await self.all_tried.wait()


def _size(args: tuple[Any, ...]) -> int:
    return sum(len(a) for a in args if isinstance(a, bytes | bytearray))
