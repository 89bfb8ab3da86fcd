"""`LocalBroker`: a broker in this process, with the same verbs as the Ray `Broker`, and no Ray.

For testing handlers and driver code without a cluster, and for single-process use. It runs a
`BrokerService` (the same one the Ray actor runs) on an event loop in a background thread; calls
travel the same wire encoding. Activated queues run their readers as tasks on that loop, whatever
their placement. It has no peers: routes may only address itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from actors.calls.envelope import answered_locks
from actors.client.calloop import WAKE_S
from actors.client.verbs import Verbs
from actors.errors import InvalidArgument
from actors.model.limits import Limits
from actors.service.broker import BrokerService, check_name_and_path
from actors.service.metrics import MetricsSink


class LocalBroker(Verbs):
    """An in-process broker (`actors.client.verbs.BrokerHandle`). `path` is a SQLite file, or
    ":memory:"; `limits` are `actors.model.limits.Limits` fields. Use it as a context manager, or
    call `stop()`."""

    def __init__(
        self,
        name: str = "local",
        path: str = ":memory:",
        *,
        durability: str = "normal",
        metrics: MetricsSink | None = None,
        **limits: Any,
    ) -> None:
        check_name_and_path(name, path)
        # refused here, before a thread starts; the client checks calls against its size limit
        self.max_call_bytes = Limits.of(limits).max_call_bytes
        self.name = name
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name=f"raybroker-{name}", daemon=True
        )
        self._thread.start()
        # made before the start is scheduled, so a Ctrl-C anywhere below finds it (one landing
        # inside run_coroutine_threadsafe, after the start began, would leave no future to wait on)
        start: concurrent.futures.Future = concurrent.futures.Future()
        try:
            coro = _start(name, path, durability, limits, metrics)
            self.loop.call_soon_threadsafe(_run_into, start, coro)
            self.service: BrokerService = _result(start)
        except BaseException:
            self._close_started(start)
            raise
        self.aio = AsyncLocalBroker(self)

    def _close_started(self, start: concurrent.futures.Future) -> None:
        """The start failed, or its caller left it (Ctrl-C): the start runs on to its end on the
        broker's thread whatever the caller does, so wait for it and close what it opened (the
        store and its lock); otherwise the store would stay locked by this process."""
        service = None
        # the loop runs its callbacks in order: once this one has run, a start that was
        # scheduled is running (or done), and one that is not was never scheduled
        with contextlib.suppress(BaseException):
            asyncio.run_coroutine_threadsafe(asyncio.sleep(0), self.loop).result(30)
        if not (start.running() or start.done()):
            start = None  # type: ignore[assignment]
        while start is not None:
            try:
                service = start.result()
            except KeyboardInterrupt:  # another Ctrl-C: the store must still be closed
                continue
            except BaseException:  # the start itself failed: it opened nothing to close
                pass
            break
        if service is not None:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(service.close(), self.loop).result()
        self._halt()

    def _run(self, coro: Coroutine[Any, Any, Any], method: str = "", args: tuple = ()) -> Any:
        """Run `coro` on the broker's loop and wait for it here. A caller interrupted while it
        waits (Ctrl-C) leaves the call (`_Call.leave`); the broker's close runs to its end."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError(
                "a LocalBroker verb was called on the broker's own event loop; use `broker.aio`"
            )
        if not self._thread.is_alive():
            coro.close()
            raise InvalidArgument(f"local broker {self.name!r} is stopped")
        call = _Call(coro, method, args)
        future = asyncio.run_coroutine_threadsafe(call.run(), self.loop)
        try:
            return _result(future)
        except BaseException:
            # a verb is left; the broker's own start and close run to their end
            if method and not _failed(future):
                _leave(self.loop, call, self.service.core.give_back)
            raise

    def _call(self, method: str, *args: Any, post: Callable[[Any], Any] | None = None) -> Any:
        result = self._run(self.service.verb(method, *args), method, args)
        return post(result) if post else result

    def stop(self, delete_store: bool = False) -> None:
        """Stop the broker: its readers, its clock, its store (another broker may open it now).
        `delete_store=True` also removes the SQLite file and the -wal/-shm/.lock files beside
        it."""
        if not self._thread.is_alive():
            return
        path = self.service.path
        self._run(self.service.close())
        self._halt()
        if delete_store and path != ":memory:":
            lock = f"{os.path.realpath(path)}.lock"  # found before a symlinked path is removed
            for f in (path, f"{path}-wal", f"{path}-shm", lock):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(f)

    def _halt(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()

    def __enter__(self) -> LocalBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class AsyncLocalBroker(Verbs):
    """The same verbs as `LocalBroker`, as coroutines (for asyncio code)."""

    def __init__(self, sync: LocalBroker) -> None:
        self._sync = sync
        self.name = sync.name
        self.max_call_bytes = sync.max_call_bytes

    async def _call(self, method: str, *args: Any, post: Callable[[Any], Any] | None = None) -> Any:
        sync = self._sync
        coro = sync.service.verb(method, *args)
        if asyncio.get_running_loop() is sync.loop:  # already on the broker's loop
            result = await coro
        else:
            call = _Call(coro, method, args)
            future = asyncio.run_coroutine_threadsafe(call.run(), sync.loop)
            try:
                result = await asyncio.wrap_future(future)
            except BaseException:  # cancelled (a timeout around the call, say)
                if not _failed(future):
                    _leave(sync.loop, call, sync.service.core.give_back)
                raise
        return post(result) if post else result


class _Call:
    """A call run on the broker's loop for a caller on another thread or loop, who may leave
    before its answer (Ctrl-C, a cancelled coroutine). Then it is cancelled, and if it had
    taken groups for its caller already, they go back to the queue: otherwise they would stay
    locked until their lease ran out, and that rollback would count toward poison (as
    `BatchVerbs.undelivered` does for a remote caller)."""

    __slots__ = ("coro", "method", "args", "task", "left")

    def __init__(self, coro: Coroutine[Any, Any, Any], method: str, args: tuple) -> None:
        self.coro, self.method, self.args = coro, method, args
        self.task: asyncio.Task | None = None
        self.left = False

    async def run(self) -> Any:
        if self.left:  # its caller left before it started
            self.coro.close()
            return None
        self.task = asyncio.current_task()
        return await self.coro

    def leave(self, give_back: Callable[[list[str]], None]) -> None:
        """On the broker's loop: the caller has stopped waiting."""
        self.left = True
        task = self.task
        if task is not None:
            task.cancel()  # (a finished call stays finished: what it took is given back below)
            task.add_done_callback(lambda done: self._give_back(done, give_back))

    def _give_back(self, task: asyncio.Task, give_back: Callable[[list[str]], None]) -> None:
        ids = answered_locks(self.method, self.args, task)
        if ids:
            give_back(ids)


def _leave(
    loop: asyncio.AbstractEventLoop, call: _Call, give_back: Callable[[list[str]], None]
) -> None:
    with contextlib.suppress(RuntimeError):  # the loop has closed (stopped meanwhile): gone too
        loop.call_soon_threadsafe(call.leave, give_back)


def _run_into(future: concurrent.futures.Future, coro: Coroutine[Any, Any, Any]) -> None:
    """On the broker's loop: run `coro` as a task whose outcome is `future`'s."""
    if not future.set_running_or_notify_cancel():
        coro.close()
        return
    task = asyncio.ensure_future(coro)

    def done(t: asyncio.Task) -> None:
        if t.cancelled():
            future.set_exception(concurrent.futures.CancelledError())
        elif t.exception() is not None:
            future.set_exception(t.exception())  # type: ignore[arg-type]
        else:
            future.set_result(t.result())

    task.add_done_callback(done)


def _result(future: concurrent.futures.Future) -> Any:
    """Wait for `future` in slices, so that a Ctrl-C landing on another thread is seen."""
    while not future.done():
        concurrent.futures.wait((future,), timeout=WAKE_S)
    return future.result()


def _failed(future: concurrent.futures.Future) -> bool:
    """Whether the call itself raised (as opposed to its caller leaving it)."""
    return future.done() and not future.cancelled() and future.exception() is not None


async def _start(
    name: str, path: str, durability: str, limits: dict[str, Any], metrics: MetricsSink | None
) -> BrokerService:
    return BrokerService(name, path, durability, limits, metrics=metrics)
