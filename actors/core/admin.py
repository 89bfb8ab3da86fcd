"""Administration: the catalog (CREATE / ALTER / DROP of message types, contracts, queues and
services), the two route tables, and broker settings."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from actors.core.changes import Changes
from actors.core.delivery import Delivery
from actors.core.state import ROUTE_TABLES
from actors.core.work import Part, UnitOfWork
from actors.errors import InUse, InvalidArgument
from actors.model.catalog import Definition, Queue, Service, check_name, kind_of, to_record
from actors.model.credentials import Certificate, Grant, RemoteServiceBinding, shown_record
from actors.model.dialogs import CLOSED
from actors.model.routing import Route, RouteTable

CREDENTIALS = (Certificate, RemoteServiceBinding, Grant)


class Admin(Part):
    def __init__(self, uow: UnitOfWork, delivery: Delivery) -> None:
        super().__init__(uow)
        self.delivery = delivery

    # --- the catalog -----------------------------------------------------------------------------

    def create(self, defn: Definition, request_id: str | None = None) -> None:
        """CREATE MESSAGE TYPE / CONTRACT / QUEUE / SERVICE."""
        st = self.state
        if isinstance(defn, Service) and isinstance(defn.contracts, (list, set)):
            defn = Service(defn.name, defn.queue, tuple(defn.contracts))

        def fn(w: Changes) -> None:
            nonlocal defn
            st.catalog.check_new(defn)
            if isinstance(defn, Certificate) and not defn.certificate:
                defn = st.keyring.make(defn, w.now)  # one of this broker's own
                st.catalog.check_valid(defn)
            kind = kind_of(defn)
            self.store.put_definition(kind, defn.name, to_record(defn))
            st.catalog.add(defn)
            w.undo.append(lambda: st.catalog.remove(kind, defn.name))
            if isinstance(defn, Queue):
                w.after.append(lambda: st.queue_index(defn.name))
            if isinstance(defn, Service):
                self.delivery.unpark_service(w, defn.name)
            if isinstance(defn, CREDENTIALS):
                self.store.retry_now()  # dialogs waiting for dialog security may go now

        self.uow.run(fn, request_id)

    def alter(
        self, kind: str, name: str, changes: Mapping[str, Any], request_id: str | None = None
    ) -> None:
        """ALTER ...: change some fields of a definition (a queue's `enabled`, say)."""
        st = self.state

        def fn(w: Changes) -> None:
            new = st.catalog.check_alter(kind, name, changes)
            old = st.catalog.get(kind, name)
            self.store.put_definition(kind, name, to_record(new))
            st.catalog.add(new)
            w.undo.append(lambda: st.catalog.add(old))
            if isinstance(new, Queue) and new.enabled and not old.enabled:
                w.event("QueueEnabled", name, "re-enabled")
                w.after.append(lambda: (st.poison.reset(name), self.uow.notify(name)))
            if isinstance(new, Queue) and old.enabled and not new.enabled:
                w.event("QueueDisabled", name, "disabled by alter")
            if isinstance(new, Queue) and new.retention != old.retention:
                self.store.settle_received(self.store.group_nos_of_queue(name))
            if isinstance(new, Service):
                self.delivery.unpark_service(w, name)
            if isinstance(new, CREDENTIALS):
                self.store.retry_now()

        self.uow.run(fn, request_id)

    def drop(self, kind: str, name: str, request_id: str | None = None) -> None:
        st = self.state

        def fn(w: Changes) -> None:
            st.catalog.check_drop(kind, name)
            if kind == "service":
                users = sum(
                    1
                    for ep, _ in st.every_endpoint()
                    if ep.service == name and ep.state is not CLOSED
                )
                if users:
                    raise InUse(
                        f"service {name!r} has {users} open conversation(s); end them first"
                    )
            if kind == "queue":
                depth = st.queue_index(name).depth
                if depth:
                    raise InUse(f"queue {name!r} holds {depth} message(s); receive them first")
            old = st.catalog.get(kind, name)
            self.store.delete_definition(kind, name)
            st.catalog.remove(kind, name)
            w.undo.append(lambda: st.catalog.add(old))

        self.uow.run(fn, request_id)

    def definitions(self) -> list[tuple[str, dict[str, Any]]]:
        """Every user definition, as records (a certificate's sealed private key left out)."""
        out = []
        for d in self.state.catalog.user_definitions():
            kind = kind_of(d)
            out.append((kind, shown_record(kind, to_record(d))))
        return out

    # --- routes ----------------------------------------------------------------------------------

    def _save_routes(self, w: Changes, table: str, before: tuple[Route, ...]) -> None:
        """Persist a whole table (they are small); on failure put the old one back."""
        st, store = self.state, self.store
        w.undo.append(lambda: st.routes.__setitem__(table, RouteTable(before)))
        if store.get_meta("routes") is None:
            store.set_meta("routes", "1")
            for t in ROUTE_TABLES:
                for r in st.routes[t].routes():
                    store.put_route(t, r.name, r.to_record())
        for r in before:
            store.delete_route(table, r.name)
        for r in st.routes[table].routes():
            store.put_route(table, r.name, r.to_record())
        store.retry_now()  # delayed dialogs may have a way now

    def create_route(
        self, table: str, record: Mapping[str, Any], request_id: str | None = None
    ) -> list[str]:
        """CREATE ROUTE in the broker's own table ("routes") or its instance table ("instance").
        Returns warnings (seed 002's multiple-target-endpoints hazard)."""

        def fn(w: Changes) -> list[str]:
            t = self.state.route_table(table)
            before = t.routes()
            warnings = t.create(Route.from_record(_resolve_lifetime(record, w.now)), w.now)
            self._save_routes(w, table, before)
            for text in warnings:
                w.event("RouteWarning", record.get("name", "?"), text)
            return warnings

        return self.uow.run(fn, request_id)

    def alter_route(
        self, table: str, name: str, changes: Mapping[str, Any], request_id: str | None = None
    ) -> list[str]:
        def fn(w: Changes) -> list[str]:
            t = self.state.route_table(table)
            before = t.routes()
            warnings = t.alter(name, w.now, **_resolve_lifetime(changes, w.now))
            self._save_routes(w, table, before)
            return warnings

        return self.uow.run(fn, request_id)

    def drop_route(self, table: str, name: str, request_id: str | None = None) -> None:
        def fn(w: Changes) -> None:
            t = self.state.route_table(table)
            before = t.routes()
            t.drop(name)
            self._save_routes(w, table, before)

        self.uow.run(fn, request_id)

    def routes_view(self, table: str = "routes") -> list[dict[str, Any]]:
        return [r.to_record() for r in self.state.route_table(table).routes()]

    # --- settings and events ---------------------------------------------------------------------

    def configure(self, forwarding: bool | None = None) -> dict[str, Any]:
        """Broker settings: `forwarding` relays arriving messages by the instance routes."""
        st = self.state
        if forwarding is not None:
            if not isinstance(forwarding, bool):
                raise InvalidArgument("forwarding must be True or False")

            def fn(w: Changes) -> None:
                self.store.set_meta("forwarding", "1" if forwarding else "0")
                old = st.forwarding
                st.forwarding = forwarding
                w.undo.append(lambda: setattr(st, "forwarding", old))

            self.uow.run(fn)
        return {"forwarding": st.forwarding, "broker_id": st.broker_id, "name": st.name}

    def record_event(self, kind: str, subject: str, detail: str) -> None:
        """An operator event from outside the verbs (a reader that could not start, say)."""
        self.uow.run(lambda w: w.event(kind, subject, detail))

    def record_operator_event(self, kind: str, subject: str, detail: str) -> None:
        """An event a client records (what a person or a tool did, for the next one to read)."""
        check_name("event kind", kind)
        for what, text, most in (("subject", subject, 200), ("detail", detail, 2000)):
            if not isinstance(text, str) or len(text) > most:
                raise InvalidArgument(f"an event's {what} must be text of at most {most} chars")
        self.record_event(kind, subject, detail)

    def retry_transmission(self, handle: str | None = None) -> int:
        """Make the transmission queue's waiting messages (of dialog `handle`, or all) due now,
        not waiting out their backoff; how many were waiting. Recorded as an event."""
        ep_no = None if handle is None else self.state.endpoint(handle).no

        def fn(w: Changes) -> int:
            made_due = self.store.retry_now(ep_no)
            w.event("TransmissionRetried", handle or "every dialog",
                    f"{made_due} waiting message(s) made due now")  # fmt: skip
            return made_due

        return self.uow.run(fn)


def _resolve_lifetime(fields: Mapping[str, Any], now: float) -> dict[str, Any]:
    """A route's `lifetime` (seconds from now, as clients send it) becomes `expires_at` by this
    broker's clock, so clients' clocks do not matter."""
    out = dict(fields)
    if "lifetime" in out:
        if "expires_at" in out:
            raise InvalidArgument("give a route either lifetime or expires_at, not both")
        life = out.pop("lifetime")
        ok = life is None or (isinstance(life, (int, float)) and not isinstance(life, bool))
        if not ok or (life is not None and not (math.isfinite(life) and life > 0)):
            raise InvalidArgument(
                f"route lifetime must be None or a finite number of seconds > 0, not {life!r}"
            )
        out["expires_at"] = None if life is None else now + life
    return out
