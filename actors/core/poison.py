"""Poison-message detection: a queue whose receives roll back `limit` times in a row is disabled.

Plain Python. The count is per queue and in memory, as in Service Broker: any commit on the queue
resets it.
"""

from __future__ import annotations


class PoisonCounter:
    def __init__(self) -> None:
        self._rollbacks: dict[str, int] = {}

    def rolled_back(self, queue: str, limit: int) -> bool:
        """Count one rollback; True when the queue has now reached its limit (0 = never)."""
        n = self._rollbacks.get(queue, 0) + 1
        self._rollbacks[queue] = n
        return limit > 0 and n >= limit

    def committed(self, queue: str) -> None:
        self._rollbacks.pop(queue, None)

    def reset(self, queue: str) -> None:
        self._rollbacks.pop(queue, None)

    def count(self, queue: str) -> int:
        return self._rollbacks.get(queue, 0)
