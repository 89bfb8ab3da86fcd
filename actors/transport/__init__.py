"""Delivery between brokers: the wire format (`wire`), the sending side (`outbound`), the
receiving side (`inbound`) and the courier that carries batches over `Peers` (`courier`).

The transport knows its broker only through `port.BrokerPort` and imports nothing from core.
"""

from __future__ import annotations

from actors.model.limits import Limits
from actors.store.database import Store
from actors.transport.courier import Courier
from actors.transport.inbound import Arrival, Receiver
from actors.transport.outbound import Dispatcher, Outbound
from actors.transport.port import BrokerPort, Peers
from actors.transport.wire import (
    CONVERSATION_NOT_FOUND,
    MESSAGE_REFUSED,
    Ack,
    Bundle,
    merge_replies,
    pack_reply,
    refuses_all,
)

RETRY_MIN_S, RETRY_MAX_S = Limits.retry_min_s, Limits.retry_max_s


class Transport:
    """One broker's side of the transport: dispatch and acknowledgements, arrival."""

    def __init__(self, port: BrokerPort, store: Store) -> None:
        self.outbound = Dispatcher(port, store)
        self.inbound = Receiver(port)

    @property
    def pending(self) -> bool:
        return self.outbound.pending

    def dispatch(self) -> list[Outbound]:
        return self.outbound.dispatch()

    def acknowledged(self, out: Outbound, reply: bytes) -> None:
        self.outbound.acknowledged(out, reply)

    def failed(self, out: Outbound, why: str) -> None:
        self.outbound.failed(out, why)

    def release(self, out: Outbound) -> None:
        self.outbound.release(out)

    def arrive(self, blob: bytes) -> Arrival:
        return self.inbound.arrive(blob)

    def courier(self, peers: Peers) -> Courier:
        return Courier(self.outbound, self.inbound, peers)


def pack_arrival(arrival: Arrival) -> bytes:
    return pack_reply(arrival.acks, arrival.refused)


__all__ = [
    "CONVERSATION_NOT_FOUND",
    "MESSAGE_REFUSED",
    "RETRY_MAX_S",
    "RETRY_MIN_S",
    "Ack",
    "Arrival",
    "BrokerPort",
    "Bundle",
    "Courier",
    "Outbound",
    "Peers",
    "Transport",
    "merge_replies",
    "pack_arrival",
    "refuses_all",
]
