"""Delivery: how messages move from one endpoint to the other on this broker, or into the
transmission queue when the far side is elsewhere (or not reachable yet).

`transmit` is the one path a message takes out of an endpoint; `deliver` the one path into one;
`post_error` the one way the broker puts an Error on an endpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import groupby

from actors.core.changes import Arrived, Changes, Removed
from actors.core.readcache import ROW_OVERHEAD
from actors.core.work import Part, UnitOfWork
from actors.errors import ContractViolation
from actors.ids import new_uuid
from actors.model.catalog import (
    ECHO,
    ECHO_CONTRACT,
    ERROR,
    ROUTER_HANDLER,
    SYSTEM_TYPES,
    Queue,
    Service,
)
from actors.model.dialogs import (
    CLOSED,
    CONTRACT_NOT_ACCEPTED,
    CONVERSATION_CLEANED_UP,
    CONVERSING,
    Endpoint,
    after_send,
    error_body,
    on_arrival,
)
from actors.model.hops import Hop, next_hops
from actors.model.routing import Match
from actors.packing import made
from actors.store import audit


class Delivery(Part):
    def __init__(self, uow: UnitOfWork) -> None:
        super().__init__(uow)
        # A router replica's first message of a new inbound dialog: (unit, endpoint, message
        # type, first body) -> the outbound dialog it began (relaying `ep`) to send the
        # messages on, or None to queue them for the router's handler
        # (`Conversations.route_first`).
        self.route_first: Callable[[Changes, Endpoint, str, bytes], Endpoint | None] | None = None

    # --- routing decisions ---------------------------------------------------------------------

    def next_hops(self, ep: Endpoint, now: float) -> tuple[Match, list[Hop]]:
        """Where the broker's own routes send `ep`'s messages: the match and its next hops."""
        st = self.state
        return next_hops(
            st.routes["routes"],
            ep.far_service,
            ep.far_broker,
            ep.conversation_id,
            now,
            local_broker_id=st.broker_id,
            local_name=st.name,
            service_is_local=st.serves_here(ep),
        )

    def routes_here(self, ep: Endpoint, now: float) -> bool:
        """Whether the broker's own routes deliver `ep`'s dialog on this broker (LOCAL first)."""
        hops = self.next_hops(ep, now)[1]
        return bool(hops) and hops[0].rank == "local"

    # --- out of an endpoint ----------------------------------------------------------------------

    def transmit(self, w: Changes, ep: Endpoint, mt: str, bodies: Sequence[bytes]) -> None:
        """Send a run of messages from `ep` to its far side (the checks are the caller's)."""
        st = self.state
        w.touch(ep)
        first_seq = ep.send_seq
        ep.send_seq += len(bodies)
        after_send(ep)
        far = st.far(ep)
        if (
            far is None
            and ep.no not in st.parked
            and ep.is_initiator
            and first_seq == 0
            and self.routes_here(ep, w.now)
        ):
            far = self.create_target(w, ep)
        if ep.no in st.parked or (far is None and ep.far_broker != st.broker_id):
            # not here (yet), or earlier messages still on their way (a route that leads back
            # here through a forwarder): the transmission queue routes it, in order
            self.park(w, ep, mt, bodies, first_seq)
        elif far is None:
            self.far_gone(w, ep)  # the far endpoint was cleaned up
        else:
            self.deliver(w, far, mt, bodies, first_seq)

    def far_gone(self, w: Changes, ep: Endpoint) -> None:
        """Tell this side its far endpoint no longer exists, as the far broker would."""
        self.post_error(
            w, ep, CONVERSATION_CLEANED_UP, "the far endpoint of this conversation no longer exists"
        )

    def create_target(self, w: Changes, ep: Endpoint) -> Endpoint | None:
        """The target endpoint of a dialog begun here for a service here, on its first message."""
        st = self.state
        svc = st.catalog.services.get(ep.far_service)
        if svc is None or ep.far_broker not in (None, st.broker_id):
            return None
        if ep.contract not in svc.contracts:
            raise ContractViolation(
                f"service {svc.name!r} does not accept contract {ep.contract!r} (its contracts "
                f"changed after the dialog began); end conversation {ep.handle}"
            )
        w.touch(ep)
        ep.far_broker = st.broker_id  # pinned: the far endpoint lives here
        return self.new_target(
            w, ep.conversation_id, svc, ep.service, ep.contract, ep.expires_at, st.broker_id
        )

    def new_target(
        self,
        w: Changes,
        conversation_id: str,
        svc: Service,
        far_service: str,
        contract: str,
        expires_at: float | None,
        far_broker: str,
    ) -> Endpoint:
        """The target endpoint a dialog's first message creates, in a group of its own."""
        st = self.state
        return st.new_endpoint(
            w,
            handle=new_uuid(),
            conversation_id=conversation_id,
            is_initiator=False,
            service=svc.name,
            far_service=far_service,
            contract=contract,
            group_no=st.new_group(w, svc.queue),
            state=CONVERSING,
            expires_at=expires_at,
            far_broker=far_broker,
        )

    # --- the transmission queue ------------------------------------------------------------------

    def park(self, w: Changes, ep: Endpoint, mt: str, bodies: Sequence[bytes], seq: int) -> None:
        """Hold messages in the transmission queue until their target can be reached."""
        st = self.state
        here = st.serves_here(ep)
        status = (
            "waiting to be sent"
            if not here or not self.routes_here(ep, w.now)
            else f"waiting for service {ep.far_service!r}"
        )
        if not here and ep.far_service not in st.catalog.services:
            status = (
                f"target service {ep.far_service!r} is not on this broker; waiting to be routed "
                "(see its routes)"
            )
        w.transmission.append(
            (ep.no, seq, mt, bodies, ep.far_service, ep.far_broker, status, w.now)
        )
        st.park(w, ep.no)

    def unpark_service(self, w: Changes, service: str) -> None:
        """A service appeared (or changed): deliver what waited for it here, in order. Not a
        dialog whose messages are on their way to another broker: they may arrive there (its
        answer decides; the dispatcher delivers here what is still waiting after it)."""
        st = self.state
        for ep_no in self.store.waiting_endpoints(service):
            if ep_no in st.sending:
                continue
            ep = st.endpoints.get(ep_no)
            if ep is None:
                self.store.delete_endpoint_transmission(ep_no)
            elif self.routes_here(ep, w.now):
                self.deliver_parked(w, ep)

    def deliver_parked(self, w: Changes, ep: Endpoint) -> None:
        """Deliver an endpoint's waiting transmission rows to its far side on this broker."""
        st = self.state
        rows = self.store.endpoint_transmission(ep.no)
        st.unpark(w, ep.no)
        self.store.delete_endpoint_transmission(ep.no)
        far = st.far(ep)
        if far is None and (not rows or rows[0].first_seq != 0 or not ep.is_initiator):
            # the far endpoint was here and is gone (cleaned up): never start it mid-dialog
            self.far_gone(w, ep)
            return
        if far is None:
            svc = st.catalog.services.get(ep.far_service)
            if svc is None or ep.contract not in svc.contracts:
                self.post_error(
                    w,
                    ep,
                    CONTRACT_NOT_ACCEPTED,
                    f"service {ep.far_service!r} does not accept contract {ep.contract!r}",
                )
                return
            far = self.create_target(w, ep)
        for row in rows:
            start = 0
            for mt, same in groupby(row.types):  # a run of one type is one delivery
                n = len(list(same))
                self.deliver(w, far, mt, row.bodies[start : start + n], row.first_seq + start)
                start += n

    def refresh_parked(self, w: Changes, ep_nos: Iterable[int]) -> list[int]:
        """Endpoints whose transmission rows are all gone stop being parked (after commit);
        returns them."""
        nos = set(ep_nos)
        done = list(nos - self.store.with_transmission(nos))
        w.after.append(lambda: self.state.parked.difference_update(done))
        return done

    def far_exists(self, ep: Endpoint, far: Endpoint | None) -> bool:
        """Whether this dialog has a far endpoint to tell: here, still on its way (messages in
        the transmission queue), or on a broker that has answered (its id is pinned)."""
        st = self.state
        return far is not None or ep.no in st.parked or ep.far_broker not in (None, st.broker_id)

    # --- into an endpoint ------------------------------------------------------------------------

    def deliver(
        self,
        w: Changes,
        far: Endpoint,
        mt: str,
        bodies: Sequence[bytes],
        first_seq: int,
        sent_at: float | None = None,
    ) -> None:
        """Messages arrive at endpoint `far` (on this broker), in sequence; `sent_at`: when the
        first of them was sent, on another broker (else now)."""
        w.touch(far)
        if first_seq < far.recv_seq:
            return  # a resend of what already arrived: dropped (delivered once)
        far.recv_seq = first_seq + len(bodies)
        if far.state is CLOSED:
            return
        echo_target = _echo_target(far)
        if echo_target and mt == ECHO:
            self.transmit(w, far, ECHO, bodies)
            return
        on_arrival(far, mt)
        if far.state is CLOSED:
            self.close(w, far)  # both sides have now ended: schedule its purge
        if echo_target and far.state is not CONVERSING:
            # The broker answers Echo dialogs itself, so it also ends them itself.
            self.close(w, far)
            return
        if far.onward is not None and self.pass_through(w, far, mt, bodies, first_seq, sent_at):
            return
        if first_seq == 0 and self.route_first is not None and self._router_idle(w, far, mt):
            onward = self.route_first(w, far, mt, bodies[0])
            if onward is not None:
                self._passed(w, far, onward, mt, bodies, first_seq, sent_at)
                return
        self.enqueue(w, far, mt, bodies, first_seq, sent_at)

    def pass_through(
        self,
        w: Changes,
        ep: Endpoint,
        mt: str,
        bodies: Sequence[bytes],
        first_seq: int,
        sent_at: float | None,
    ) -> bool:
        """Send data messages arriving on a relaying endpoint straight on the dialog it relays
        (`Begin.relays`), as the group's handler would send them, when that would change
        nothing: nothing of the group waits or is held by a reader (so no message of either
        dialog could be sent before these), both dialogs are open, and the queue is enabled and
        keeps nothing. Recorded in the audit as received and committed here. False: they take
        the queue."""
        onward = self.state.endpoints.get(ep.onward)
        if onward is None or not onward.open or onward.group_no != ep.group_no:
            return False
        if self._idle_queue(w, ep, mt) is None:
            return False
        self._passed(w, ep, onward, mt, bodies, first_seq, sent_at)
        return True

    def _idle_queue(self, w: Changes, ep: Endpoint, mt: str) -> Queue | None:
        """The queue of `ep`'s group if a data message `mt` arriving on it may be sent on at
        once, as a reader of the group would send it (None: it takes the queue): the dialog
        is open, nothing of the group waits or is held by a reader (so nothing could be sent
        before it), and the queue is enabled and keeps nothing."""
        st = self.state
        g = ep.group_no
        if mt in SYSTEM_TYPES or ep.state is not CONVERSING or st.locks.is_locked(g):
            return None
        queue = st.catalog.queue(st.groups[g].queue)
        if (
            not queue.enabled
            or queue.retention
            or st.queue_index(queue.name).pending.get(g)
            or g in w.queued_groups()  # queued earlier in this unit
        ):
            return None
        return queue

    def _router_idle(self, w: Changes, ep: Endpoint, mt: str) -> bool:
        """Whether the first message `mt` of dialog `ep` arrives at an idle group of a router
        replica's queue (its activation runs the router's handler), with no state yet (no
        mapping of the group's: a new inbound dialog)."""
        if ep.is_initiator:
            return False
        st = self.state
        group = st.groups[ep.group_no]
        act = st.catalog.queue(group.queue).activation  # first: most queues route nothing
        if act is None or not act.enabled or act.handler != ROUTER_HANDLER or group.stateful:
            return False
        return self._idle_queue(w, ep, mt) is not None

    def _passed(
        self,
        w: Changes,
        ep: Endpoint,
        onward: Endpoint,
        mt: str,
        bodies: Sequence[bytes],
        first_seq: int,
        sent_at: float | None,
    ) -> None:
        """Messages arriving on `ep` sent along `onward` in the same unit: recorded in the audit
        as received and committed here."""
        st = self.state
        n, now = len(bodies), w.now
        sent = now if sent_at is None else sent_at
        queue = st.groups[ep.group_no].queue
        w.audit.append(audit.encode_run(st.broker_id, queue, now, ep, mt, first_seq, n, sent))
        self.transmit(w, onward, mt, bodies)
        w.sent += n
        w.passed += n

    def enqueue(
        self,
        w: Changes,
        ep: Endpoint,
        mt: str,
        bodies: Sequence[bytes],
        first_seq: int,
        sent_at: float | None = None,
    ) -> None:
        n = len(bodies)
        first_id = self.state.message_ids(n)
        now, g = w.now, ep.group_no
        sent = now if sent_at is None else sent_at
        at = len(w.messages)
        # one run (actors.store.segments): no object per message
        w.messages.append((first_id, g, ep.no, first_seq, mt, bodies, 0, sent, now))
        nbytes = sum(map(len, bodies)) + ROW_OVERHEAD * n
        queue = self.state.groups[g].queue
        w.arrivals.append(made(Arrived, (queue, g, first_id, n, at, nbytes)))

    def enqueue_own(self, w: Changes, ep: Endpoint, mt: str, body: bytes) -> None:
        """A message the broker itself puts on this endpoint's queue (a timer, say)."""
        w.touch(ep)
        self.enqueue(w, ep, mt, [body], -1)

    def post_error(self, w: Changes, ep: Endpoint, code: int, description: str) -> None:
        """Put an Error on this endpoint's queue, as if its far side sent it. A closed endpoint
        has nobody to read it: nothing happens."""
        if ep.state is CLOSED:
            return
        w.touch(ep)
        on_arrival(ep, ERROR)
        if ep.state is CLOSED:
            self.close(w, ep)
        self.enqueue(w, ep, ERROR, [error_body(code, description)], -1)

    def close(self, w: Changes, ep: Endpoint) -> None:
        w.touch(ep)
        ep.state = CLOSED
        ep.closed_at = w.now
        ep.timer_at = None

    def remove_messages(self, w: Changes, ep: Endpoint) -> None:
        """Remove every message waiting on one endpoint (it ended), this unit's too."""
        st = self.state
        w.take_back(ep.no)
        st.cache.drop(ep.group_no)
        n = self.store.delete_conversation_messages(ep.group_no, ep.no)
        if n:
            w.removals.append(Removed(st.groups[ep.group_no].queue, ep.group_no, n, False))


def _echo_target(ep: Endpoint) -> bool:
    """Whether the broker itself answers this endpoint (a target on the Echo contract)."""
    return not ep.is_initiator and ep.contract == ECHO_CONTRACT
