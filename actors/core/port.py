"""The broker as the transport sees it (`actors.transport.port.BrokerPort`): a narrow set of
reads and of changes made inside the broker's unit of work."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from actors.core.changes import Changes
from actors.core.delivery import Delivery
from actors.core.work import Part, UnitOfWork
from actors.counters import Counts
from actors.model.catalog import Catalog
from actors.model.dialogs import DISCONNECTED_OUTBOUND, Endpoint
from actors.model.hops import Hop, next_hops
from actors.model.limits import Limits
from actors.model.routing import Match
from actors.security.sessions import Session

T = TypeVar("T")


class CorePort(Part):
    def __init__(self, uow: UnitOfWork, delivery: Delivery) -> None:
        super().__init__(uow)
        self.delivery = delivery
        state = uow.state
        self.name = state.name
        self.broker_id = state.broker_id
        self.limits: Limits = state.limits

    @property
    def forwarding(self) -> bool:
        return self.state.forwarding

    @property
    def counts(self) -> Counts:
        return self.state.counts

    @property
    def catalog(self) -> Catalog:
        return self.state.catalog

    def now(self) -> float:
        return self.uow.clock()

    def transaction(self, fn: Callable[[Changes], T]) -> T:
        return self.uow.run(fn)

    def endpoint(self, no: int) -> Endpoint | None:
        return self.state.endpoints.get(no)

    def endpoint_of(self, conversation_id: str, is_initiator: bool) -> Endpoint | None:
        return self.state.endpoints.by_conversation(conversation_id, is_initiator)

    def ended_recv_seqs(self, conversation_ids: Sequence[str]) -> dict[str, int]:
        return self.store.ended_recv_seqs(conversation_ids)

    def has_waiting(self) -> bool:
        return bool(self.state.parked)

    @property
    def sending(self) -> set[int]:
        return self.state.sending

    def own_hops(self, ep: Endpoint, now: float) -> tuple[Match, list[Hop]]:
        return self.delivery.next_hops(ep, now)

    def instance_hops(
        self, service: str, broker_id: str | None, conversation_id: str, now: float
    ) -> tuple[Match, list[Hop]]:
        st = self.state
        here = broker_id in (None, st.broker_id) and service in st.catalog.services
        return next_hops(
            st.routes["instance"],
            service,
            broker_id,
            conversation_id,
            now,
            local_broker_id=st.broker_id,
            local_name=st.name,
            service_is_local=here,
        )

    def open_target(
        self,
        w: Changes,
        conversation_id: str,
        service: str,
        far_service: str,
        contract: str,
        expires_at: float | None,
        far_broker: str,
    ) -> Endpoint:
        svc = self.state.catalog.service(service)
        return self.delivery.new_target(
            w, conversation_id, svc, far_service, contract, expires_at, far_broker
        )

    def deliver(
        self,
        w: Changes,
        ep: Endpoint,
        message_type: str,
        bodies: Sequence[bytes],
        first_seq: int,
        sent_at: float | None = None,
    ) -> None:
        self.delivery.deliver(w, ep, message_type, bodies, first_seq, sent_at)

    def deliver_waiting(self, w: Changes, ep_no: int) -> None:
        ep = self.state.endpoints.get(ep_no)
        if ep is None:
            self.store.delete_endpoint_transmission(ep_no)
        else:
            self.delivery.deliver_parked(w, ep)

    def post_error(self, w: Changes, ep: Endpoint, code: int, description: str) -> None:
        self.delivery.post_error(w, ep, code, description)

    def pin(self, w: Changes, ep: Endpoint, broker_id: str) -> None:
        w.touch(ep)
        ep.far_broker = broker_id

    def acknowledged(self, w: Changes, ep_nos: Iterable[int]) -> None:
        for no in self.delivery.refresh_parked(w, ep_nos):
            ep = self.state.endpoints[no]
            # an EndDialog the far side has acknowledged closes this side (it already ended)
            if ep.state is DISCONNECTED_OUTBOUND:
                self.delivery.close(w, ep)

    def record_event(self, w: Changes, kind: str, subject: str, detail: str) -> None:
        w.event(kind, subject, detail)

    # --- dialog security -------------------------------------------------------------------------

    def outbound_security(self, ep: Endpoint, now: float) -> tuple[Session, bool] | str | None:
        return self.state.keyring.outbound(ep, now)

    def key_offer(self, ep: Endpoint, now: float) -> bytes | str:
        return self.state.keyring.offer(ep, now)

    def keep_sessions(self, w: Changes, ep_nos: Sequence[int]) -> None:
        """Store these dialogs' session keys with the unit `w` (written when it is)."""
        keyring = self.state.keyring
        w.keys += ep_nos
        w.undo.append(lambda: [keyring.sessions.pop(no, None) for no in ep_nos])

    def forget_session(self, ep_no: int) -> None:
        self.state.keyring.sessions.pop(ep_no, None)

    def session(self, ep_no: int) -> Session | None:
        found = self.state.keyring.sessions.get(ep_no)
        return None if found is None else found[0]

    def accept_offer(
        self, blob: bytes, conversation_id: str, from_service: str, to_service: str, now: float
    ) -> bytes:
        keyring = self.state.keyring
        return keyring.accept(blob, conversation_id, from_service, to_service, now).session_key

    def sign_call(self, blob: bytes, to: str) -> bytes:
        return self.state.keyring.sign_call(blob, self.broker_id, to, self.now())

    def open_call(self, blob: bytes) -> bytes:
        return self.state.keyring.open_call(blob, self.name, self.now())

    def keep_session(self, w: Changes, ep: Endpoint, session_key: bytes) -> None:
        self.state.keyring.sessions[ep.no] = (Session(session_key, ep.conversation_id), session_key)
        self.keep_sessions(w, [ep.no])
