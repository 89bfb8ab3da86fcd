"""The receiving side: bundles that reached this broker are delivered here in sequence, relayed
onward when forwarding is on, or refused with a reason. Acknowledgements come only from the
broker that owns the far endpoint; a forwarder passes the owner's back."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..catalog import SYSTEM_TYPES, may_send
from ..dialogs import CONTRACT_NOT_ACCEPTED, Endpoint
from ..errors import BrokerError
from ..routing import Hop
from .port import BrokerPort, Work
from .wire import CONVERSATION_NOT_FOUND, MESSAGE_REFUSED, Ack, Bundle, unpack_bundles

log = logging.getLogger("raybroker")


@dataclass
class Arrival:
    """What a broker did with bundles that reached it."""

    acks: list[Ack] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # why some bundles were not taken
    forwards: list[tuple[list[Hop], list[Bundle]]] = field(default_factory=list)


class Receiver:
    """Arrival of bundles at one broker."""

    def __init__(self, port: BrokerPort) -> None:
        self.port = port

    def arrive(self, blob: bytes) -> Arrival:
        """Deliver what is for a local service, in sequence; route the rest onward when
        forwarding is on; say why anything was not taken."""
        port = self.port
        now = port.now()
        arrival = Arrival()
        local: list[Bundle] = []
        events: list[tuple[str, str, str]] = []
        onward: dict[tuple[str, ...], tuple[list[Hop], list[Bundle]]] = {}
        for raw in unpack_bundles(blob):
            bundle = Bundle(*raw)
            conv, to_service, to_broker = (
                bundle.conversation_id,
                bundle.to_service,
                bundle.to_broker,
            )
            if bundle.hops_left <= 0:
                events.append(
                    (
                        "HopLimit",
                        to_service,
                        f"conversation {conv}: dropped after {port.limits.hop_limit} hops; a "
                        "routing loop? check the forwarding routes",
                    )
                )
                arrival.refused.append(f"hop limit reached at {port.name}")
                continue
            if to_broker not in (None, port.broker_id) and not port.forwarding:
                arrival.refused.append(
                    f"{port.name} is broker {port.broker_id}, not {to_broker}; dropped"
                )
                continue
            m, hops = port.instance_hops(to_service, to_broker, conv, now)
            if hops and hops[0].rank == "local":
                local.append(bundle)
                continue
            hops = [h for h in hops if h.broker]  # a relay goes to another broker
            if port.forwarding and hops:
                key = tuple(h.address for h in hops)
                onward.setdefault(key, (hops, []))[1].append(
                    bundle._replace(hops_left=bundle.hops_left - 1)
                )
                continue
            arrival.refused.append(
                f"{port.name} has no way to {to_service!r}: {m.describe()}"
                + ("" if port.forwarding else " (forwarding is off)")
            )
        if local or events:
            self._take_all(local, events, arrival)
        arrival.forwards = list(onward.values())
        return arrival

    def _take_all(
        self, local: list[Bundle], events: list[tuple[str, str, str]], arrival: Arrival
    ) -> None:
        port = self.port

        def record(w: Work) -> None:
            for kind, subject, detail in events:
                port.record_event(w, kind, subject, detail)

        def take_all(w: Work) -> list[Ack]:
            record(w)
            return [a for bd in local for a in self._take(w, bd)]

        try:
            arrival.acks = port.transaction(take_all)
            return
        except Exception:
            # one bad dialog must not hold back the others: take them one by one
            log.exception("%s: a batch of arrivals failed; taking dialogs one by one", port.name)
        port.transaction(record)
        for bundle in local:
            try:
                arrival.acks += port.transaction(lambda w, bd=bundle: self._take(w, bd))
            except Exception as exc:
                arrival.refused.append(
                    f"{port.name} could not take conversation {bundle.conversation_id}: {exc}"
                )

    def _take(self, w: Work, bd: Bundle) -> list[Ack]:
        port = self.port
        conv, seqs = bd.conversation_id, bd.seqs

        def nack(code: int, description: str) -> list[Ack]:
            return [self._nack(bd, seqs, code, description)]

        ep = port.endpoint_of(conv, not bd.from_initiator)
        if ep is None:
            if not bd.from_initiator:
                return nack(
                    CONVERSATION_NOT_FOUND, f"conversation {conv} has no endpoint on {port.name}"
                )
            if seqs[0] != 0:
                # bundles start at the oldest unacknowledged message, so the endpoint was here
                # (it acknowledged the earlier ones) and has been cleaned up since
                return nack(
                    CONVERSATION_NOT_FOUND, f"conversation {conv} no longer exists on {port.name}"
                )
            catalog = port.catalog
            svc = catalog.services[bd.to_service]
            if bd.contract not in svc.contracts or bd.contract not in catalog.contracts:
                return nack(
                    CONTRACT_NOT_ACCEPTED,
                    f"service {bd.to_service!r} on {port.name} does not accept contract "
                    f"{bd.contract!r}",
                )
            ep = port.open_target(
                w, conv, svc.name, bd.from_service, bd.contract, bd.expires_at, bd.from_broker
            )
        if ep.far_broker not in (None, bd.from_broker):
            # seed 002's "multiple target endpoints": a second broker answers a dialog that is
            # bound to another; refuse it so that broker's side of the dialog errors
            return nack(
                CONVERSATION_NOT_FOUND,
                f"conversation {conv} is bound to broker "
                f"{ep.far_broker}, not {bd.from_broker}; give the routes broker instance ids",
            )
        if ep.far_broker is None:
            port.pin(w, ep, bd.from_broker)
        start = next((i for i, s in enumerate(seqs) if s >= ep.recv_seq), len(seqs))
        acks = []
        if start:  # duplicates: already delivered; acknowledge them again
            acks.append(self._ack(bd, seqs[0], seqs[start - 1]))
        types, bodies = bd.types, bd.bodies
        i = start
        while i < len(seqs) and seqs[i] == ep.recv_seq:
            j = i
            while j + 1 < len(seqs) and types[j + 1] == types[i] and seqs[j + 1] == seqs[j] + 1:
                j += 1
            refusal = self._refusal(ep, types[i], bodies[i : j + 1])
            if refusal is not None:
                port.post_error(w, ep, MESSAGE_REFUSED, refusal)
                acks.append(self._nack(bd, seqs[i:], MESSAGE_REFUSED, refusal))
                return acks
            port.deliver(w, ep, types[i], bodies[i : j + 1], seqs[i])
            acks.append(self._ack(bd, seqs[i], seqs[j]))
            i = j + 1
        return acks  # anything after a gap waits for the resend

    def _refusal(self, ep: Endpoint, mt: str, bodies: Sequence[bytes]) -> str | None:
        """Why arriving messages may not be delivered (validation happens on arrival), or None."""
        if mt in SYSTEM_TYPES:
            return None
        catalog = self.port.catalog
        contract = catalog.contracts.get(ep.contract)
        if contract is None or not may_send(contract, mt, not ep.is_initiator):
            return f"message type {mt!r} is not allowed from that side by contract {ep.contract!r}"
        try:
            validator = catalog.validator(mt)
            if validator.kind != "none":
                for body in bodies:
                    validator.check(body)
        except BrokerError as exc:
            return str(exc)
        return None

    def _ack(self, bd: Bundle, first: int, last: int) -> Ack:
        return Ack(
            bd.conversation_id, bd.from_initiator, first, last, self.port.broker_id, None, ""
        )

    def _nack(self, bd: Bundle, seqs: Sequence[int], code: int, description: str) -> Ack:
        return Ack(
            bd.conversation_id,
            bd.from_initiator,
            seqs[0],
            seqs[-1],
            self.port.broker_id,
            code,
            description,
        )
