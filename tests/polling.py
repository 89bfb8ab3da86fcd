"""Waiting for a condition in tests: poll it with a deadline (never a bare sleep standing in for
the condition), failing with what was awaited."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any


def wait_until(check: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll `check` until it returns something truthy (returned); fail with `what` after
    `timeout` seconds. The pause between checks grows from 10 ms to 0.2 s."""
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


async def apoll(check: Callable[[], Any], what: str, timeout: float = 5.0) -> Any:
    """`wait_until` for coroutines: yields to the event loop between checks."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.001)
    return value


def process_gone(pid: int) -> bool:
    """Whether process `pid` (on this machine) has exited: `ray.kill` returns before it has."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False
