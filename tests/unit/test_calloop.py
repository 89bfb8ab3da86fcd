"""The call loop (actors.client.calloop): other threads' coroutines run on its thread, each caller
gets its own result or error in its own context, calls queued while the loop is busy are taken in
one turn, and a caller interrupted while it waits cancels its call without stopping anyone
else's."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import os
import subprocess
import sys
import threading

import pytest

from actors.client.calloop import CallLoop, call_loop, on_call_loop_thread
from tests.polling import wait_until


class Boom(Exception):
    pass


async def _echo(value: int) -> tuple[int, threading.Thread]:
    await asyncio.sleep(0)
    if value % 7 == 3:
        raise Boom(value)
    return value, threading.current_thread()


def test_each_thread_gets_its_own_result_or_error_from_the_loop_thread():
    loop = CallLoop()
    outcomes: dict[int, object] = {}

    def caller(i: int) -> None:
        try:
            outcomes[i] = loop.run(_echo(i))
        except Boom as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(60)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(outcomes) == 60
    for i, outcome in outcomes.items():
        if i % 7 == 3:
            assert isinstance(outcome, Boom) and outcome.args == (i,)
        else:
            assert outcome == (i, loop.thread)  # ran on the loop's thread


def test_calls_queued_while_the_loop_is_busy_are_taken_in_one_turn():
    loop = CallLoop()
    release = threading.Event()
    busy = threading.Event()

    async def block() -> None:
        busy.set()
        release.wait(30)  # holds the loop's thread: nothing else runs on it meanwhile

    blocker = threading.Thread(target=loop.run, args=(block(),))
    blocker.start()
    wait_until(busy.is_set, what="the loop to be busy")
    drains = loop.drains
    results: list[int] = []
    threads = [
        threading.Thread(target=lambda i=i: results.append(loop.run(_echo(7 * i))[0]))
        for i in range(20)
    ]
    for t in threads:
        t.start()
    wait_until(lambda: len(loop._inbox) == 20, what="20 calls queued")  # noqa: SLF001
    release.set()
    for t in [blocker, *threads]:
        t.join(timeout=30)
    assert sorted(results) == [7 * i for i in range(20)]
    assert loop.drains == drains + 1  # one wake-up for the twenty


# Run in a fresh interpreter: a test process that has started Ray (other tests share the
# worker) may have the signal land in, or be handled by, one of Ray's own threads.
_INTERRUPTED = """
import asyncio, os, signal, sys, threading, time
from actors.client.calloop import CallLoop

# Python's own Ctrl-C handling, whatever this process inherited (a shell's background job
# starts with SIGINT ignored)
signal.signal(signal.SIGINT, signal.default_int_handler)

async def echo(value):
    await asyncio.sleep(0)
    return value, threading.current_thread()

loop = CallLoop()
started, cancelled = threading.Event(), threading.Event()

async def slow():
    started.set()
    try:
        await asyncio.Event().wait()  # until it is cancelled
    except asyncio.CancelledError:
        cancelled.set()
        raise

def interrupt():
    started.wait(30)
    if sys.argv[1] == "process":
        os.kill(os.getpid(), signal.SIGINT)
    else:  # a process-directed Ctrl-C may be delivered to any thread: the caller must see it
        signal.pthread_kill(loop.thread.ident, signal.SIGINT)

threading.Thread(target=interrupt, daemon=True).start()
try:
    loop.run(slow())
except KeyboardInterrupt:
    print("interrupted")
deadline = time.monotonic() + 30
while not cancelled.is_set() and time.monotonic() < deadline:
    cancelled.wait(0.05)
print("cancelled" if cancelled.is_set() else "still running")
print("serving" if loop.run(echo(1)) == (1, loop.thread) else "not serving")
"""


@pytest.mark.parametrize("interrupt_with", ["process", "loop-thread"])
def test_a_caller_interrupted_while_waiting_cancels_its_call(interrupt_with):
    done = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED, interrupt_with],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    assert done.stdout.split() == ["interrupted", "cancelled", "serving"], done.stderr


def test_a_caller_interrupted_before_its_wake_up_was_scheduled_leaves_the_loop_serving():
    loop = CallLoop()
    real = loop.loop

    class InterruptedOnce:  # the loop, but the first wake-up is interrupted before it is sent
        fired = False

        def __getattr__(self, name: str):
            return getattr(real, name)

        def call_soon_threadsafe(self, *args):
            if not InterruptedOnce.fired:
                InterruptedOnce.fired = True
                raise KeyboardInterrupt  # as a SIGINT landing between the append and the wake-up
            return real.call_soon_threadsafe(*args)

    loop.loop = InterruptedOnce()
    never_run = _echo(1)
    with pytest.raises(KeyboardInterrupt):
        loop.run(never_run)
    loop.loop = real
    answers: list = []
    later = threading.Thread(target=lambda: answers.append(loop.run(_echo(2))), daemon=True)
    later.start()
    later.join(timeout=10)
    assert answers == [(2, loop.thread)]  # not stuck behind the interrupted call
    assert never_run.cr_frame is None  # closed without running (no "never awaited" warning)


_who: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")


async def _whose() -> str:
    await asyncio.sleep(0)
    return _who.get()


def test_each_call_runs_in_its_callers_context():
    loop = CallLoop()
    release, busy = threading.Event(), threading.Event()

    async def block() -> None:
        busy.set()
        release.wait(30)

    blocker = threading.Thread(target=loop.run, args=(block(),))
    blocker.start()
    wait_until(busy.is_set, what="the loop to be busy")
    seen: dict[str, str] = {}

    def caller(name: str) -> None:
        _who.set(name)
        seen[name] = loop.run(_whose())

    threads = [threading.Thread(target=caller, args=(n,)) for n in "ABC"]
    for t in threads:
        t.start()
    wait_until(lambda: len(loop._inbox) == 3, what="3 calls queued")  # noqa: SLF001
    release.set()  # the three are drained in one turn, each still in its own context
    for t in [blocker, *threads]:
        t.join(timeout=30)
    assert seen == {"A": "A", "B": "B", "C": "C"}


def test_a_cancelled_call_raises_an_exception_and_a_system_exit_does_not_stop_the_loop():
    loop = CallLoop()

    async def cancelled() -> None:
        raise asyncio.CancelledError

    async def exits() -> None:
        raise SystemExit(3)

    with pytest.raises(concurrent.futures.CancelledError):  # an Exception, as it was
        loop.run(cancelled())
    with pytest.raises(SystemExit):
        loop.run(exits())
    assert loop.run(_echo(4)) == (4, loop.thread)


def test_ray_use_uvloop_0_keeps_the_call_loop_on_asyncios_loop(monkeypatch):
    monkeypatch.setenv("RAY_USE_UVLOOP", "0")
    assert type(CallLoop().loop).__module__.startswith("asyncio")


def test_the_process_has_one_call_loop_and_knows_its_thread():
    assert call_loop() is call_loop()
    assert call_loop().thread.daemon
    assert not on_call_loop_thread()
    assert call_loop().run(_on_thread()) is True


def test_the_call_loop_runs_on_uvloop_where_it_is_installed():
    uvloop = pytest.importorskip("uvloop")
    assert isinstance(call_loop().loop, uvloop.Loop)


async def _on_thread() -> bool:
    return on_call_loop_thread()
