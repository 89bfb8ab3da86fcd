"""`ReaderActor`: an activated queue reader in its own Ray actor (placement "pool").

The loop itself is `actors.activation.read_until_idle`; this shell only gives it a process, the
broker client and the handler. The broker starts it, and kills it when it is no longer needed.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from actors.activation import read_until_idle
from actors.model.catalog import Activation
from actors.model.code_names import import_code
from actors.remote.client import lock_holder


class ReaderActor:
    def __init__(self, broker: Any) -> None:
        self.broker = broker  # an actors.remote.client.Broker

    def actor_id(self) -> str:
        """The holder its locks are held under, which the broker releases if the actor dies."""
        return lock_holder()[0]

    async def run(self, queue: str, reader_id: str, activation: dict[str, Any]) -> dict[str, Any]:
        act = Activation(**activation)
        handler = import_code(act.handler)  # its broker checked it (ReaderPools._start)
        stats = await read_until_idle(
            self.broker.aio, queue, act, handler, time.monotonic, reader_id
        )
        return dataclasses.asdict(stats)
