"""The two boundaries of the transport, as protocols.

`BrokerPort` is all the transport may know of its broker: read endpoints, the two route
decisions, and a handful of changes made inside the broker's unit of work. `Peers` is how it
reaches other brokers: Ray supplies one implementation (actors.remote.peers), the unit tests
another (in-process brokers).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

from actors.counters import Counts
from actors.model.catalog import Catalog
from actors.model.dialogs import Endpoint
from actors.model.hops import Hop
from actors.model.limits import Limits
from actors.model.routing import Match
from actors.security.sessions import Session

T = TypeVar("T")
Work = Any  # the broker's unit-of-work changes; opaque to the transport


class BrokerPort(Protocol):
    name: str
    broker_id: str
    limits: Limits

    @property
    def forwarding(self) -> bool: ...

    @property
    def counts(self) -> Counts: ...

    @property
    def catalog(self) -> Catalog: ...

    def now(self) -> float: ...

    def transaction(self, fn: Callable[[Work], T]) -> T:
        """Run `fn` in one of the broker's units of work (one store transaction)."""
        ...

    # --- reading -----------------------------------------------------------------------------

    def endpoint(self, no: int) -> Endpoint | None: ...

    def endpoint_of(self, conversation_id: str, is_initiator: bool) -> Endpoint | None: ...

    def ended_recv_seqs(self, conversation_ids: Sequence[str]) -> dict[str, int]:
        """How many messages this broker's removed target endpoint of each dialog had taken,
        for the dialogs it remembers such an endpoint of."""
        ...

    def has_waiting(self) -> bool:
        """Whether any dialog has messages in the transmission queue."""
        ...

    @property
    def sending(self) -> set[int]:
        """The endpoints with a batch on its way: the dispatcher keeps it, the broker reads it
        (what is on its way elsewhere is not delivered here meanwhile)."""
        ...

    def own_hops(self, ep: Endpoint, now: float) -> tuple[Match, list[Hop]]:
        """Route decision for a dialog begun here: the broker's own routes."""
        ...

    def instance_hops(
        self, service: str, broker_id: str | None, conversation_id: str, now: float
    ) -> tuple[Match, list[Hop]]:
        """Route decision for a message that arrived: the broker's instance routes."""
        ...

    # --- changing (inside `transaction`) -------------------------------------------------------

    def open_target(
        self,
        w: Work,
        conversation_id: str,
        service: str,
        far_service: str,
        contract: str,
        expires_at: float | None,
        far_broker: str,
    ) -> Endpoint:
        """The target endpoint a dialog's first arriving message creates."""
        ...

    def deliver(
        self, w: Work, ep: Endpoint, message_type: str, bodies: Sequence[bytes], first_seq: int
    ) -> None: ...

    def deliver_waiting(self, w: Work, ep_no: int) -> None:
        """Deliver what waited in the transmission queue for a target now found on this broker
        (or drop the rows of an endpoint that is gone)."""
        ...

    def post_error(self, w: Work, ep: Endpoint, code: int, description: str) -> None: ...

    def pin(self, w: Work, ep: Endpoint, broker_id: str) -> None:
        """From now on only `broker_id` holds the far side of this dialog."""
        ...

    def acknowledged(self, w: Work, ep_nos: Iterable[int]) -> None:
        """The far broker acknowledged messages of these endpoints."""
        ...

    def record_event(self, w: Work, kind: str, subject: str, detail: str) -> None: ...

    # --- dialog security (actors.core.keyring) -------------------------------------------------

    def outbound_security(self, ep: Endpoint, now: float) -> tuple[Session, bool] | str | None:
        """How `ep`'s messages leave: (session, fresh) sealed, None in the clear, or why they
        wait. A fresh session is kept (`keep_sessions`) before its messages go."""
        ...

    def key_offer(self, ep: Endpoint, now: float) -> bytes | str:
        """An initiator's key offer for its dialog's message 0, or why it cannot be made."""
        ...

    def keep_sessions(self, w: Work, ep_nos: Sequence[int]) -> None: ...

    def forget_session(self, ep_no: int) -> None: ...

    def session(self, ep_no: int) -> Session | None: ...

    def accept_offer(
        self, blob: bytes, conversation_id: str, from_service: str, to_service: str, now: float
    ) -> bytes:
        """The session key a dialog's key offer carries; SecurityError if it is refused."""
        ...

    def keep_session(self, w: Work, ep: Endpoint, session_key: bytes) -> None: ...

    # --- transport security --------------------------------------------------------------------

    def sign_call(self, blob: bytes, to: str) -> bytes:
        """A call's bundles as they go to broker `to` (signed if this broker has an identity)."""
        ...

    def open_call(self, blob: bytes) -> bytes:
        """The bundles of a call that reached this broker; SecurityError if it is refused."""
        ...


class Peers(Protocol):
    """Calls to other brokers by name. Anything that keeps a call from being answered raises
    `PeerUnreachable` with a reason fit for a status line (its constructors word them: a broker
    that is not running, that did not answer in time, ...), never a Python exception's name."""

    async def deliver(self, broker: str, blob: bytes, timeout: float) -> bytes: ...
