"""The sending side: dispatching the transmission queue in batches per list of next hops, and
taking the far side's answer (acknowledgements, refusals, or nothing)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from actors.model.dialogs import Endpoint
from actors.model.hops import Hop
from actors.model.routing import Match
from actors.store.database import Store
from actors.store.transmission import Waiting
from actors.transport.port import BrokerPort, Work
from actors.transport.wire import Bundle, pack_bundles, unpack_reply

log = logging.getLogger("raybroker")


@dataclass
class Outbound:
    """A batch for one list of next hops (tried in order: failover)."""

    hops: list[Hop]
    bundles: list[Bundle] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)  # transmission row ids, bundle after bundle
    spans: list[tuple[int, int, int]] = field(default_factory=list)  # each row's (ep, first, last)
    endpoints: list[int] = field(default_factory=list)  # each bundle's endpoint
    messages: int = 0
    in_flight: bool = True  # until `Dispatcher.release`

    def unacknowledged(self, covered: dict[int, list[tuple[int, int]]]) -> list[int]:
        """The rows with messages no range in `covered` (endpoint -> acknowledged (first, last)
        ranges) holds (what is left of a row acknowledged in part)."""
        return [
            row
            for row, (ep_no, first, last) in zip(self.rows, self.spans, strict=True)
            if not _covers(covered.get(ep_no, ()), first, last)
        ]

    def on_edges(self, ranges: Iterable[tuple[int, int, int]]) -> set[tuple[int, int, int]]:
        """Those of `ranges` (endpoint, first, last) that begin where a row of this batch begins
        and end where one ends. A dialog has one batch in flight at a time and its rows never
        share a number, so no other row can straddle either end."""
        starts = {(ep_no, first) for ep_no, first, _ in self.spans}
        ends = {(ep_no, last) for ep_no, _, last in self.spans}
        return {r for r in ranges if (r[0], r[1]) in starts and (r[0], r[2]) in ends}

    @property
    def key(self) -> tuple[str, ...]:
        return hop_key(self.hops)

    def blob(self) -> bytes:
        return pack_bundles(self.bundles)


def hop_key(hops: Sequence[Hop]) -> tuple[str, ...]:
    """A list of next hops, by address: what batches and calls in flight are kept by."""
    return tuple(h.address for h in hops)


def _covers(ranges: Sequence[tuple[int, int]], first: int, last: int) -> bool:
    """Whether the ranges together hold every number from `first` to `last`."""
    at = first
    for f, la in sorted(ranges):
        if f > at:
            break
        at = max(at, la + 1)
    return at > last


class Dispatcher:
    """The transmission queue's dispatch, for one broker."""

    def __init__(self, port: BrokerPort, store: Store) -> None:
        self.port = port
        self.store = store
        self.inflight_eps = port.sending  # endpoints being sent: one batch per dialog at a time
        # calls in flight by list of next hops: while one is, what is due for those hops waits
        # for its answer and goes in the next call, unless a full batch is waiting (so a busy
        # broker sends fewer, larger calls: each costs both sides transactions and a round trip)
        self.calls: dict[tuple[str, ...], int] = {}
        # the dialogs left for such a call's answer: not read again until it comes
        self.held: dict[tuple[str, ...], set[int]] = {}

    @property
    def pending(self) -> bool:
        """Whether anything waits in the transmission queue."""
        return self.port.has_waiting()

    def dispatch(self) -> list[Outbound]:
        """Route what is due in the transmission queue: local deliveries happen now; the rest
        comes back as batches to send, grouped by their next hops."""
        port, store, limits = self.port, self.store, self.port.limits
        now = port.now()
        skip = self.inflight_eps.union(*self.held.values()) if self.held else self.inflight_eps
        rows = store.due_transmission(now, limits.dispatch_rows, skip)
        if not rows:
            return []
        by_ep: dict[int, list[Waiting]] = {}
        for r in rows:
            by_ep.setdefault(r.endpoint_no, []).append(r)
        batches: dict[tuple[str, ...], Outbound] = {}
        full: list[Outbound] = []
        delays: list[tuple[str, float, int, int]] = []  # status, next attempt, attempts, row id
        local: list[int] = []
        fresh: list[int] = []  # dialogs secured in this pass: their keys are stored first
        routed: list[tuple[int, list[Waiting], Endpoint, Match, list[Hop], tuple[str, ...]]] = []
        waiting: dict[tuple[str, ...], int] = {}  # messages due by list of next hops
        for ep_no, ep_rows in by_ep.items():
            if len(ep_rows) > 1:  # a row cut in two by an acknowledgement has its rest last
                ep_rows.sort(key=lambda r: r.first_seq)
            ep = port.endpoint(ep_no)
            if ep is None:
                local.append(ep_no)  # orphans: the endpoint is gone; dropped below
                continue
            m, hops = port.own_hops(ep, now)
            if hops and hops[0].rank == "local":
                local.append(ep_no)
                continue
            key = hop_key(hops)
            routed.append((ep_no, ep_rows, ep, m, hops, key))
            due = sum(r.last_seq - r.first_seq + 1 for r in ep_rows)
            waiting[key] = waiting.get(key, 0) + due
        for ep_no, ep_rows, ep, m, hops, key in routed:
            if hops:
                if self.calls.get(key) and waiting[key] < limits.batch_rows:
                    # goes with the next call, once the one in flight is answered
                    self.held.setdefault(key, set()).add(ep_no)
                    continue
            else:
                why = (
                    m.describe()
                    if m.delayed
                    else (
                        f"no usable next hop for service {ep.far_service!r} ({m.describe()}); "
                        "waiting for a route"
                    )
                )
                delays += [
                    (why, now + limits.backoff(r.attempts), r.attempts + 1, r.id) for r in ep_rows
                ]
                continue
            bundle = self._bundle(ep, ep_rows, now, fresh)
            if isinstance(bundle, str):  # dialog security is not ready for it: it waits
                delays += [
                    (bundle, now + limits.backoff(r.attempts), r.attempts + 1, r.id)
                    for r in ep_rows
                ]
                continue
            out = batches.get(key)
            if out is None or out.messages >= limits.batch_rows:  # several calls in flight
                if out is not None:
                    full.append(out)
                out = batches[key] = Outbound(hops)
            out.bundles.append(bundle)
            out.rows += [r.id for r in ep_rows]
            out.spans += [(ep_no, r.first_seq, r.last_seq) for r in ep_rows]
            out.endpoints.append(ep_no)
            out.messages += len(bundle.seqs)
        # the fresh keys are stored first: a transaction may let the broker's working set go
        # back to its bound, and a dialog evicted keeps only the key its store has
        kept = not fresh or self._keep_sessions(fresh)
        if delays or local:
            self._route_here(delays, local)
        if not kept:
            return []  # nothing sealed with a key that is not stored goes; all is retried
        outs = [*full, *batches.values()]
        for out in outs:
            self.inflight_eps.update(out.endpoints)
            key = out.key
            self.calls[key] = self.calls.get(key, 0) + 1
        return outs

    def _route_here(self, delays: list[tuple[str, float, int, int]], local: list[int]) -> None:
        """Deliver what turned out to be for this broker; note why the rest waits."""
        port = self.port
        try:
            port.transaction(lambda w: self._settle_dispatch(w, delays, local))
        except Exception:
            log.exception("%s: routing waiting dialogs failed; retrying one by one", port.name)
            for ep_no in local:  # one failing dialog must not stop the rest
                try:
                    port.transaction(lambda w, n=ep_no: self._settle_dispatch(w, [], [n]))
                except Exception:
                    log.exception("%s: dialog endpoint %d could not be delivered", port.name, ep_no)
            port.transaction(lambda w: self._settle_dispatch(w, delays, []))

    def _keep_sessions(self, fresh: list[int]) -> bool:
        """Store the session keys of dialogs secured in this dispatch, before any of their
        messages leaves (a resend after a restart must be sealed with the same key)."""
        port = self.port
        try:
            port.transaction(lambda w: port.keep_sessions(w, fresh))
        except Exception:
            log.exception("%s: storing the session keys of %d dialogs failed; retrying",
                          port.name, len(fresh))  # fmt: skip
            for no in fresh:
                port.forget_session(no)
            return False
        return True

    def _bundle(
        self, ep: Endpoint, rows: Sequence[Waiting], now: float, fresh: list[int]
    ) -> Bundle | str:
        """The dialog's waiting messages as one bundle, sealed if the dialog is secured; or
        why they wait (dialog security is not ready for them)."""
        port = self.port
        secured = port.outbound_security(ep, now)
        if isinstance(secured, str):
            return secured
        if len(rows) == 1:  # the usual case: one row per dialog
            seqs, types, bodies = list(rows[0].seqs), rows[0].types, rows[0].bodies
            sent = [rows[0].enqueued_at] * len(seqs)
        else:
            seqs, types, bodies, sent = [], [], [], []
            for r in rows:
                seqs += r.seqs
                types += r.types
                bodies += r.bodies
                sent += [r.enqueued_at] * len(r.bodies)
        security = None
        if secured is not None:
            session, new = secured
            offer = None
            if ep.is_initiator and seqs[0] == 0:  # the key offer rides with message 0
                offer = port.key_offer(ep, now)
                if isinstance(offer, str):
                    if new:
                        port.forget_session(ep.no)
                    return offer
            if new:
                fresh.append(ep.no)
            security = [offer, session.seal(ep.is_initiator, seqs, types, bodies)]
            bodies = [b""] * len(seqs)  # they travel sealed, in `security`
        return Bundle(
            ep.conversation_id,
            ep.service,
            ep.far_service,
            ep.far_broker,
            self.port.broker_id,
            ep.is_initiator,
            ep.contract,
            ep.expires_at,
            self.port.limits.hop_limit,
            seqs,
            types,
            bodies,
            sent,
            security,
        )

    def _settle_dispatch(self, w: Work, delays: list, local_eps: list[int]) -> None:
        if delays:
            self.store.delay_transmission(delays)
        for ep_no in local_eps:
            self.port.deliver_waiting(w, ep_no)

    def acknowledged(self, out: Outbound, reply: bytes, via: str | None = None) -> None:
        """The far side answered a batch (through next hop `via`, the first one if not said):
        drop what it acknowledged, pin the far broker id on the first acknowledgement, turn
        refusals into Error messages; the rest is retried."""
        answer = unpack_reply(reply)
        port, store = self.port, self.store
        self.release(out)

        def fn(w: Work) -> None:
            done: list[tuple[int, int, int]] = []
            acked: set[int] = set()
            for a in answer.acks:
                ep = port.endpoint_of(a.conversation_id, a.from_initiator)
                if ep is None:
                    continue
                acked.add(ep.no)
                if ep.far_broker not in (None, a.owner):
                    continue  # another broker answering a dialog pinned elsewhere: ignored
                if ep.far_broker is None:
                    port.pin(w, ep, a.owner)  # from now on only this broker is targeted
                if a.code is not None:
                    store.delete_endpoint_transmission(ep.no)
                    port.post_error(w, ep, a.code, a.description)
                    continue
                done.append((ep.no, a.first_seq, a.last_seq))
            store.delete_acknowledged(done, out.on_edges(done))
            covered: dict[int, list[tuple[int, int]]] = {}
            for ep_no, first, last in done:
                covered.setdefault(ep_no, []).append((first, last))
            unacknowledged = out.unacknowledged(covered)
            if unacknowledged:  # refused or out of sequence: counted as an attempt, backed off
                why = "; ".join(answer.refused) or "sent, not acknowledged yet"
                self._fail(unacknowledged, f"{via or out.hops[0].address}: {why}")
            port.acknowledged(w, acked)

        port.transaction(fn)

    def failed(self, out: Outbound, why: str) -> None:
        """No hop took the batch: keep every message, retry later with backoff."""
        self.release(out)
        self.port.transaction(lambda w: self._fail(out.rows, why))

    def _fail(self, rows: Sequence[int], why: str) -> None:
        limits = self.port.limits
        self.store.fail_transmission(
            rows, why, self.port.now(), limits.retry_min_s, limits.retry_max_s
        )

    def release(self, out: Outbound) -> None:
        """Forget that a batch is in flight (its rows stay queued). Once per batch."""
        if not out.in_flight:
            return
        out.in_flight = False
        self.inflight_eps.difference_update(out.endpoints)
        self.held.pop(out.key, None)
        left = self.calls.pop(out.key, 1) - 1
        if left:
            self.calls[out.key] = left
