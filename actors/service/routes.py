"""The route verbs of a running broker (`BrokerService` inherits them): each one core call, plus
the check that a route's brokers run, which only the runtime can make."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from actors.errors import UnknownBroker

if TYPE_CHECKING:
    from actors.core import BrokerCore
    from actors.transport import Peers


class RouteVerbs:
    """Route verbs; the service supplies `name`, `core`, `peers` and `_send_poke`."""

    name: str
    core: BrokerCore
    peers: Peers | None
    _send_poke: asyncio.Event

    def check_brokers(self, record: Any, route: Any) -> list[str]:
        """Warnings for a route to a broker that is not running: the route is made all the same
        (brokers may start in any order) and its messages wait until that broker starts. A
        broker without peers (in process) reaches no other broker: such a route is refused."""
        warnings: list[str] = []
        if not isinstance(record, Mapping):
            return warnings  # the core refuses it, with the reason
        for key in ("address", "mirror_address"):
            address = record.get(key)
            if isinstance(address, str) and address.lower().startswith("ray://"):
                name = address[len("ray://") :]
                if name == self.name or self.broker_exists(name):
                    continue
                if self.peers is None:
                    raise UnknownBroker(
                        name,
                        f"{self.name!r} runs in process without peers and reaches no other "
                        "broker; route to LOCAL, or run the brokers on Ray",
                    )
                warnings.append(
                    f"route {route!r}: broker {name!r} is not running yet; "
                    "messages routed to it wait in the transmission queue and go when it starts"
                )
        return warnings

    def broker_exists(self, name: str) -> bool:
        """Whether another broker of that name runs (an in-process broker knows none)."""
        return False

    async def create_route(self, table: str, record: dict[str, Any], request_id: str) -> list:
        ahead = self.check_brokers(record, record.get("name") if isinstance(record, dict) else "")
        warnings = self.core.create_route(table, record, request_id)
        self._send_poke.set()  # delayed dialogs may now have a way
        return [*warnings, *ahead]

    async def alter_route(
        self, table: str, name: str, changes: dict[str, Any], request_id: str
    ) -> list:
        ahead = self.check_brokers(changes, name)
        warnings = self.core.alter_route(table, name, changes, request_id)
        self._send_poke.set()
        return [*warnings, *ahead]

    async def drop_route(self, table: str, name: str, request_id: str) -> None:
        self.core.drop_route(table, name, request_id)

    async def configure(self, forwarding: bool | None = None) -> dict[str, Any]:
        return self.core.configure(forwarding)

    async def retry_transmission(self, conversation_handle: str | None = None) -> int:
        made_due = self.core.retry_transmission(conversation_handle)
        self._send_poke.set()
        return made_due

    async def record_event(self, kind: str, subject: str, detail: str) -> None:
        self.core.record_operator_event(kind, subject, detail)
