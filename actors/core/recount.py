"""Counts that take a while on a large store (dialogs by state, messages waiting to leave),
asked for by views and by the metrics every second: a count is reused for `SHARE` times as long
as it took, so a broker spends at most 1/`SHARE` of its time counting, however often it is
asked and however large the store grows (a million dialogs parked while a peer is down took
110 ms to count)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")
SHARE = 20


class Recount(Generic[T]):
    """The last count of one thing: when it was made (on the broker's clock) and how long it
    took (`timer`)."""

    def __init__(self, timer: Callable[[], float] = time.perf_counter) -> None:
        self.timer = timer
        self.at = 0.0
        self.took = 0.0
        self.value: T | None = None

    def get(self, now: float, count: Callable[[], T]) -> T:
        """The count, made again by `count()` if the last one is older than SHARE times what
        it took."""
        if self.value is None or now - self.at > SHARE * self.took:
            started = self.timer()
            self.value = count()
            self.took, self.at = self.timer() - started, now
        return self.value
