"""The broker itself as a reader port (`ReaderPort`), for internal readers on its event loop."""

from __future__ import annotations

from typing import Any

from actors.calls.envelope import ReceivedGroup


class InternalPort:
    """The broker itself as a reader port, for readers on its own event loop: no call per batch,
    the same settle path as every client."""

    def __init__(self, service: Any) -> None:  # an actors.service.broker.BrokerService
        self.service = service

    async def receive(
        self,
        queue: str,
        *,
        max_groups: int,
        wait: float,
        lease: float,
        reader: str | None,
        commit: list[str],
        rollback: list[str],
        ops: list[Any],
        states: dict[str, bytes | None],
    ) -> list[ReceivedGroup]:
        settle = (commit, rollback, ops, states, None) if commit or rollback else None
        options = {"max_groups": max_groups, "lease_s": lease}
        return await self.service.receive_groups(queue, wait, options, None, settle, reader)

    async def settle(
        self,
        *,
        commit: list[str],
        rollback: list[str],
        ops: list[Any],
        states: dict[str, bytes | None],
    ) -> Any:
        return await self.service.settle_groups(commit, rollback, ops, states, None)
