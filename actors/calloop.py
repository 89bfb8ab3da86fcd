"""The process's call loop: an event loop on a daemon thread that other threads hand calls to.

A sync handle's calls run there, over the process's direct channel and coalesced with other
threads' calls (actors.coalesce). `asyncio.run_coroutine_threadsafe` costs each call a wake-up
of the loop (a write to its self-pipe: a system call, however many calls are already waiting)
and answers it through a `concurrent.futures.Future` (a condition variable: locks taken and a
waiter list walked per answer, and a second callback hop for cancellation). With 100 threads
calling, those were most of the calling process's CPU. Here a caller puts its coroutine in an
inbox that wakes the loop once per turn, however many threads add to it meanwhile, and waits on
a lock of its own that the loop releases with the answer.

Plain threading and asyncio, no Ray. A forked child makes its own loop on first use.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from typing import Any


class _Handoff:
    """One call handed to the loop: its coroutine, then its outcome."""

    __slots__ = ("coro", "done", "ok", "value", "task", "abandoned")

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.coro = coro
        self.done = threading.Lock()
        self.done.acquire()  # released by the loop once the outcome is in
        self.ok = False
        self.value: Any = None
        self.task: asyncio.Task | None = None
        self.abandoned = False  # its caller stopped waiting

    def finish(self, task: asyncio.Task) -> None:
        if task.cancelled():
            self.value = asyncio.CancelledError()
        else:
            error = task.exception()
            self.ok, self.value = error is None, task.result() if error is None else error
        self.done.release()

    def abandon(self) -> None:
        """On the loop: the caller left; stop the call if it is running, else never start it."""
        self.abandoned = True
        if self.task is not None:
            self.task.cancel()


class CallLoop:
    """An event loop on a daemon thread, and the way other threads run coroutines on it."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = _new_loop()
        self._inbox: list[_Handoff] = []
        self._inbox_lock = threading.Lock()
        self.drains = 0  # turns in which the loop took handed-off calls (for tests and tuning)
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="raybroker-calls", daemon=True
        )
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run `coro` on the loop and wait here for its result (or its error, raised here). A
        caller interrupted while it waits (KeyboardInterrupt) cancels the call."""
        handoff = _Handoff(coro)
        with self._inbox_lock:
            self._inbox.append(handoff)
            first = len(self._inbox) == 1
        if first:  # the loop drains every handoff queued until it runs: one wake-up for all
            self.loop.call_soon_threadsafe(self._drain)
        try:
            handoff.done.acquire()
        except BaseException:
            self.loop.call_soon_threadsafe(handoff.abandon)
            raise
        if handoff.ok:
            return handoff.value
        raise handoff.value

    def _drain(self) -> None:
        with self._inbox_lock:
            inbox, self._inbox = self._inbox, []
        self.drains += 1
        for handoff in inbox:
            if handoff.abandoned:
                handoff.coro.close()
                continue
            task = handoff.task = self.loop.create_task(handoff.coro)
            task.add_done_callback(handoff.finish)


def _new_loop() -> asyncio.AbstractEventLoop:
    # uvloop when it is there, as Ray runs actors' loops: measured with 100 + 100 threads on one
    # handle, 15-20% less of the call loop's CPU per message than asyncio's loop
    try:
        import uvloop
    except ImportError:  # (no wheels for Windows): asyncio's own
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


_current: CallLoop | None = None
_current_lock = threading.Lock()


def call_loop() -> CallLoop:
    """This process's call loop, started on first use."""
    current = _current
    if current is not None and current.pid == os.getpid():
        return current
    return _start()


def _start() -> CallLoop:
    global _current
    with _current_lock:
        if _current is None or _current.pid != os.getpid():
            _current = CallLoop()
        return _current


def on_call_loop_thread() -> bool:
    """Whether the calling thread is the call loop's own (which must not wait for the loop)."""
    current = _current
    return current is not None and threading.current_thread() is current.thread
