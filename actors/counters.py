"""What one broker has done since it started: messages sent, received, committed, rolled back and
forwarded. Plain counters, kept in memory (a restart starts them again, as Prometheus counters
expect); `actors.remote.metrics` exports them through Ray."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class Counts:
    sent: int = 0  # by this broker's own dialogs, committed
    received: int = 0  # handed to readers by a receive
    committed: int = 0  # received and committed
    rolled_back: int = 0  # received and returned to their queue
    forwarded: int = 0  # relayed to another broker (forwarding brokers)
    passed_through: int = 0  # sent on a relayed dialog at arrival, no reader (`Begin.relays`)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)
