"""Calls waiting for messages on a queue (a receive's wait, a client's shared `wait_take`), how
many wait on each queue (the queues view's `waiting_receives`), and their wake-up when messages
arrive. `BrokerService` inherits it."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from actors.activation import ReaderPools


class Waiting:
    pools: ReaderPools

    def __init__(self) -> None:
        self._waiters: dict[str, asyncio.Event] = {}
        self.waiting: Counter[str] = Counter()  # per queue, calls waiting for messages now

    def _wake(self, queue: str) -> None:
        ev = self._waiters.pop(queue, None)
        if ev is not None:
            ev.set()
        self.pools.nudge(queue)

    async def _wait(self, queue: str, timeout: float) -> None:
        ev = self._waiters.setdefault(queue, asyncio.Event())
        self.waiting[queue] += 1
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ev.wait(), timeout)
        finally:
            self.waiting[queue] -= 1
