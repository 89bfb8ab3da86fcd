"""`BrokerCore`: one broker's verbs over its state, wired from the modules of this package.
No Ray here. Callers: the broker actor, the local broker, and tests."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .. import views
from ..catalog import Catalog, Definition
from ..envelope import Op, ReceivedGroup
from ..limits import Limits
from ..locks import LockTable
from ..routing import RouteTable
from ..store import Store
from ..transport import Transport
from .admin import Admin
from .conversations import Conversations
from .delivery import Delivery
from .port import CorePort
from .receiving import Receiving
from .state import BrokerState
from .timers import Timers
from .work import Clock, UnitOfWork


class BrokerCore:
    """One broker: catalog, dialogs, queues, locks, routes, timers. Every verb is one unit of
    work (one store transaction); a verb that fails changes nothing."""

    def __init__(
        self,
        store: Store,
        clock: Clock = time.time,
        limits: Limits | None = None,
        name: str = "local",
    ) -> None:
        self.name = name  # the broker's name: what "ray://<name>" addresses
        self.store = store
        self.clock = clock
        self.limits = limits or Limits()
        self.state = BrokerState(store, self.limits, name)
        self.uow = UnitOfWork(self.state, store, clock)
        self.delivery = Delivery(self.state, store)
        self.conversations = Conversations(self.state, store, self.delivery)
        self.receiving = Receiving(self.state, store, self.uow, self.conversations)
        self.admin = Admin(self.state, store, self.uow, self.delivery)
        self.timers = Timers(self.state, store, self.uow, self.delivery, self.receiving)
        self.transport = Transport(CorePort(self.state, store, self.uow, self.delivery), store)

    # --- what the runtime reads and hooks ---------------------------------------------------------

    @property
    def broker_id(self) -> str:
        return self.state.broker_id

    @property
    def catalog(self) -> Catalog:
        return self.state.catalog

    @property
    def locks(self) -> LockTable:
        return self.state.locks

    @property
    def routes(self) -> dict[str, RouteTable]:
        return self.state.routes

    @property
    def forwarding(self) -> bool:
        return self.state.forwarding

    @property
    def notify(self) -> Callable[[str], None]:
        """Called with a queue's name when receivers waiting on it should look again."""
        return self.uow.notify

    @notify.setter
    def notify(self, fn: Callable[[str], None]) -> None:
        self.uow.notify = fn

    @property
    def on_event(self) -> Callable[[str, str, str], None]:
        """Called with (kind, subject, detail) after an operator event commits."""
        return self.uow.on_event

    @on_event.setter
    def on_event(self, fn: Callable[[str, str, str], None]) -> None:
        self.uow.on_event = fn

    # --- catalog, routes, settings ----------------------------------------------------------------

    def create(self, defn: Definition, request_id: str | None = None) -> None:
        self.admin.create(defn, request_id)

    def alter(
        self, kind: str, name: str, changes: Mapping[str, Any], request_id: str | None = None
    ) -> None:
        self.admin.alter(kind, name, changes, request_id)

    def drop(self, kind: str, name: str, request_id: str | None = None) -> None:
        self.admin.drop(kind, name, request_id)

    def definitions(self) -> list[tuple[str, dict[str, Any]]]:
        return self.admin.definitions()

    def create_route(
        self, table: str, record: Mapping[str, Any], request_id: str | None = None
    ) -> list[str]:
        return self.admin.create_route(table, record, request_id)

    def alter_route(
        self, table: str, name: str, changes: Mapping[str, Any], request_id: str | None = None
    ) -> list[str]:
        return self.admin.alter_route(table, name, changes, request_id)

    def drop_route(self, table: str, name: str, request_id: str | None = None) -> None:
        self.admin.drop_route(table, name, request_id)

    def routes_view(self, table: str = "routes") -> list[dict[str, Any]]:
        return self.admin.routes_view(table)

    def configure(self, forwarding: bool | None = None) -> dict[str, Any]:
        return self.admin.configure(forwarding)

    def record_event(self, kind: str, subject: str, detail: str) -> None:
        self.admin.record_event(kind, subject, detail)

    # --- dialogs ---------------------------------------------------------------------------------

    def apply(self, ops: Sequence[Op], request_id: str | None = None) -> dict[str, Any]:
        """BEGIN DIALOG / SEND / END CONVERSATION / BEGIN CONVERSATION TIMER, any number of each,
        in order, in one transaction. A `request_id` makes a retried call apply once."""
        return self.uow.run(lambda w: self.conversations.apply_ops(w, ops, frozenset()), request_id)

    def move_conversation(self, handle: str, group_id: str) -> None:
        self.receiving.move_conversation(handle, group_id)

    # --- receiving -------------------------------------------------------------------------------

    def receive(self, queue: str, **options: Any) -> list[ReceivedGroup]:
        """RECEIVE; see `Receiving.receive` for the options."""
        return self.receiving.receive(queue, **options)

    def get_conversation_group(
        self, queue: str, owner: str | None = None, lease_s: float | None = None
    ) -> tuple[str, str] | None:
        return self.receiving.get_conversation_group(queue, owner, lease_s)

    def settle(
        self,
        commit: Sequence[str] = (),
        rollback: Sequence[str] = (),
        ops: Sequence[Op] = (),
        states: Mapping[str, bytes | None] | None = None,
        request_id: str | None = None,
    ) -> dict[str, Any]:
        return self.receiving.settle(commit, rollback, ops, states, request_id)

    def release_owner(self, owner: str) -> int:
        """The holder `owner` died: roll back every lock it held. Returns how many."""
        return self.receiving.release_owner(owner)

    # --- time ------------------------------------------------------------------------------------

    def tick(self) -> float | None:
        """Fire what is due; returns when something next falls due (None: nothing)."""
        return self.timers.tick()

    # --- views -----------------------------------------------------------------------------------

    def depth(self, queue: str) -> tuple[int, int]:
        """(messages waiting or locked on a queue, messages removed from it so far)."""
        idx = self.state.queues.get(queue)
        return (idx.depth, idx.removed) if idx else (0, 0)

    def endpoints_view(self) -> list[dict[str, Any]]:
        return views.endpoints(self.state)

    def queue_view(self, queue: str, limit: int = 1000) -> list[dict[str, Any]]:
        return views.queue(self.state, self.store, queue, limit)

    def queues_view(self) -> dict[str, dict[str, Any]]:
        return views.queues(self.state)

    def groups_view(self, queue: str | None = None) -> list[dict[str, Any]]:
        return views.groups(self.state, self.store, queue)

    def transmission_view(self, limit: int = 1000) -> list[dict[str, Any]]:
        return views.transmission(self.state, self.store, limit)

    def events_view(self, after_id: int = 0, limit: int = 1000) -> list[dict[str, Any]]:
        return views.events(self.store, after_id, limit)

    def audit(self, after_id: int = 0, limit: int = 1000) -> dict[str, Any]:
        """Delivery records after `after_id` (at most `limit` commits) and the id to pass next:
        {"records": [...], "next": id}."""
        recs, nxt = views.audit(self.store, after_id, limit)
        return {"records": recs, "next": max(nxt, after_id)}
