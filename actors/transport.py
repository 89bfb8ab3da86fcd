"""Delivery between brokers: dispatching the transmission queue, the wire format, arrival at the
far broker, forwarding, and acknowledgements. Plain Python; the broker actor does the calls.

What travels is a list of bundles, one per conversation direction: the dialog's header once, then
its messages (sequence numbers in order). The broker that owns the far endpoint acknowledges
ranges of sequence numbers; a forwarder relays and passes back the owner's acknowledgements, so
an acknowledgement never comes from a forwarder. Arrival takes a message only in sequence:
an old one is a duplicate (dropped, acknowledged again), a later one waits for the sender to
resend what is missing (the sender resends everything unacknowledged, in order).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgpack

from .catalog import SYSTEM_TYPES, may_send
from .dialogs import CONTRACT_NOT_ACCEPTED, State, error_body
from .errors import BrokerError
from .routing import Hop, choose, match

if TYPE_CHECKING:
    from .core import BrokerCore, _Batch

log = logging.getLogger("raybroker")

DEFAULT_HOPS = 16  # a bundle forwarded this many times is dropped: a routing loop ends
CONVERSATION_NOT_FOUND = -8470
MESSAGE_REFUSED = -8460
RETRY_MIN_S, RETRY_MAX_S = 0.05, 5.0
BATCH_ROWS = 4096  # rows per call to a far broker; more make several calls, in flight together

# Bundle: [conversation_id, from_service, to_service, to_broker, from_broker, from_initiator,
#          contract, expires_at, hops_left, seqs, types, bodies, sent_ats]
Bundle = list[Any]
# Ack: [conversation_id, from_initiator, first_seq, last_seq, owner_broker_id, code, description]
Ack = list[Any]


@dataclass
class Outbound:
    """A batch for one list of next hops (tried in order: failover)."""

    hops: list[Hop]
    bundles: list[Bundle] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)  # transmission row ids in this batch
    endpoints: list[int] = field(default_factory=list)
    seqs: list[tuple[int, int]] = field(default_factory=list)  # each row's (endpoint, seq)

    def blob(self) -> bytes:
        return msgpack.packb(self.bundles, use_bin_type=True)


@dataclass
class Arrival:
    """What a broker did with bundles that reached it."""

    acks: list[Ack] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # why some bundles were not taken
    forwards: list[tuple[list[Hop], list[Bundle]]] = field(default_factory=list)


def backoff(attempts: int) -> float:
    return min(RETRY_MAX_S, RETRY_MIN_S * (2 ** min(attempts, 10)))


class Transport:
    """The transmission queue's dispatch and the far side's arrival, for one `BrokerCore`."""

    def __init__(self, core: BrokerCore) -> None:
        self.core = core
        self.inflight: set[int] = set()  # transmission rows being sent
        self.inflight_eps: set[int] = set()  # their endpoints: one batch per dialog at a time

    # --- sending side -----------------------------------------------------------------------------

    def dispatch(self, limit: int = 20_000) -> list[Outbound]:
        """Route what is due in the transmission queue: local deliveries happen now; the rest
        comes back as batches to send, grouped by their next hops."""
        core = self.core
        now = core.clock()
        rows = core.store.due_transmission(now, limit, self.inflight_eps)
        if not rows:
            return []
        by_ep: dict[int, list[tuple[Any, ...]]] = {}
        for r in rows:
            by_ep.setdefault(r[1], []).append(r)
        batches: dict[tuple[str, ...], Outbound] = {}
        full: list[Outbound] = []
        delays: list[tuple[str, float, int, int]] = []  # status, next attempt, attempts, row id
        local: list[int] = []
        for ep_no, ep_rows in by_ep.items():
            ep = core._eps.get(ep_no)
            if ep is None:
                local.append(ep_no)  # orphans: the endpoint is gone; dropped below
                continue
            if ep_rows[0][2] != core.store.oldest_seq(ep_no):
                continue  # older messages of this dialog are still backing off: keep the order
            m, hops = core.next_hops(ep, now)
            if hops and hops[0].rank == "local":
                local.append(ep_no)
                continue
            if not hops:
                why = (
                    m.describe()
                    if m.delayed
                    else (
                        f"no usable next hop for service {ep.far_service!r} ({m.describe()}); "
                        "waiting for a route"
                    )
                )
                delays += [(why, now + backoff(r[7]), r[7] + 1, r[0]) for r in ep_rows]
                continue
            key = tuple(h.address for h in hops)
            out = batches.get(key)
            if out is None or len(out.rows) >= BATCH_ROWS:  # several calls in flight: pipelined
                if out is not None:
                    full.append(out)
                out = batches[key] = Outbound(hops)
            out.bundles.append(self._bundle(ep, ep_rows))
            out.rows += [r[0] for r in ep_rows]
            out.seqs += [(ep_no, r[2]) for r in ep_rows]
            out.endpoints.append(ep_no)
        if delays or local:
            try:
                core._run(lambda b: self._settle_dispatch(b, delays, local))
            except Exception:
                log.exception(
                    "%s: routing waiting dialogs failed; retrying them one by one", core.name
                )
                for ep_no in local:  # one failing dialog must not stop the rest
                    try:
                        core._run(lambda b, n=ep_no: self._settle_dispatch(b, [], [n]))
                    except Exception:
                        log.exception(
                            "%s: dialog endpoint %d could not be delivered here", core.name, ep_no
                        )
                core._run(lambda b: self._settle_dispatch(b, delays, []))
        outs = [*full, *batches.values()]
        for out in outs:
            self.inflight.update(out.rows)
            self.inflight_eps.update(out.endpoints)
        return outs

    def _bundle(self, ep: Any, rows: Sequence[tuple[Any, ...]]) -> Bundle:
        seqs, types, bodies, sent = [], [], [], []
        for _id, _ep, seq, mt, body, _svc, _bid, _att, at in rows:
            seqs.append(seq)
            types.append(mt)
            bodies.append(body)
            sent.append(at)
        core = self.core
        return [
            ep.conversation_id,
            ep.service,
            ep.far_service,
            ep.far_broker,
            core.broker_id,
            ep.is_initiator,
            ep.contract,
            ep.expires_at,
            DEFAULT_HOPS,
            seqs,
            types,
            bodies,
            sent,
        ]

    def _settle_dispatch(self, b: _Batch, delays: list, local_eps: list[int]) -> None:
        core = self.core
        if delays:
            core.store.delay_transmission(delays)
        for ep_no in local_eps:
            ep = core._eps.get(ep_no)
            if ep is None:
                core.store.delete_endpoint_transmission(ep_no)
            else:
                core._deliver_parked(b, ep)

    def acknowledged(self, out: Outbound, reply: bytes) -> None:
        """The far side answered a batch: drop what it acknowledged, pin the far broker id on the
        first acknowledgement, turn refusals into Error messages; the rest is retried."""
        acks, refused = msgpack.unpackb(reply, raw=False)
        core = self.core
        self.release(out)

        def fn(b: _Batch) -> None:
            done: list[tuple[int, int, int]] = []
            for conv, from_initiator, first, last, owner, code, description in acks:
                ep = core._convs.get((conv, from_initiator))
                if ep is None or ep.far_broker not in (None, owner):
                    continue  # another broker answering a dialog pinned elsewhere: ignored
                if ep.far_broker is None:
                    b.touch(ep)
                    ep.far_broker = owner  # from now on only this broker is targeted
                if code is not None:
                    core.store.delete_endpoint_transmission(ep.no)
                    if ep.state is not State.CLOSED:
                        core._enqueue_own(b, ep, "Error", error_body(code, description))
                    continue
                done.append((ep.no, first, last))
            core.store.delete_acknowledged(done)
            covered: dict[int, list[tuple[int, int]]] = {}
            for ep_no, first, last in done:
                covered.setdefault(ep_no, []).append((first, last))
            unacknowledged = [
                row
                for row, (ep_no, seq) in zip(out.rows, out.seqs, strict=True)
                if not any(f <= seq <= la for f, la in covered.get(ep_no, ()))
            ]
            if unacknowledged:  # refused or out of sequence: counted as an attempt, backed off
                why = "; ".join(refused) or "sent, not acknowledged yet"
                core.store.fail_transmission(
                    unacknowledged, f"{out.hops[0].address}: {why}", core.clock()
                )
            acked = {core._convs[(a[0], a[1])].no for a in acks if (a[0], a[1]) in core._convs}
            for no in core._refresh_parked(b, acked):
                ep = core._eps[no]
                # an EndDialog the far side has acknowledged closes this side (it already ended)
                if ep.state is State.DISCONNECTED_OUTBOUND:
                    core._close(b, ep)

        core._run(fn)

    def failed(self, out: Outbound, why: str) -> None:
        """No hop took the batch: keep every message, retry later with backoff."""
        self.release(out)
        core = self.core
        core._run(lambda b: core.store.fail_transmission(out.rows, why, core.clock()))

    def release(self, out: Outbound) -> None:
        """Forget that a batch is in flight (its rows stay queued)."""
        self.inflight.difference_update(out.rows)
        self.inflight_eps.difference_update(out.endpoints)

    @property
    def pending(self) -> bool:
        """Whether anything waits in the transmission queue."""
        return bool(self.core._parked)

    # --- receiving side ------------------------------------------------------------------------

    def arrive(self, blob: bytes) -> Arrival:
        """Bundles reached this broker: deliver what is for a local service, in sequence; route
        the rest onward when forwarding is on; say why anything was not taken."""
        core = self.core
        now = core.clock()
        arrival = Arrival()
        local: list[Bundle] = []
        onward: dict[tuple[str, ...], tuple[list[Hop], list[Bundle]]] = {}
        for bundle in msgpack.unpackb(blob, raw=False):
            conv, _fs, to_service, to_broker, _from_broker, _fi, _c, _exp, hops_left = bundle[:9]
            if hops_left <= 0:
                core.record_event(
                    "HopLimit",
                    to_service,
                    f"conversation {conv}: dropped after {DEFAULT_HOPS} hops; a "
                    "routing loop? check the forwarding routes",
                )
                arrival.refused.append(f"hop limit reached at {core.name}")
                continue
            if to_broker not in (None, core.broker_id) and not core.forwarding:
                arrival.refused.append(
                    f"{core.name} is broker {core.broker_id}, not {to_broker}; dropped"
                )
                continue
            m = match(
                core.routes["instance"],
                to_service,
                to_broker,
                conv,
                now,
                local_broker_id=core.broker_id,
            )
            here = to_broker in (None, core.broker_id) and to_service in core.catalog.services
            hops = [] if m.delayed else choose(m, service_is_local=here)
            if hops and hops[0].rank == "local":
                local.append(bundle)
                continue
            hops = [h for h in hops if h.broker and h.broker != core.name]
            if core.forwarding and hops:
                bundle[8] = hops_left - 1
                key = tuple(h.address for h in hops)
                onward.setdefault(key, (hops, []))[1].append(bundle)
                continue
            arrival.refused.append(
                f"{core.name} has no way to {to_service!r}: {m.describe()}"
                + ("" if core.forwarding else " (forwarding is off)")
            )
        if local:
            try:
                arrival.acks = core._run(lambda b: [a for bd in local for a in self._take(b, bd)])
            except Exception:
                # one bad dialog must not hold back the others: take them one by one
                log.exception(
                    "%s: a batch of arrivals failed; taking dialogs one by one", core.name
                )
                for bundle in local:
                    try:
                        arrival.acks += core._run(lambda b, bd=bundle: self._take(b, bd))
                    except Exception as exc:
                        arrival.refused.append(
                            f"{core.name} could not take conversation {bundle[0]}: {exc}"
                        )
        arrival.forwards = list(onward.values())
        return arrival

    def _take(self, b: _Batch, bundle: Bundle) -> list[Ack]:
        core = self.core
        (
            conv,
            from_service,
            to_service,
            _to_broker,
            from_broker,
            from_initiator,
            contract,
            expires_at,
            _hops,
            seqs,
            types,
            bodies,
            _sent,
        ) = bundle

        def nack(code: int, description: str) -> list[Ack]:
            return [self._nack(conv, from_initiator, seqs, code, description)]

        ep = core._convs.get((conv, not from_initiator))
        if ep is None:
            if not from_initiator:
                return nack(
                    CONVERSATION_NOT_FOUND, f"conversation {conv} has no endpoint on {core.name}"
                )
            if seqs[0] != 0:
                # bundles start at the oldest unacknowledged message, so the endpoint was here
                # (it acknowledged the earlier ones) and has been cleaned up since
                return nack(
                    CONVERSATION_NOT_FOUND, f"conversation {conv} no longer exists on {core.name}"
                )
            svc = core.catalog.services[to_service]
            if contract not in svc.contracts or contract not in core.catalog.contracts:
                return nack(
                    CONTRACT_NOT_ACCEPTED,
                    f"service {to_service!r} on {core.name} does not accept contract {contract!r}",
                )
            ep = core.new_target(b, conv, svc, from_service, contract, expires_at, from_broker)
        if ep.far_broker not in (None, from_broker):
            # seed 002's "multiple target endpoints": a second broker answers a dialog that is
            # bound to another; refuse it so that broker's side of the dialog errors
            return nack(
                CONVERSATION_NOT_FOUND,
                f"conversation {conv} is bound to broker "
                f"{ep.far_broker}, not {from_broker}; give the routes broker instance ids",
            )
        if ep.far_broker is None:
            b.touch(ep)
            ep.far_broker = from_broker
        expected = ep.recv_seq
        start = next((i for i, s in enumerate(seqs) if s >= expected), len(seqs))
        acks = []
        if start:  # duplicates: already delivered; acknowledge them again
            acks.append([conv, from_initiator, seqs[0], seqs[start - 1], core.broker_id, None, ""])
        i = start
        while i < len(seqs) and seqs[i] == ep.recv_seq:
            j = i
            while j + 1 < len(seqs) and types[j + 1] == types[i] and seqs[j + 1] == seqs[j] + 1:
                j += 1
            refusal = self._refusal(ep, types[i], bodies[i : j + 1])
            if refusal is not None:
                if ep.state is not State.CLOSED:
                    core._enqueue_own(b, ep, "Error", error_body(MESSAGE_REFUSED, refusal))
                acks.append(self._nack(conv, from_initiator, seqs[i:], MESSAGE_REFUSED, refusal))
                return acks
            core._deliver(b, ep, types[i], bodies[i : j + 1], seqs[i])
            acks.append([conv, from_initiator, seqs[i], seqs[j], core.broker_id, None, ""])
            i = j + 1
        return acks  # anything after a gap waits for the resend

    def _refusal(self, ep: Any, mt: str, bodies: Sequence[bytes]) -> str | None:
        """Why arriving messages may not be delivered (validation happens on arrival), or None."""
        if mt in SYSTEM_TYPES:
            return None
        catalog = self.core.catalog
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

    def _nack(
        self, conv: str, from_initiator: bool, seqs: Sequence[int], code: int, description: str
    ) -> Ack:
        return [conv, from_initiator, seqs[0], seqs[-1], self.core.broker_id, code, description]


def refuses_all(reply: bytes) -> bool:
    """Whether a far broker's answer acknowledges nothing and says why (a hop that cannot help:
    the sender tries the next path)."""
    acks, refused = msgpack.unpackb(reply, raw=False)
    return not acks and bool(refused)


def pack_arrival(arrival: Arrival) -> bytes:
    return msgpack.packb([arrival.acks, arrival.refused], use_bin_type=True)


def merge_replies(replies: Sequence[bytes]) -> bytes:
    acks: list[Ack] = []
    refused: list[str] = []
    for reply in replies:
        a, r = msgpack.unpackb(reply, raw=False)
        acks += a
        refused += r
    return msgpack.packb([acks, refused], use_bin_type=True)
