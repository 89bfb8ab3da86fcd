"""The process's call loop: an event loop on a daemon thread that other threads hand calls to.

A sync handle's calls run there, over the process's direct channel and coalesced with other
threads' calls (actors.client.coalesce). `asyncio.run_coroutine_threadsafe` costs each call a
wake-up of the loop (on asyncio's own loop a write to its self-pipe, a system call, however many
calls are already waiting) and answers it through a `concurrent.futures.Future` (a condition
variable: locks taken and a waiter list walked per answer, and a second callback hop). With 100
threads calling, those were most of the calling process's CPU. Here a caller puts its coroutine
in an inbox that wakes the loop once per turn, however many threads add to it meanwhile, and
waits on a lock of its own that the loop releases with the answer. Each call runs in its
caller's context (contextvars), as with `run_coroutine_threadsafe`.

Plain threading and asyncio, no Ray. A forked child makes its own loop on first use.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import os
import threading
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger("raybroker")

# A caller waits on a lock in slices this long: a signal (Ctrl-C) that lands on another of the
# process's threads does not wake a lock wait, and Python runs its handler in the main thread
# only when that thread next runs, so a wait without a timeout would never see it.
WAKE_S = 0.1


class _Handoff:
    """One call handed to the loop: its coroutine and its caller's context, then its outcome."""

    __slots__ = ("coro", "context", "done", "ok", "value", "task", "abandoned")

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.coro = coro
        self.context = contextvars.copy_context()
        self.done = threading.Lock()
        self.done.acquire()  # released by the loop once the outcome is in
        self.ok = False
        self.value: Any = None
        self.task: asyncio.Task | None = None
        self.abandoned = False  # its caller stopped waiting

    def finish(self, task: asyncio.Task) -> None:
        if task.cancelled():  # an Exception, as `run_coroutine_threadsafe`'s callers got
            self.value = concurrent.futures.CancelledError()
        else:
            error = task.exception()
            self.ok, self.value = error is None, task.result() if error is None else error
        self.done.release()

    def fail(self, error: BaseException) -> None:
        self.value = error
        self.done.release()

    def abandon(self) -> None:
        """On the loop: the caller left; stop the call if it is running, else never start it."""
        self.abandoned = True
        if self.task is not None:
            self.task.cancel()
        else:
            self.coro.close()


class CallLoop:
    """An event loop on a daemon thread, and the way other threads run coroutines on it."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = _new_loop()
        self._inbox: list[_Handoff] = []
        self._inbox_lock = threading.Lock()
        self.drains = 0  # turns in which the loop took handed-off calls (for tests and tuning)
        self.thread = threading.Thread(target=self._serve, name="raybroker-calls", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run `coro` on the loop and wait here for its result (or its error, raised here). A
        caller interrupted while it waits (KeyboardInterrupt) cancels the call."""
        handoff = _Handoff(coro)
        try:
            with self._inbox_lock:
                self._inbox.append(handoff)
                first = len(self._inbox) == 1
            if first:  # the loop drains every handoff queued until it runs: one wake-up for all
                self.loop.call_soon_threadsafe(self._drain)
            while not handoff.done.acquire(timeout=WAKE_S):
                pass
        except BaseException:
            # interrupted, perhaps before its wake-up was scheduled: the loop drains anyway,
            # so the calls queued behind this one are not left waiting
            self.loop.call_soon_threadsafe(self._abandon, handoff)
            raise
        ok, value = handoff.ok, handoff.value
        del handoff  # an error raised below must not keep this frame alive through it
        if ok:
            return value
        try:
            raise value
        finally:
            value = None

    def _drain(self) -> None:
        with self._inbox_lock:
            inbox, self._inbox = self._inbox, []
        self.drains += 1
        for handoff in inbox:
            if handoff.abandoned:
                continue
            try:
                task = self.loop.create_task(handoff.coro, context=handoff.context)
            except BaseException as exc:  # not a coroutine: its caller's error, not the others'
                handoff.fail(exc)
                continue
            handoff.task = task
            task.add_done_callback(handoff.finish)

    def _abandon(self, handoff: _Handoff) -> None:
        handoff.abandon()
        self._drain()

    def _serve(self) -> None:
        while True:
            try:
                self.loop.run_forever()
                return
            except BaseException:  # a call raised SystemExit or the like: its caller gets it
                log.debug("raybroker: a call on the call loop raised", exc_info=True)


def _new_loop() -> asyncio.AbstractEventLoop:
    # uvloop when it is there, as Ray runs actors' loops (and not when RAY_USE_UVLOOP turns it
    # off, as for them): measured with 100 + 100 threads on one handle, 15-20% less of the
    # call loop's CPU per message than asyncio's loop
    if os.environ.get("RAY_USE_UVLOOP", "1").lower() in ("1", "true"):
        try:
            import uvloop
        except ImportError:  # (no wheels for Windows): asyncio's own
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


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
