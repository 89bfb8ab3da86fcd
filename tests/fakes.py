"""Shared test doubles. Only the clock is faked; stores are real SQLite (file or :memory:)."""

from __future__ import annotations

from typing import Any


class FakeClock:
    """A clock that moves only when a test says so."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class InProcessPeers:
    """`Peers` over brokers in this process: a call to a broker runs its courier's `deliver`.

    `net` has `couriers` (broker name -> courier), `down` (names that are unreachable, as a
    broker that is not running is) and `calls`, where every call that gets through is recorded
    as (caller, callee)."""

    def __init__(self, caller: str, net: Any) -> None:
        self.caller = caller
        self.net = net

    async def deliver(self, broker: str, blob: bytes, timeout: float) -> bytes:
        from actors.errors import PeerUnreachable

        net = self.net
        if broker in net.down or broker not in net.couriers:
            raise PeerUnreachable.not_running(broker)
        net.calls.append((self.caller, broker))
        return await net.couriers[broker].deliver(blob)
