"""`BrokerCore`: one broker's verbs over its state, wired from the modules of this package.
No Ray here. Callers: the broker actor, the local broker, and tests."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from actors.calls.envelope import Op
from actors.calls.ordering import RequestId
from actors.core import views
from actors.core.admin import Admin
from actors.core.conversations import Conversations
from actors.core.delivery import Delivery
from actors.core.locks import LockTable
from actors.core.port import CorePort
from actors.core.receiving import Receiving
from actors.core.state import BrokerState
from actors.core.timers import Timers
from actors.core.work import Clock, UnitOfWork
from actors.errors import SecurityError
from actors.model.catalog import Catalog
from actors.model.limits import Limits
from actors.store.database import Store
from actors.transport import Transport


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
        self.delivery = Delivery(self.uow)
        self.conversations = Conversations(self.uow, self.delivery)
        self.delivery.route_first = self.conversations.route_first
        self.receiving = Receiving(self.uow, self.conversations)
        self.admin = Admin(self.uow, self.delivery)
        self.timers = Timers(self.uow, self.delivery, self.receiving)
        self.transport = Transport(CorePort(self.uow, self.delivery), store)
        # The verbs, as the parts define them (one signature, one docstring each).
        a, r = self.admin, self.receiving
        self.create, self.alter, self.drop, self.definitions = (
            a.create,
            a.alter,
            a.drop,
            a.definitions,
        )
        self.create_route, self.alter_route, self.drop_route = (
            a.create_route,
            a.alter_route,
            a.drop_route,
        )
        self.routes_view, self.configure, self.record_event = (
            a.routes_view,
            a.configure,
            a.record_event,
        )
        self.record_operator_event, self.retry_transmission = (
            a.record_operator_event,
            a.retry_transmission,
        )
        self.receive, self.get_conversation_group, self.settle = (
            r.receive,
            r.get_conversation_group,
            r.settle,
        )
        self.move_conversation, self.release_owner = r.move_conversation, r.release_owner
        self.give_back = r.give_back
        self.tick = self.timers.tick
        # Fixed for the broker's life: its id, catalog and lock table.
        self.broker_id: str = self.state.broker_id
        self.catalog: Catalog = self.state.catalog
        self.locks: LockTable = self.state.locks

    # --- what the runtime reads and hooks ---------------------------------------------------------

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

    # --- dialogs ---------------------------------------------------------------------------------

    def apply(self, ops: Sequence[Op], request_id: RequestId | None = None) -> dict[str, Any]:
        """BEGIN DIALOG / SEND / END CONVERSATION / BEGIN CONVERSATION TIMER, any number of each,
        in order, in one transaction. A `request_id` makes a retried call apply once."""
        try:
            return self.uow.run(
                lambda w: self.conversations.apply_ops(w, ops, frozenset()), request_id
            )
        except SecurityError as exc:  # the call changed nothing; the operator sees why
            self.record_event("SecurityRefused", "BEGIN DIALOG", str(exc))
            raise

    # --- views -----------------------------------------------------------------------------------

    def ready_groups(self, queue: str) -> int:
        """How many conversation groups of `queue` have messages and no lock (receivable now)."""
        self.state.catalog.queue(queue)  # an unknown queue is refused
        idx = self.state.queues.get(queue)
        return idx.ready_count() if idx else 0

    def depth(self, queue: str) -> tuple[int, int]:
        """(messages waiting or locked on a queue, messages removed from it so far)."""
        idx = self.state.queues.get(queue)
        return (idx.depth, idx.removed) if idx else (0, 0)

    def endpoints_view(
        self, after: str | None = None, limit: int = views.VIEW_PAGE
    ) -> list[dict[str, Any]]:
        return views.endpoints(self.state, after, limit)

    def rerunnable_view(
        self, after: str | None = None, limit: int = views.VIEW_PAGE
    ) -> list[dict[str, Any]]:
        return views.rerunnable(self.store, after, limit)

    def dialogs_view(self) -> dict[str, Any]:
        return views.dialogs(self.state, self.store, self.uow.clock())

    def transmission_depth(self) -> int:
        return views.transmission_depth(self.state, self.store, self.uow.clock())

    def queue_view(self, queue: str, limit: int = 1000) -> list[dict[str, Any]]:
        return views.queue(self.state, self.store, queue, limit)

    def queues_view(self) -> dict[str, dict[str, Any]]:
        return views.queues(self.state)

    def groups_view(
        self, queue: str | None = None, after: str | None = None, limit: int = views.VIEW_PAGE
    ) -> list[dict[str, Any]]:
        return views.groups(self.state, self.store, queue, after, limit)

    def router_mappings(self, queue: str, limit: int = 100) -> tuple[int, list[str]]:
        return views.router_mappings(self.store, queue, limit)

    def transmission_view(self, limit: int = 1000) -> list[dict[str, Any]]:
        return views.transmission(self.state, self.store, limit)

    def events_view(
        self, after_id: int = 0, limit: int = 1000, newest: bool = False
    ) -> list[dict[str, Any]]:
        return views.events(self.store, after_id, limit, newest)

    def audit(self, after_id: int = 0, limit: int = 1000) -> dict[str, Any]:
        """Delivery records after `after_id` (whole commits, at most `limit` of them, none after
        the one that brings the records to `limit`) and the id to pass next:
        {"records": [...], "next": id, "missed": n}. `missed` counts the commits after `after_id`
        that the audit's bound (Limits.audit_rows) dropped before this read: their records are
        gone, so a reader can say "not known" rather than "lost"."""
        recs, nxt = views.audit(self.store, after_id, limit)
        first = self.store.audit_first_id()
        missed = 0 if first is None else max(0, first - after_id - 1)
        return {"records": recs, "next": max(nxt, after_id), "missed": missed}
