"""Conversation verbs: BEGIN DIALOG, SEND, END CONVERSATION and BEGIN CONVERSATION TIMER,
applied in order inside one unit of work (a batch, or a commit's operations)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from actors.calls.envelope import Begin, End, Op, Send, Timer, check_call_size
from actors.core.changes import Changes
from actors.core.delivery import Delivery
from actors.core.work import Part, UnitOfWork
from actors.ddr import router
from actors.errors import (
    BodyTooLarge,
    BrokerError,
    ContractViolation,
    ConversationEnded,
    ConversationNotFound,
    GroupLocked,
    InvalidArgument,
    SecurityError,
)
from actors.ids import new_uuid
from actors.model import checks
from actors.model.catalog import SYSTEM_TYPES, check_name
from actors.model.dialogs import (
    CLOSED,
    DISCONNECTED_OUTBOUND,
    Endpoint,
    check_send,
    plan_end,
)
from actors.model.routing import balance


class Conversations(Part):
    def __init__(self, uow: UnitOfWork, delivery: Delivery) -> None:
        super().__init__(uow)
        self.delivery = delivery
        # while a call's operations are applied: they, and the ended dialogs begun if absent
        # that its handles name (handle -> what the store remembers, or None), once asked
        self._ops: Sequence[Op] = ()
        self._ended: dict[str, tuple[str, str, str, str, int] | None] | None = None

    def apply_ops(self, w: Changes, ops: Sequence[Op], held: frozenset[int]) -> dict[str, Any]:
        """Apply operations in order; `held`: the groups the caller holds locked (a commit)."""
        check_call_size(ops, self.state.limits.max_call_bytes)  # before any op: nothing changes
        handles: list[str] = []
        sent = 0
        self._ops, self._ended = ops, None
        try:
            for op in ops:
                if isinstance(op, Send):
                    sent += self.send(w, op)
                elif isinstance(op, Begin):
                    handles.append(self.begin(w, op))
                elif isinstance(op, End):
                    self.end(w, op, held)
                elif isinstance(op, Timer):
                    self.timer(w, op)
                else:
                    raise InvalidArgument(
                        f"{op!r} is not an operation; use Begin, Send, End or Timer"
                    )
        finally:
            self._ops, self._ended = (), None
        w.sent += sent  # counted once the unit commits
        return {"handles": handles, "sent": sent}

    def _ended_rerun(self, handle: str) -> tuple[str, str, str, str, int] | None:
        """(conversation_id, service, far_service, contract, send_seq) of the ended dialog begun
        if absent on `handle`, if the store remembers one. The first time a call asks, one query
        answers for every Begin ... if absent of the call whose handle is not live (an ingest's
        first run begins thousands, none remembered)."""
        known = self._ended
        if known is None:
            live = self.state.endpoints
            asked = {
                op.handle
                for op in self._ops
                if isinstance(op, Begin)
                and op.if_absent
                and isinstance(op.handle, str)
                and live.by_handle(op.handle) is None
            }
            asked.add(handle)
            found = self.store.ended_reruns(list(asked))
            known = self._ended = {h: found.get(h) for h in asked}
        elif handle not in known:
            known[handle] = self.store.ended_reruns([handle]).get(handle)
        return known[handle]

    def begin(self, w: Changes, op: Begin) -> str:
        st = self.state
        svc = st.catalog.service(op.from_service)
        contract = st.catalog.contract(op.contract)
        check_name("service", op.to_service)
        if op.if_absent:
            live = st.endpoints.by_handle(op.handle)
            if live is not None:
                return self._begun(op, live.is_initiator, *live.identity(), ended=False)
            ended = self._ended_rerun(op.handle) if isinstance(op.handle, str) else None
            if ended is not None:  # a re-run after the dialog ended and went: not again
                return self._begun(op, True, *ended[:4], ended=True)
        if not isinstance(op.handle, str) or not op.handle or st.endpoints.by_handle(op.handle):
            raise InvalidArgument(f"conversation handle {op.handle!r} is empty or already in use")
        lifetime = checks.seconds("dialog lifetime", op.lifetime, none=True)
        far_broker = op.to_broker  # an explicit to_broker is never overridden
        if far_broker is None:
            # step 3 would pick among several brokers: pin one round-robin now, as to_broker
            # would, so every message of the dialog goes there, before and after the first ack
            turn = st.turns.get(op.to_service, 0)
            far_broker = balance(st.routes["routes"], op.to_service, w.now, turn)
            if far_broker is not None:
                st.take_turn(w, op.to_service)
        local_target = st.catalog.services.get(op.to_service)
        if (
            local_target is not None
            and far_broker in (None, st.broker_id)
            and contract.name not in local_target.contracts
        ):
            raise ContractViolation(
                f"service {op.to_service!r} does not accept contract {contract.name!r}; add it "
                f"to the service's contracts or begin the dialog with one of "
                f"{list(local_target.contracts)}"
            )
        if op.encryption and (local_target is None or far_broker not in (None, st.broker_id)):
            why = st.keyring.refusal(op.from_service, op.to_service, far_broker, w.now)
            if why is not None:  # no wait would help: refused now, nothing begun
                raise SecurityError(
                    f"BEGIN DIALOG {op.handle} from {op.from_service!r} to {op.to_service!r} "
                    f"with encryption on is refused: {why}"
                )
        if op.related_conversation is not None:
            group_no = st.endpoint(op.related_conversation).group_no
        elif op.related_group is not None:
            if not isinstance(op.related_group, str) or not op.related_group:
                raise InvalidArgument("related_group must be a conversation group id string")
            group_no = st.groups.by_id(op.related_group) or st.new_group(
                w, svc.queue, op.related_group
            )
        else:
            group_no = st.new_group(w, svc.queue)
        group = st.groups[group_no]
        if group.queue != svc.queue:
            raise InvalidArgument(
                f"conversation group {group.group_id} belongs to queue {group.queue!r}, but "
                f"service {svc.name!r} uses queue {svc.queue!r}; a group holds dialogs of one "
                "queue"
            )
        conversation_id = op.conversation_id or new_uuid()
        if op.conversation_id and st.endpoints.by_conversation(conversation_id, True):
            raise InvalidArgument(
                f"conversation id {conversation_id!r} is already a dialog on this broker; "
                "choose another (or leave it out for a fresh one)"
            )
        relayed = None if op.relays is None else self._relayed(op, group_no, contract.name)
        ep = st.new_endpoint(
            w,
            handle=op.handle,
            conversation_id=conversation_id,
            is_initiator=True,
            service=svc.name,
            far_service=op.to_service,
            contract=contract.name,
            group_no=group_no,
            expires_at=None if lifetime is None else w.now + lifetime,
            far_broker=far_broker,
            rerunnable=op.if_absent,
            encryption=op.encryption,
        )
        if relayed is not None:
            w.touch(relayed).onward, ep.onward = ep.no, relayed.no
        return op.handle

    def route_first(self, w: Changes, ep: Endpoint, mt: str, body: bytes) -> Endpoint | None:
        """The first message of a new inbound dialog `ep` on a router replica's idle group
        (`Delivery._router_idle`), classified as it arrives: the outbound dialog begun to the
        target, relaying `ep`, and the mapping written as the group's state, as the router's
        handler would a turn later (actors.ddr.router). None: the handler decides (redirect
        mode, a classifier that fails, or a Begin that is refused: its error path says why)."""
        st = self.state
        group = st.groups[ep.group_no]
        act = st.catalog.queue(group.queue).activation
        assert act is not None  # checked by the caller
        try:
            routed = router.routed_at_arrival(act.options, body, mt)
        except Exception:  # options an ALTER made unusable: the handler fails on them, visibly
            return None
        if routed is None:
            return None
        cfg, target = routed
        undone = len(w.undo)
        try:
            op = Begin(
                cfg.service,
                target,
                ep.contract,
                related_group=group.group_id,
                encryption=cfg.encryption,
                relays=ep.handle,
            )
            self.begin(w, op)
        except BrokerError:  # refused before it made anything; what it counted is taken back
            for undo in reversed(w.undo[undone:]):
                undo()
            del w.undo[undone:]
            return None
        pairs = {ep.handle: router.new_pair(ep.handle, op.handle, target, w.now)}
        w.states = [*(w.states or ()), (json.dumps(pairs).encode(), group.no)]
        group.stateful = True
        w.undo.append(lambda: setattr(group, "stateful", False))
        w.after.append(lambda: router.tally(cfg.service, routed=1))
        return st.endpoints.get(ep.onward)

    def _relayed(self, op: Begin, group_no: int, contract: str) -> Endpoint:
        """The dialog a Begin `relays` (see `Begin`): the target side of a dialog in the group
        the new one joins, on the same contract, relaying no other. (It may have ended: nothing
        then passes across.)"""
        ep = self._endpoint(op.relays)
        why = None
        if ep.is_initiator:
            why = "is the initiator side of its dialog; only a dialog this broker received"
        elif ep.group_no != group_no:
            why = "is in another conversation group; begin with related_conversation naming it"
        elif ep.contract != contract:
            why = f"is on contract {ep.contract!r}, not {contract!r}"
        elif ep.onward is not None:
            why = "already relays another dialog"
        if why is not None:
            raise InvalidArgument(f"BEGIN DIALOG {op.handle} relays {op.relays}, which {why}")
        return ep

    @staticmethod
    def _begun(
        op: Begin,
        is_initiator: bool,
        conversation_id: str,
        service: str,
        far_service: str,
        contract: str,
        *,
        ended: bool,
    ) -> str:
        """BEGIN ... if absent, on a handle that is (or was, and ended) a dialog: it must be
        this very dialog."""
        same = (
            is_initiator
            and service == op.from_service
            and far_service == op.to_service
            and contract == op.contract
            and op.conversation_id in (None, conversation_id)
        )
        if not same:
            was = "was a dialog (now ended)" if ended else "is already a dialog"
            raise InvalidArgument(
                f"conversation handle {op.handle!r} {was} from {service!r} to {far_service!r} "
                f"on contract {contract!r}, not the one this Begin names"
            )
        return op.handle

    def _endpoint(self, handle: str) -> Endpoint:
        """The live endpoint on `handle`; ConversationEnded when it is the handle of a dialog
        begun if absent that ended and went (a re-run's Begin answers with such a handle)."""
        ep = self.state.endpoints.by_handle(handle)
        if ep is None:
            if isinstance(handle, str) and self._ended_rerun(handle) is not None:
                raise ConversationEnded(
                    f"conversation {handle} ended and its endpoint is gone (it is remembered as "
                    "a dialog begun if absent, so a re-run does not begin it again); begin "
                    "another dialog to send more"
                )
            return self.state.endpoint(handle)  # ConversationNotFound
        return ep

    def send(self, w: Changes, op: Send) -> int:
        st = self.state
        mt = op.message_type
        if mt in SYSTEM_TYPES:
            raise InvalidArgument(
                f"{mt!r} is a system message; use end_conversation or a conversation timer"
            )
        validator = st.catalog.validator(mt)
        limit = st.limits.max_body_bytes
        bodies = op.bodies  # bytes, each: `Send` checked them when it was made
        biggest = len(bodies[0]) if len(bodies) == 1 else max(map(len, bodies), default=0)
        if biggest > limit:
            raise BodyTooLarge(
                f"a {mt!r} body is {biggest:,} bytes; this broker's max_body_bytes is "
                f"{limit:,}: split it or raise the limit"
            )
        if validator.kind != "none":
            for body in op.bodies:
                validator.check(body)
        if not op.handles:
            raise InvalidArgument("send needs at least one conversation handle")
        sent = 0
        for handle in op.handles:
            if op.at is not None and self._sent_before(handle, op):
                # a re-run's messages, every one sent before: nothing to send, whatever the
                # dialog's state since (its target may have ended it, both ends may be gone)
                continue
            ep = self._endpoint(handle)
            check_send(ep, st.catalog.contract(ep.contract), mt)
            bodies = op.bodies if op.at is None else self._unsent(ep, op)
            if bodies:
                self.delivery.transmit(w, ep, mt, bodies)
            sent += len(bodies)
        return sent

    def _sent_before(self, handle: str, op: Send) -> bool:
        """Whether the dialog on `handle` sent every message of this SEND ... AT before: live,
        or ended and remembered (begun `if_absent`, see `actors.core.work`)."""
        assert op.at is not None
        ep = self.state.endpoints.by_handle(handle)
        if ep is not None:
            return op.at + len(op.bodies) <= ep.sent_by_user()
        ended = self._ended_rerun(handle) if isinstance(handle, str) else None
        if ended is None:
            return False  # not a dialog: st.endpoint says so
        sent = ended[4]
        if op.at + len(op.bodies) <= sent:
            return True
        raise ConversationEnded(
            f"conversation {handle} ended after sending {sent} messages; this send at "
            f"sequence {op.at} holds {op.at + len(op.bodies) - sent} it never sent, and an "
            "ended dialog sends no more: begin another dialog for them"
        )

    @staticmethod
    def _unsent(ep: Endpoint, op: Send) -> tuple[bytes, ...]:
        """The bodies of a SEND ... AT whose sequence numbers the dialog has not used yet."""
        assert op.at is not None
        if op.at > ep.send_seq:
            raise InvalidArgument(
                f"send at sequence {op.at} on {ep.handle!r}, but the dialog's next is "
                f"{ep.send_seq}: the messages between were never sent"
            )
        return op.bodies[ep.send_seq - op.at :]

    def end(self, w: Changes, op: End, held: frozenset[int]) -> None:
        st, delivery = self.state, self.delivery
        checks.flag("cleanup", op.cleanup)
        ep = self._endpoint(op.handle)
        lock = st.locks.by_group.get(ep.group_no)
        if lock is not None and ep.group_no not in held:
            raise GroupLocked(
                f"conversation {ep.handle} is in a group locked by receive {lock.lock_id}; end "
                "it in that receive's commit, or after it"
            )
        delivery.remove_messages(w, ep)
        if op.cleanup:  # what it sent and did not get out yet goes too, this unit's as well
            self.store.delete_endpoint_transmission(ep.no)
            w.transmission = [r for r in w.transmission if r[0] != ep.no]
            w.touch(ep)
            ep.state = CLOSED
            w.dead_endpoints.append(ep)
            return
        far = st.far(ep)
        plan = plan_end(ep, op.error, op.description, far_exists=delivery.far_exists(ep, far))
        w.touch(ep)
        if plan.notify is not None:
            ep.user_sent = ep.send_seq  # the notice takes the next sequence number
            delivery.transmit(w, ep, plan.notify, [plan.body])
        ep.state = plan.new_state
        if ep.state is DISCONNECTED_OUTBOUND and far is not None and far.state is CLOSED:
            delivery.close(w, ep)  # the far side closed on our EndDialog (an Echo target does)
        if ep.state is CLOSED:
            delivery.close(w, ep)
            if far is not None and far.state is DISCONNECTED_OUTBOUND:
                delivery.close(w, far)  # both sides have ended

    def timer(self, w: Changes, op: Timer) -> None:
        ep = self._endpoint(op.handle)
        timeout = checks.seconds("timer timeout", op.timeout, zero=True)
        if ep.state is CLOSED:
            raise ConversationNotFound(op.handle)
        w.touch(ep)
        ep.timer_at = w.now + timeout if timeout > 0 else None
