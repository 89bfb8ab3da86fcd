"""The receiving side: bundles that reached this broker are delivered here in sequence, relayed
onward when forwarding is on, or refused with a reason. Acknowledgements come only from the
broker that owns the far endpoint; a forwarder passes the owner's back."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from actors.errors import BrokerError, SecurityError
from actors.model.catalog import DIALOG_TIMER, END_DIALOG, ERROR, SYSTEM_TYPES, may_send
from actors.model.dialogs import CONTRACT_NOT_ACCEPTED, IN_ERROR, Endpoint, parse_error_body
from actors.model.hops import Hop
from actors.packing import made
from actors.transport.port import BrokerPort, Work
from actors.transport.wire import (
    CONVERSATION_NOT_FOUND,
    MESSAGE_REFUSED,
    SECURITY_REFUSED,
    Ack,
    Bundle,
    read_bundle,
    unpack_bundles,
)

log = logging.getLogger("raybroker")


@dataclass
class Arrival:
    """What a broker did with bundles that reached it."""

    acks: list[Ack] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # why some bundles were not taken
    forwards: list[tuple[list[Hop], list[Bundle]]] = field(default_factory=list)


class Drops:
    """Arriving messages a broker did not take, summed up for its events: one event per kind,
    service, sending broker and reason in a call, however many messages (a sender retries every
    few seconds; the events must not grow with the size of its batches)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seen: dict[tuple[str, str, str, str], list] = {}  # -> [bundles, messages, conv]

    def add(
        self, kind: str, service: str, sender: str, messages: int, why: str, conv: str = ""
    ) -> None:
        n = self.seen.setdefault((kind, service, sender, why), [0, 0, conv])
        n[0] += 1
        n[1] += messages

    def add_raw(self, raw: Any, why: str) -> None:
        """A malformed bundle: what of it can be read names the service and the sender."""
        n = len(Bundle._fields)
        fields = raw if isinstance(raw, list) and len(raw) in (n - 1, n) else []
        b = Bundle(*fields) if fields else None

        def text(value: Any) -> str:
            return value if isinstance(value, str) and 0 < len(value) <= 128 else "?"

        seqs = b.seqs if b is not None and isinstance(b.seqs, list) else []
        self.add(
            "Dropped",
            text(b.to_service) if b else "?",
            text(b.from_broker) if b else "?",
            len(seqs),
            why,
            text(b.conversation_id) if b else "",
        )

    def events(self) -> list[tuple[str, str, str]]:
        out = []
        for (kind, service, sender, why), (bundles, messages, conv) in self.seen.items():
            what = f"{messages} message(s) in {bundles} bundle(s)" if messages else "a call"
            who = "an unknown broker" if sender == "?" else f"broker {sender}"
            first = f" (first: conversation {conv})" if conv else ""
            out.append((kind, service, f"{what} from {who} dropped at {self.name}{first}: {why}"))
        return out


class Receiver:
    """Arrival of bundles at one broker."""

    def __init__(self, port: BrokerPort) -> None:
        self.port = port

    def arrive(self, blob: bytes) -> Arrival:
        """Deliver what is for a local service, in sequence; route the rest onward when
        forwarding is on; say why anything was not taken. Never raises for what arrives: a
        malformed bundle is refused alone, and every drop is recorded as an event."""
        port = self.port
        now = port.now()
        arrival = Arrival()
        local: list[Bundle] = []
        drops = Drops(port.name)
        onward: dict[tuple[str, ...], tuple[list[Hop], list[Bundle]]] = {}
        raws = unpack_bundles(blob)
        if isinstance(raws, str):
            arrival.refused.append(f"{port.name} could not read the call: {raws}")
            drops.add("Dropped", "?", "?", 0, f"it could not be read: {raws}")
            raws = []
        for raw in raws:
            bundle = read_bundle(raw)
            if isinstance(bundle, str):
                arrival.refused.append(f"{port.name} refused a malformed bundle: {bundle}")
                drops.add_raw(raw, f"a malformed bundle: {bundle}")
                continue
            conv, to_service, to_broker = (
                bundle.conversation_id,
                bundle.to_service,
                bundle.to_broker,
            )
            if bundle.hops_left <= 0:
                drops.add(
                    "HopLimit",
                    to_service,
                    bundle.from_broker,
                    len(bundle.seqs),
                    f"dropped after {port.limits.hop_limit} hops; a routing loop? check the "
                    "forwarding routes",
                    conv,
                )
                arrival.refused.append(f"hop limit reached at {port.name}")
                continue
            if to_broker not in (None, port.broker_id) and not port.forwarding:
                why = f"{port.name} is broker {port.broker_id}, not {to_broker}; dropped"
                drops.add("Dropped", to_service, bundle.from_broker, len(bundle.seqs), why, conv)
                arrival.refused.append(why)
                continue
            m, hops = port.instance_hops(to_service, to_broker, conv, now)
            if hops and hops[0].rank == "local":
                local.append(bundle)
                continue
            hops = [h for h in hops if h.broker]  # a relay goes to another broker
            if port.forwarding and hops:
                key = tuple(h.address for h in hops)
                relayed = made(Bundle, (*bundle[:8], bundle.hops_left - 1, *bundle[9:]))
                onward.setdefault(key, (hops, []))[1].append(relayed)
                continue
            why = f"{port.name} has no way to {to_service!r}: {m.describe()}" + (
                "" if port.forwarding else " (forwarding is off)"
            )
            drops.add("Dropped", to_service, bundle.from_broker, len(bundle.seqs), why, conv)
            arrival.refused.append(why)
        events = drops.events()
        if local or events:
            self._take_all(local, events, arrival)
        arrival.forwards = list(onward.values())
        port.counts.forwarded += sum(
            len(b.seqs) for _, bundles in arrival.forwards for b in bundles
        )
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
            # dialogs' first bundles: whether their target was here and went, asked at once
            firsts = [bd.conversation_id for bd in local if bd.from_initiator and not bd.seqs[0]]
            found = port.ended_recv_seqs(firsts) if firsts else {}
            ended = {conv: found.get(conv) for conv in firsts}
            return [a for bd in local for a in self._take(w, bd, ended)]

        try:
            arrival.acks = port.transaction(take_all)
            return
        except Exception:
            # one bad dialog must not hold back the others: take them one by one
            log.exception("%s: a batch of arrivals failed; taking dialogs one by one", port.name)
        port.transaction(record)
        for bundle in local:
            try:
                arrival.acks += port.transaction(lambda w, bd=bundle: self._take(w, bd, {}))
            except Exception as exc:
                arrival.refused.append(
                    f"{port.name} could not take conversation {bundle.conversation_id}: {exc}"
                )

    def _take(self, w: Work, bd: Bundle, ended: dict[str, int | None]) -> list[Ack]:
        """`ended`: `ended_recv_seqs` of some dialogs, asked beforehand (None: not remembered);
        the others are asked here."""
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
            taken = ended[conv] if conv in ended else port.ended_recv_seqs([conv]).get(conv)
            if taken is not None:  # its target was here and has gone: nothing opens it again
                return self._after_end(bd, taken)
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
            session_key = None
            if bd.security is not None:  # a secured dialog: its key offer opens, or nothing
                session_key = self._accepted(w, bd)
                if isinstance(session_key, str):
                    return nack(SECURITY_REFUSED, session_key)
            ep = port.open_target(
                w, conv, svc.name, bd.from_service, bd.contract, bd.expires_at, bd.from_broker
            )
            if session_key is not None:
                port.keep_session(w, ep, session_key)
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
        types, bodies, sent = bd.types, bd.bodies, bd.sent_ats  # sent: on the sender's clock
        if bd.security is not None or port.session(ep.no) is not None:
            opened = self._opened(w, bd, ep, start)
            if isinstance(opened, str):
                return nack(SECURITY_REFUSED, opened)
            seqs, bodies = seqs[: start + len(opened)], [*bodies[:start], *opened]
        i = start
        while i < len(seqs) and seqs[i] == ep.recv_seq:
            j = _run_end(seqs, types, i)
            refusal = self._refusal(ep, types[i], bodies[i : j + 1])
            if refusal is not None:
                # the messages before the refused one are taken; it and all after it are not,
                # and the dialog ends with an Error on both sides (it never waits in retries)
                good, why = refusal
                if good:
                    port.deliver(w, ep, types[i], bodies[i : i + good], seqs[i], sent[i])
                    acks.append(self._ack(bd, seqs[i], seqs[i + good - 1]))
                if ep.state is not IN_ERROR:  # a resend of a refused message: told once
                    port.post_error(w, ep, MESSAGE_REFUSED, why)
                acks.append(self._nack(bd, seqs[i + good :], MESSAGE_REFUSED, why))
                return acks
            port.deliver(w, ep, types[i], bodies[i : j + 1], seqs[i], sent[i])
            acks.append(self._ack(bd, seqs[i], seqs[j]))
            i = j + 1
        return acks  # anything after a gap waits for the resend

    def _accepted(self, w: Work, bd: Bundle) -> bytes | str:
        """The session key of a secured dialog's first bundle, or why its key offer is refused
        (also an event naming the dialog)."""
        port = self.port
        offer = bd.security[0] if bd.security else None
        try:
            if offer is None:
                raise SecurityError(
                    f"conversation {bd.conversation_id}: its first message came sealed without "
                    "the dialog's key offer"
                )
            return port.accept_offer(
                offer, bd.conversation_id, bd.from_service, bd.to_service, port.now()
            )
        except SecurityError as exc:
            port.record_event(w, "SecurityRefused", bd.to_service,
                              f"from broker {bd.from_broker}: {exc}")  # fmt: skip
            return str(exc)

    def _opened(self, w: Work, bd: Bundle, ep: Endpoint, start: int) -> list[bytes] | str:
        """The bodies from `start` on, opened with the dialog's session key, up to the first
        that does not verify (it and those after it are not acknowledged: the sender's
        retransmission of the original is delivered once). A message in the clear on a
        secured dialog, or sealed on one without a key here, is not taken either."""
        port = self.port
        session = port.session(ep.no)
        if session is None:  # sealed, on a dialog that arrived in the clear: its offer decides
            key = self._accepted(w, bd)
            if isinstance(key, str):
                return key
            port.keep_session(w, ep, key)
            session = port.session(ep.no)
            assert session is not None
        opened: list[bytes] = []
        why = ""
        if bd.security is None:
            why = "came in the clear on a secured dialog"
        else:
            try:
                opened = session.open(bd.from_initiator, bd.seqs, bd.types, bd.security[1])
                opened = opened[start:]
            except SecurityError:
                why = "does not verify (changed in flight, or not of this dialog here)"
        if why:
            port.record_event(w, "SecurityRefused", ep.service,
                              f"conversation {bd.conversation_id}: messages {bd.seqs[0]} to "
                              f"{bd.seqs[-1]} from broker {bd.from_broker} {why}; not "
                              "delivered")  # fmt: skip
        return opened

    def _after_end(self, bd: Bundle, taken: int) -> list[Ack]:
        """A bundle for a dialog whose target endpoint was removed here after taking `taken`
        messages: those it took are acknowledged again (they were delivered once), the rest
        refused as not found, so the initiator's side errors as for any dialog gone."""
        seqs = bd.seqs
        n = next((i for i, s in enumerate(seqs) if s >= taken), len(seqs))
        acks = [self._ack(bd, seqs[0], seqs[n - 1])] if n else []
        if n < len(seqs):
            why = f"conversation {bd.conversation_id} has ended on {self.port.name}"
            acks.append(self._nack(bd, seqs[n:], CONVERSATION_NOT_FOUND, why))
        return acks

    def _refusal(self, ep: Endpoint, mt: str, bodies: Sequence[bytes]) -> tuple[int, str] | None:
        """Why arriving messages of one type may not be delivered (validation happens on
        arrival, against this broker's own limits and catalog), with how many of them come
        before the first refused one; or None."""
        port = self.port
        if mt == DIALOG_TIMER:
            return 0, f"message type {mt!r} is a broker's own; another broker may not send it"
        if mt not in SYSTEM_TYPES:
            catalog = port.catalog
            contract = catalog.contracts.get(ep.contract)
            if contract is None or not may_send(contract, mt, not ep.is_initiator):
                return 0, (
                    f"message type {mt!r} is not allowed from that side by contract {ep.contract!r}"
                )
        if mt not in (END_DIALOG, ERROR) and max(map(len, bodies)) <= port.limits.max_body_bytes:
            try:  # the usual case: a type without validation, no body too big; none to look at
                if port.catalog.validator(mt).kind == "none":
                    return None
            except BrokerError:
                pass  # the first body's check below names it
        for n, body in enumerate(bodies):
            why = self._body_refusal(mt, body)
            if why is not None:
                return n, why
        return None

    def _body_refusal(self, mt: str, body: bytes) -> str | None:
        port = self.port
        limit = port.limits.max_body_bytes
        if len(body) > limit:
            return (
                f"a {mt!r} body of {len(body):,} bytes is larger than {port.name}'s "
                f"max_body_bytes ({limit:,}); send smaller bodies or raise that broker's limit"
            )
        if mt == END_DIALOG:
            return None if not body else f"an {mt!r} message carries no body"
        if mt == ERROR:
            try:
                parse_error_body(body)
            except Exception:  # a malformed Error body: json, key and int errors alike
                return "an 'Error' body must be JSON with an integer code and a description"
            return None
        try:
            validator = port.catalog.validator(mt)
            if validator.kind != "none":
                validator.check(body)
        except BrokerError as exc:
            return str(exc)
        except Exception:  # a body no validator can judge (nested too deep, say) is refused
            log.exception("%s: validating a %r body failed", port.name, mt)
            return f"a {mt!r} body could not be validated on {port.name}"
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


def _run_end(seqs: Sequence[int], types: Sequence[str], i: int) -> int:
    """Where the run from message i ends: the last message of its type with no gap in the
    sequence numbers since i (they increase, so the whole rest is a run when the last one is as
    far from i as its place is)."""
    last = len(seqs) - 1
    if seqs[last] - seqs[i] == last - i and types.count(types[i]) == len(types):
        return last
    j = i
    while j < last and types[j + 1] == types[i] and seqs[j + 1] == seqs[j] + 1:
        j += 1
    return j
