"""Activation: how many readers a queue needs (`policy`), and what one reader turn does with what
it received (`reader`).

Plain Python. The broker actor's reader pools ask `PoolPolicy` when messages arrive and on their
clock; the reader loops (pool actors, or tasks inside the broker) call `run_handler` for each
received group and settle the `Outcome` with their next receive.
"""

from actors.activation.policy import (
    BACKLOG_TARGET_S,
    Decision,
    PoolPolicy,
    QueueState,
    readers_to_start,
)
from actors.activation.pools import ReaderLauncher, ReaderPools
from actors.activation.reader import (
    Handler,
    HandlerContext,
    Outcome,
    ReaderPort,
    ReaderStats,
    read_until_idle,
    run_handler,
)

__all__ = [
    "BACKLOG_TARGET_S",
    "Decision",
    "Handler",
    "HandlerContext",
    "Outcome",
    "PoolPolicy",
    "QueueState",
    "ReaderLauncher",
    "ReaderPools",
    "ReaderPort",
    "ReaderStats",
    "read_until_idle",
    "readers_to_start",
    "run_handler",
]
