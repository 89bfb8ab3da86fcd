"""Shared test doubles. Only the clock is faked; stores are real SQLite (file or :memory:)."""

from __future__ import annotations


class FakeClock:
    """A clock that moves only when a test says so."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
