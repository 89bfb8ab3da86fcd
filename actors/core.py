"""`BrokerCore`: one broker's verbs, built from the plain modules. No Ray here.

Every verb runs as one store transaction (`_run`). Work is planned into a `_Batch` while the
transaction is open; endpoint changes made on the way are snapshotted, so a verb that fails, for a
bad argument or a store error, leaves memory and store exactly as they were. Changes to the
in-memory indexes (ready groups, locks, timers) are applied only after the commit.
"""

from __future__ import annotations

import copy
import dataclasses
import heapq
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from . import views
from .catalog import (
    DIALOG_TIMER,
    ECHO,
    ECHO_CONTRACT,
    ERROR,
    SYSTEM_TYPES,
    Catalog,
    Definition,
    Queue,
    Service,
    check_name,
    from_record,
    kind_of,
    to_record,
)
from .dialogs import (
    CONTRACT_NOT_ACCEPTED,
    CONVERSATION_CLEANED_UP,
    LIFETIME_EXPIRED,
    Endpoint,
    State,
    after_send,
    check_send,
    error_body,
    on_arrival,
    plan_end,
)
from .envelope import Begin, End, Op, ReceivedGroup, Send, Timer
from .errors import (
    BodyTooLarge,
    ContractViolation,
    ConversationNotFound,
    GroupLocked,
    InUse,
    InvalidArgument,
    LockNotHeld,
    QueueDisabled,
)
from .locks import Lock, LockTable, QueueIndex
from .poison import PoisonCounter
from .readcache import ROW_OVERHEAD, ReadCache
from .routing import Hop, Match, Route, RouteTable, choose, match
from .store import Store
from .transport import Transport

Clock = Callable[[], float]
ROUTE_TABLES = ("routes", "instance")  # the broker's own routes; its instance routes


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 4 << 20
    lease_s: float = 30.0
    closed_retention_s: float = 60.0  # closed endpoints linger so late use gets a clear error
    audit_rows: int = 100_000  # one row per committed receive batch
    event_rows: int = 10_000
    request_retention_s: float = 600.0  # how long a retried call is recognised (clients: 60 s)
    read_cache_bytes: int = 256 << 20  # waiting messages kept in memory for receive


@dataclass
class _Group:
    no: int
    group_id: str
    queue: str
    members: int = 0  # endpoints in the group


@dataclass
class _Batch:
    """What one verb changes, gathered while its transaction is open."""

    now: float
    messages: list[tuple[Any, ...]] = field(default_factory=list)
    # queue, group, first id, count, and where the rows are in `messages` (-1: not there)
    arrivals: list[tuple[str, int, int, int, int, int]] = field(default_factory=list)
    # queue, group, count, and whether they were the group's oldest (a commit)
    removals: list[tuple[str, int, int, bool]] = field(default_factory=list)
    transmission: list[tuple[Any, ...]] = field(default_factory=list)
    touched: dict[int, Endpoint] = field(default_factory=dict)  # no -> snapshot before change
    new_endpoints: list[Endpoint] = field(default_factory=list)
    new_nos: set[int] = field(default_factory=set)  # their numbers, for touch
    dead_endpoints: list[Endpoint] = field(default_factory=list)
    new_groups: list[_Group] = field(default_factory=list)
    events: list[tuple[float, str, str, str]] = field(default_factory=list)
    undo: list[Callable[[], None]] = field(default_factory=list)
    after: list[Callable[[], None]] = field(default_factory=list)

    def touch(self, ep: Endpoint) -> Endpoint:
        if ep.no not in self.touched and ep.no not in self.new_nos:
            self.touched[ep.no] = copy.copy(ep)
        return ep


class BrokerCore:
    """One broker: catalog, dialogs, queues, locks. Callers: the broker actor, and tests."""

    def __init__(
        self,
        store: Store,
        clock: Clock = time.time,
        limits: Limits | None = None,
        name: str = "local",
    ):
        self.name = name  # the broker's name: what "ray://<name>" addresses
        self.store = store
        self.clock = clock
        self.limits = limits or Limits()
        self.catalog = Catalog()
        self.locks = LockTable(self.limits.lease_s)
        self.poison = PoisonCounter()
        self.cache = ReadCache(self.limits.read_cache_bytes)
        # Hooks the actor sets: wake receivers waiting on a queue; surface an event.
        self.notify: Callable[[str], None] = lambda queue: None
        self.on_event: Callable[[str, str, str], None] = lambda kind, subject, detail: None
        self._next_prune = 0.0
        self._load()

    # --- loading -----------------------------------------------------------------------------

    def _load(self) -> None:
        st = self.store
        with st.tx():
            bid = st.get_meta("broker_id")
            if bid is None:
                bid = str(uuid.uuid4())
                st.set_meta("broker_id", bid)
        self.broker_id = bid
        for kind, rec in st.load_catalog():
            self.catalog.add(from_record(kind, rec))
        self._groups: dict[int, _Group] = {}
        self._group_ids: dict[str, int] = {}
        for no, gid, queue in st.load_groups():
            self._add_group(_Group(no, gid, queue))
        self._eps: dict[int, Endpoint] = {}
        self._handles: dict[str, Endpoint] = {}
        self._convs: dict[tuple[str, bool], Endpoint] = {}
        self._timers: list[tuple[float, int, str]] = []  # (due, endpoint no, kind)
        for row in st.load_endpoints():
            ep = Endpoint(*row[:3], bool(row[3]), *row[4:8], State(row[8]), *row[9:])
            self._add_endpoint(ep)
            self._schedule(ep)
        self._index: dict[str, QueueIndex] = {q: QueueIndex() for q in self.catalog.queues}
        for g, count, first in st.waiting_by_group():
            self._index_of(g).add(g, first, count, locked=False)
        self._parked: set[int] = {row[1] for row in st.transmission_rows(1 << 62)}
        ep_max, group_max, msg_max = st.max_keys()
        self._next_ep, self._next_group, self._next_msg = ep_max + 1, group_max + 1, msg_max + 1
        self.routes = {t: RouteTable() for t in ROUTE_TABLES}
        if st.get_meta("routes") is not None:  # saved tables (AutoCreatedLocal may be dropped)
            saved: dict[str, list[Route]] = {t: [] for t in ROUTE_TABLES}
            for table, rec in st.load_routes():
                saved[table].append(Route.from_record(rec))
            self.routes = {t: RouteTable(saved[t]) for t in ROUTE_TABLES}
        self.forwarding = st.get_meta("forwarding") == "1"
        self.transport = Transport(self)

    def _add_group(self, g: _Group) -> None:
        self._groups[g.no] = g
        self._group_ids[g.group_id] = g.no

    def _add_endpoint(self, ep: Endpoint) -> None:
        self._eps[ep.no] = ep
        self._handles[ep.handle] = ep
        self._convs[(ep.conversation_id, ep.is_initiator)] = ep
        self._groups[ep.group_no].members += 1

    def _drop_endpoint(self, ep: Endpoint) -> None:
        self._eps.pop(ep.no, None)
        self._handles.pop(ep.handle, None)
        self._convs.pop((ep.conversation_id, ep.is_initiator), None)
        g = self._groups.get(ep.group_no)
        if g is not None:
            g.members -= 1

    def _index_of(self, group_no: int) -> QueueIndex:
        return self._index.setdefault(self._groups[group_no].queue, QueueIndex())

    # --- the transaction wrapper ---------------------------------------------------------------

    def _run(self, fn: Callable[[_Batch], Any], request_id: str | None = None) -> Any:
        """Run `fn` in one transaction; on any error undo everything it did."""
        if request_id is not None:
            if not isinstance(request_id, str) or not request_id:
                raise InvalidArgument("request_id must be a non-empty string")
            done = self.store.request_result(request_id)
            if done is not None:  # a retry of a call that already committed
                return msgpack.unpackb(done, raw=False, strict_map_key=False)
        b = _Batch(now=self.clock())
        try:
            with self.store.tx():
                result = fn(b)
                self._write(b)
                if request_id is not None:
                    self.store.put_request(request_id, b.now, msgpack.packb(result))
        except BaseException:
            for no, snap in b.touched.items():
                self._eps[no].__dict__.update(snap.__dict__)
            for ep in b.new_endpoints:
                self._drop_endpoint(ep)
            for g in b.new_groups:
                self._groups.pop(g.no, None)
                self._group_ids.pop(g.group_id, None)
            for undo in reversed(b.undo):
                undo()
            raise
        self._apply(b)
        return result

    def _write(self, b: _Batch) -> None:
        st = self.store
        if b.new_groups:
            st.insert_groups((g.no, g.group_id, g.queue) for g in b.new_groups)
        dead = {ep.no for ep in b.dead_endpoints}
        changed = [ep for ep in b.new_endpoints if ep.no not in dead]
        changed += [self._eps[no] for no in b.touched if no not in dead and no in self._eps]
        if changed:
            st.upsert_endpoints(_endpoint_row(ep) for ep in changed)
        if dead:
            st.delete_endpoints(dead)
        if b.messages:
            st.insert_messages(b.messages)
        if b.transmission:
            st.insert_transmission(b.transmission)
        if b.events:
            st.insert_events(b.events)

    def _apply(self, b: _Batch) -> None:
        """After commit: bring the in-memory indexes up to date and wake receivers."""
        woken: set[str] = set()
        for queue, g, n, oldest in b.removals:
            self._index.setdefault(queue, QueueIndex()).remove(g, n)
            if oldest:  # a commit took the group's oldest messages
                self.cache.consumed(g, n)
        for queue, g, first, n, at, nbytes in b.arrivals:
            idx = self._index.setdefault(queue, QueueIndex())
            if at >= 0:
                self.cache.arrived(g, b.messages[at : at + n], nbytes, not idx.pending.get(g))
            else:
                self.cache.drop(g)
            idx.add(g, first, n, locked=self.locks.is_locked(g))
            woken.add(queue)
        for ep in b.dead_endpoints:
            self._drop_endpoint(ep)
            self._parked.discard(ep.no)
        for ep in b.new_endpoints:
            self._schedule(ep)
        for no, before in b.touched.items():
            ep = self._eps.get(no)
            if ep is not None and _due_times(ep) != _due_times(before):
                self._schedule(ep)
        for fn in b.after:
            fn()
        for _, kind, subject, detail in b.events:
            self.on_event(kind, subject, detail)
        for queue in woken:
            self.notify(queue)

    def record_event(self, kind: str, subject: str, detail: str) -> None:
        """An operator event from outside the verbs (a reader that could not start, say)."""
        self._run(lambda b: self._event(b, kind, subject, detail))

    def _event(self, b: _Batch, kind: str, subject: str, detail: str) -> None:
        b.events.append((b.now, kind, subject, detail))

    # --- catalog verbs -----------------------------------------------------------------------

    def create(self, defn: Definition, request_id: str | None = None) -> None:
        """CREATE MESSAGE TYPE / CONTRACT / QUEUE / SERVICE."""
        if isinstance(defn, Service) and isinstance(defn.contracts, list | set):
            defn = Service(defn.name, defn.queue, tuple(defn.contracts))

        def fn(b: _Batch) -> None:
            self.catalog.check_new(defn)
            kind = kind_of(defn)
            self.store.put_definition(kind, defn.name, to_record(defn))
            self.catalog.add(defn)
            b.undo.append(lambda: self.catalog.remove(kind, defn.name))
            if isinstance(defn, Queue):
                b.after.append(lambda: self._index.setdefault(defn.name, QueueIndex()))
            if isinstance(defn, Service):
                self._unpark(b, defn.name)

        self._run(fn, request_id)

    def alter(
        self, kind: str, name: str, changes: Mapping[str, Any], request_id: str | None = None
    ) -> None:
        """ALTER ...: change some fields of a definition (a queue's `enabled`, say)."""

        def fn(b: _Batch) -> None:
            new = self.catalog.check_alter(kind, name, changes)
            old = self.catalog.get(kind, name)
            self.store.put_definition(kind, name, to_record(new))
            self.catalog.add(new)
            b.undo.append(lambda: self.catalog.add(old))
            if isinstance(new, Queue) and new.enabled and not old.enabled:
                self._event(b, "QueueEnabled", name, "re-enabled")
                b.after.append(lambda: (self.poison.reset(name), self.notify(name)))
            if isinstance(new, Queue) and old.enabled and not new.enabled:
                self._event(b, "QueueDisabled", name, "disabled by alter")
            if isinstance(new, Service):
                self._unpark(b, name)

        self._run(fn, request_id)

    def drop(self, kind: str, name: str, request_id: str | None = None) -> None:
        def fn(b: _Batch) -> None:
            self.catalog.check_drop(kind, name)
            if kind == "service":
                users = sum(
                    1
                    for ep in self._eps.values()
                    if ep.service == name and ep.state is not State.CLOSED
                )
                if users:
                    raise InUse(
                        f"service {name!r} has {users} open conversation(s); end them first"
                    )
            if kind == "queue":
                depth = self._index.get(name, QueueIndex()).depth
                if depth:
                    raise InUse(f"queue {name!r} holds {depth} message(s); receive them first")
            old = self.catalog.get(kind, name)
            self.store.delete_definition(kind, name)
            self.catalog.remove(kind, name)
            b.undo.append(lambda: self.catalog.add(old))

        self._run(fn, request_id)

    # --- routes and forwarding --------------------------------------------------------------

    def _route_table(self, table: str) -> RouteTable:
        if table not in self.routes:
            raise InvalidArgument(
                f"route table {table!r} does not exist; use one of {list(ROUTE_TABLES)}"
            )
        return self.routes[table]

    def _save_routes(self, b: _Batch, table: str, before: tuple[Route, ...]) -> None:
        """Persist a whole table (they are small); on failure put the old one back."""
        b.undo.append(lambda: self.routes.__setitem__(table, RouteTable(before)))
        st = self.store
        if st.get_meta("routes") is None:
            st.set_meta("routes", "1")
            for t in ROUTE_TABLES:
                for r in self.routes[t].routes():
                    st.put_route(t, r.name, r.to_record())
        for r in before:
            st.delete_route(table, r.name)
        for r in self.routes[table].routes():
            st.put_route(table, r.name, r.to_record())
        st.retry_all_now()  # delayed dialogs may have a way now

    def create_route(
        self, table: str, record: Mapping[str, Any], request_id: str | None = None
    ) -> list[str]:
        """CREATE ROUTE in the broker's own table ("routes") or its instance table ("instance").
        Returns warnings (seed 002's multiple-target-endpoints hazard)."""

        def fn(b: _Batch) -> list[str]:
            t = self._route_table(table)
            before = t.routes()
            warnings = t.create(Route.from_record(dict(record)), b.now)
            self._save_routes(b, table, before)
            for w in warnings:
                self._event(b, "RouteWarning", record.get("name", "?"), w)
            return warnings

        return self._run(fn, request_id)

    def alter_route(
        self, table: str, name: str, changes: Mapping[str, Any], request_id: str | None = None
    ) -> list[str]:
        def fn(b: _Batch) -> list[str]:
            t = self._route_table(table)
            before = t.routes()
            warnings = t.alter(name, b.now, **dict(changes))
            self._save_routes(b, table, before)
            return warnings

        return self._run(fn, request_id)

    def drop_route(self, table: str, name: str, request_id: str | None = None) -> None:
        def fn(b: _Batch) -> None:
            t = self._route_table(table)
            before = t.routes()
            t.drop(name)
            self._save_routes(b, table, before)

        self._run(fn, request_id)

    def routes_view(self, table: str = "routes") -> list[dict[str, Any]]:
        return [r.to_record() for r in self._route_table(table).routes()]

    def configure(self, forwarding: bool | None = None) -> dict[str, Any]:
        """Broker settings: `forwarding` relays arriving messages by the instance routes."""
        if forwarding is not None:
            if not isinstance(forwarding, bool):
                raise InvalidArgument("forwarding must be True or False")

            def fn(b: _Batch) -> None:
                self.store.set_meta("forwarding", "1" if forwarding else "0")
                old = self.forwarding
                self.forwarding = forwarding
                b.undo.append(lambda: setattr(self, "forwarding", old))

            self._run(fn)
        return {"forwarding": self.forwarding, "broker_id": self.broker_id, "name": self.name}

    def serves_here(self, ep: Endpoint) -> bool:
        """Whether `ep`'s far service could be delivered to on this broker."""
        return ep.far_service in self.catalog.services and ep.far_broker in (None, self.broker_id)

    def definitions(self) -> list[tuple[str, dict[str, Any]]]:
        return [(kind_of(d), to_record(d)) for d in self.catalog.user_definitions()]

    # --- dialogs -------------------------------------------------------------------------------

    def apply(self, ops: Sequence[Op], request_id: str | None = None) -> dict[str, Any]:
        """BEGIN DIALOG / SEND / END CONVERSATION / BEGIN CONVERSATION TIMER, any number of each,
        in order, in one transaction. A `request_id` makes a retried call apply once."""
        return self._run(lambda b: self._apply_ops(b, ops, held=frozenset()), request_id)

    def _apply_ops(self, b: _Batch, ops: Sequence[Op], held: frozenset[int]) -> dict[str, Any]:
        handles: list[str] = []
        sent = 0
        for op in ops:
            if isinstance(op, Send):
                sent += self._send(b, op)
            elif isinstance(op, Begin):
                handles.append(self._begin(b, op))
            elif isinstance(op, End):
                self._end(b, op, held)
            elif isinstance(op, Timer):
                self._timer(b, op)
            else:
                raise InvalidArgument(f"{op!r} is not an operation; use Begin, Send, End or Timer")
        return {"handles": handles, "sent": sent}

    def _endpoint(self, handle: str) -> Endpoint:
        ep = self._handles.get(handle) if isinstance(handle, str) else None
        if ep is None:
            raise ConversationNotFound(handle)
        return ep

    def _new_group(self, b: _Batch, queue: str, group_id: str | None = None) -> int:
        g = _Group(self._next_group, group_id or str(uuid.uuid4()), queue)
        self._next_group += 1
        self._add_group(g)
        b.new_groups.append(g)
        return g.no

    def _new_endpoint(self, b: _Batch, **fields: Any) -> Endpoint:
        ep = Endpoint(no=self._next_ep, **fields)
        self._next_ep += 1
        self._add_endpoint(ep)
        b.new_endpoints.append(ep)
        b.new_nos.add(ep.no)
        return ep

    def _begin(self, b: _Batch, op: Begin) -> str:
        svc = self.catalog.service(op.from_service)
        contract = self.catalog.contract(op.contract)
        check_name("service", op.to_service)
        if not isinstance(op.handle, str) or not op.handle or op.handle in self._handles:
            raise InvalidArgument(f"conversation handle {op.handle!r} is empty or already in use")
        if op.lifetime is not None and (
            not isinstance(op.lifetime, int | float) or op.lifetime <= 0
        ):
            raise InvalidArgument(
                f"lifetime must be a positive number of seconds, not {op.lifetime!r}"
            )
        local_target = self.catalog.services.get(op.to_service)
        if (
            local_target is not None
            and op.to_broker in (None, self.broker_id)
            and contract.name not in local_target.contracts
        ):
            raise ContractViolation(
                f"service {op.to_service!r} does not accept contract {contract.name!r}; add it "
                f"to the service's contracts or begin the dialog with one of "
                f"{list(local_target.contracts)}"
            )
        if op.related_conversation is not None:
            group_no = self._endpoint(op.related_conversation).group_no
        elif op.related_group is not None:
            if not isinstance(op.related_group, str) or not op.related_group:
                raise InvalidArgument("related_group must be a conversation group id string")
            group_no = self._group_ids.get(op.related_group) or self._new_group(
                b, svc.queue, op.related_group
            )
        else:
            group_no = self._new_group(b, svc.queue)
        if self._groups[group_no].queue != svc.queue:
            raise InvalidArgument(
                f"conversation group {self._groups[group_no].group_id} belongs to queue "
                f"{self._groups[group_no].queue!r}, but service {svc.name!r} uses queue "
                f"{svc.queue!r}; a group holds dialogs of one queue"
            )
        self._new_endpoint(
            b,
            handle=op.handle,
            conversation_id=str(uuid.uuid4()),
            is_initiator=True,
            service=svc.name,
            far_service=op.to_service,
            contract=contract.name,
            group_no=group_no,
            expires_at=None if op.lifetime is None else b.now + op.lifetime,
            far_broker=op.to_broker,
        )
        return op.handle

    def _send(self, b: _Batch, op: Send) -> int:
        mt = op.message_type
        if mt in SYSTEM_TYPES:
            raise InvalidArgument(
                f"{mt!r} is a system message; use end_conversation or a conversation timer"
            )
        validator = self.catalog.validator(mt)
        limit = self.limits.max_body_bytes
        for body in op.bodies:
            if not isinstance(body, bytes):
                raise InvalidArgument(f"message bodies must be bytes, got {type(body).__name__}")
        biggest = max(map(len, op.bodies), default=0)
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
        for handle in op.handles:
            ep = self._endpoint(handle)
            check_send(ep, self.catalog.contract(ep.contract), mt)
            self._transmit(b, ep, mt, op.bodies)
        return len(op.handles) * len(op.bodies)

    def _far(self, ep: Endpoint) -> Endpoint | None:
        return self._convs.get((ep.conversation_id, not ep.is_initiator))

    def _transmit(self, b: _Batch, ep: Endpoint, mt: str, bodies: Sequence[bytes]) -> None:
        """Send a run of messages from `ep` to its far side (the checks are the caller's)."""
        b.touch(ep)
        first_seq = ep.send_seq
        ep.send_seq += len(bodies)
        after_send(ep)
        far = self._far(ep)
        if (
            far is None
            and ep.no not in self._parked
            and ep.is_initiator
            and first_seq == 0
            and self._routes_here(ep, b.now)
        ):
            far = self._create_target(b, ep)
        if far is None and (ep.no in self._parked or ep.far_broker != self.broker_id):
            # not here (yet): the transmission queue routes it, in order
            self._park(b, ep, mt, bodies, first_seq)
        elif far is None:
            # The far endpoint was cleaned up: tell this side, as the far broker would.
            self._far_gone(b, ep)
        else:
            self._deliver(b, far, mt, bodies, first_seq)

    def _far_gone(self, b: _Batch, ep: Endpoint) -> None:
        """Tell this side its far endpoint no longer exists, as the far broker would."""
        self._enqueue_own(
            b,
            ep,
            ERROR,
            error_body(
                CONVERSATION_CLEANED_UP, "the far endpoint of this conversation no longer exists"
            ),
        )

    def _create_target(self, b: _Batch, ep: Endpoint) -> Endpoint | None:
        svc = self.catalog.services.get(ep.far_service)
        if svc is None or ep.far_broker not in (None, self.broker_id):
            return None
        if ep.contract not in svc.contracts:
            raise ContractViolation(
                f"service {svc.name!r} does not accept contract {ep.contract!r} (its contracts "
                f"changed after the dialog began); end conversation {ep.handle}"
            )
        b.touch(ep)
        ep.far_broker = self.broker_id  # pinned: the far endpoint lives here
        return self.new_target(
            b, ep.conversation_id, svc, ep.service, ep.contract, ep.expires_at, self.broker_id
        )

    def new_target(
        self,
        b: _Batch,
        conversation_id: str,
        svc: Service,
        far_service: str,
        contract: str,
        expires_at: float | None,
        far_broker: str,
    ) -> Endpoint:
        """The target endpoint a dialog's first message creates, in a group of its own."""
        return self._new_endpoint(
            b,
            handle=str(uuid.uuid4()),
            conversation_id=conversation_id,
            is_initiator=False,
            service=svc.name,
            far_service=far_service,
            contract=contract,
            group_no=self._new_group(b, svc.queue),
            state=State.CONVERSING,
            expires_at=expires_at,
            far_broker=far_broker,
        )

    def _park(self, b: _Batch, ep: Endpoint, mt: str, bodies: Sequence[bytes], seq: int) -> None:
        """Hold messages in the transmission queue until their target can be reached."""
        status = (
            "waiting to be sent"
            if not self.serves_here(ep) or not self._routes_here(ep, b.now)
            else f"waiting for service {ep.far_service!r}"
        )
        if not self.serves_here(ep) and ep.far_service not in self.catalog.services:
            status = (
                f"target service {ep.far_service!r} is not on this broker; waiting to be routed "
                "(see its routes)"
            )
        b.transmission += [
            (ep.no, seq + i, mt, body, ep.far_service, ep.far_broker, status, b.now)
            for i, body in enumerate(bodies)
        ]
        if ep.no not in self._parked:
            self._parked.add(ep.no)
            b.undo.append(lambda: self._parked.discard(ep.no))

    def next_hops(self, ep: Endpoint, now: float) -> tuple[Match, list[Hop]]:
        """Where the broker's own routes send `ep`'s messages: the match and the usable next
        hops, best first (a route back to this broker by name is not a hop)."""
        m = match(
            self.routes["routes"],
            ep.far_service,
            ep.far_broker,
            ep.conversation_id,
            now,
            local_broker_id=self.broker_id,
        )
        hops = [] if m.delayed else choose(m, service_is_local=self.serves_here(ep))
        return m, [h for h in hops if h.rank == "local" or h.broker != self.name]

    def _routes_here(self, ep: Endpoint, now: float) -> bool:
        """Whether the broker's own routes deliver `ep`'s dialog on this broker (LOCAL first)."""
        hops = self.next_hops(ep, now)[1]
        return bool(hops) and hops[0].rank == "local"

    def _unpark(self, b: _Batch, service: str) -> None:
        """A service appeared (or changed): deliver what waited for it here, in order."""
        eps = {row[1] for row in self.store.transmission_for(service)}
        for ep_no in eps:
            ep = self._eps.get(ep_no)
            if ep is None:
                self.store.delete_endpoint_transmission(ep_no)
            elif self._routes_here(ep, b.now):
                self._deliver_parked(b, ep)

    def _deliver_parked(self, b: _Batch, ep: Endpoint) -> None:
        """Deliver an endpoint's waiting transmission rows to its far side on this broker."""
        rows = self.store.endpoint_transmission(ep.no)
        self._parked.discard(ep.no)
        b.undo.append(lambda: self._parked.add(ep.no))
        self.store.delete_endpoint_transmission(ep.no)
        far = self._far(ep)
        if far is None and (not rows or rows[0][2] != 0 or not ep.is_initiator):
            # the far endpoint was here and is gone (cleaned up): never start it mid-dialog
            self._far_gone(b, ep)
            return
        if far is None:
            svc = self.catalog.services.get(ep.far_service)
            if svc is None or ep.contract not in svc.contracts:
                self._enqueue_own(
                    b,
                    ep,
                    ERROR,
                    error_body(
                        CONTRACT_NOT_ACCEPTED,
                        f"service {ep.far_service!r} does not accept contract {ep.contract!r}",
                    ),
                )
                return
            far = self._create_target(b, ep)
        for _tid, _ep, seq, mt, body, _at in rows:
            self._deliver(b, far, mt, [body], seq)

    def _refresh_parked(self, b: _Batch, ep_nos: Iterable[int]) -> list[int]:
        """Endpoints whose transmission rows are all gone stop being parked (after commit);
        returns them."""
        done = [no for no in set(ep_nos) if not self.store.has_transmission(no)]
        b.after.append(lambda: self._parked.difference_update(done))
        return done

    def _deliver(
        self, b: _Batch, far: Endpoint, mt: str, bodies: Sequence[bytes], first_seq: int
    ) -> None:
        """Messages arrive at endpoint `far` (on this broker), in sequence."""
        b.touch(far)
        if first_seq < far.recv_seq:
            return  # a resend of what already arrived: dropped (delivered once)
        far.recv_seq = first_seq + len(bodies)
        if far.state is State.CLOSED:
            return
        if self._echoes(far, mt):
            self._transmit(b, far, ECHO, bodies)
            return
        on_arrival(far, mt)
        if far.state is State.CLOSED:
            self._close(b, far)  # both sides have now ended: schedule its purge
        if self._echoes(far, None) and far.state is not State.CONVERSING:
            # The broker answers Echo dialogs itself, so it also ends them itself.
            self._close(b, far)
            return
        self._enqueue(b, far, mt, bodies, first_seq)

    def _echoes(self, ep: Endpoint, mt: str | None) -> bool:
        """Whether the broker itself answers this endpoint (a target on the Echo contract)."""
        return not ep.is_initiator and ep.contract == ECHO_CONTRACT and (mt is None or mt == ECHO)

    def _enqueue(
        self, b: _Batch, ep: Endpoint, mt: str, bodies: Sequence[bytes], first_seq: int
    ) -> None:
        first_id = self._next_msg
        self._next_msg += len(bodies)
        now, g = b.now, ep.group_no
        at = len(b.messages)
        b.messages += [
            (first_id + i, g, ep.no, first_seq + i, mt, body, 0, now, now)
            for i, body in enumerate(bodies)
        ]
        nbytes = sum(map(len, bodies)) + ROW_OVERHEAD * len(bodies)
        b.arrivals.append((self._groups[g].queue, g, first_id, len(bodies), at, nbytes))

    def _enqueue_own(self, b: _Batch, ep: Endpoint, mt: str, body: bytes) -> None:
        """A message the broker itself puts on this endpoint's queue (timer, error)."""
        b.touch(ep)
        if mt == ERROR:
            on_arrival(ep, mt)
            if ep.state is State.CLOSED:
                self._close(b, ep)
        self._enqueue(b, ep, mt, [body], -1)

    def _far_exists(self, ep: Endpoint, far: Endpoint | None) -> bool:
        """Whether this dialog has a far endpoint to tell: here, still on its way (messages in
        the transmission queue), or on a broker that has answered (its id is pinned)."""
        return (
            far is not None or ep.no in self._parked or ep.far_broker not in (None, self.broker_id)
        )

    def _end(self, b: _Batch, op: End, held: frozenset[int]) -> None:
        ep = self._endpoint(op.handle)
        lock = self.locks.by_group.get(ep.group_no)
        if lock is not None and ep.group_no not in held:
            raise GroupLocked(
                f"conversation {ep.handle} is in a group locked by receive {lock.lock_id}; end "
                "it in that receive's commit, or after it"
            )
        self._remove_messages(b, ep)
        if op.cleanup:
            self.store.delete_endpoint_transmission(ep.no)
            b.touch(ep)
            ep.state = State.CLOSED
            b.dead_endpoints.append(ep)
            return
        far = self._far(ep)
        plan = plan_end(ep, op.error_code, op.description, far_exists=self._far_exists(ep, far))
        if plan.notify is not None:
            self._transmit(b, ep, plan.notify, [plan.body])
        b.touch(ep)
        ep.state = plan.new_state
        if (
            ep.state is State.DISCONNECTED_OUTBOUND
            and far is not None
            and (far.state is State.CLOSED)
        ):
            self._close(b, ep)  # the far side closed on our EndDialog (an Echo target does)
        if ep.state is State.CLOSED:
            self._close(b, ep)
            if far is not None and far.state is State.DISCONNECTED_OUTBOUND:
                self._close(b, far)  # both sides have ended

    def _close(self, b: _Batch, ep: Endpoint) -> None:
        b.touch(ep)
        ep.state = State.CLOSED
        ep.closed_at = b.now
        ep.timer_at = None

    def _remove_messages(self, b: _Batch, ep: Endpoint) -> None:
        self.cache.drop(ep.group_no)
        n = self.store.delete_conversation_messages(ep.group_no, ep.no)
        if n:
            b.removals.append((self._groups[ep.group_no].queue, ep.group_no, n, False))

    def _timer(self, b: _Batch, op: Timer) -> None:
        ep = self._endpoint(op.handle)
        if not isinstance(op.timeout, int | float) or op.timeout < 0:
            raise InvalidArgument(f"timer timeout must be >= 0 seconds, not {op.timeout!r}")
        if ep.state is State.CLOSED:
            raise ConversationNotFound(op.handle)
        b.touch(ep)
        ep.timer_at = b.now + op.timeout if op.timeout > 0 else None

    # --- receive, commit, rollback --------------------------------------------------------------

    def receive(
        self,
        queue: str,
        *,
        max_groups: int = 1,
        top: int | None = None,
        group_id: str | None = None,
        handle: str | None = None,
        lock_id: str | None = None,
        owner: str | None = None,
        lease_s: float | None = None,
    ) -> list[ReceivedGroup]:
        """RECEIVE [TOP (n)] from up to `max_groups` conversation groups, each locked on its own.
        Returns [] when nothing is waiting (the actor does the waiting)."""
        if not isinstance(max_groups, int) or max_groups < 1:
            raise InvalidArgument(f"max_groups must be an int >= 1, not {max_groups!r}")
        if top is not None and (not isinstance(top, int) or top < 1):
            raise InvalidArgument(f"top must be None or an int >= 1, not {top!r}")
        if lease_s is not None and (not isinstance(lease_s, int | float) or lease_s <= 0):
            raise InvalidArgument(f"lease_s must be > 0 seconds, not {lease_s!r}")
        q = self.catalog.queue(queue)
        if not q.enabled:
            raise QueueDisabled(queue)
        idx = self._index.setdefault(queue, QueueIndex())
        now = self.clock()
        if lock_id is not None:
            lock = self._held([lock_id])[0]
            if lock.queue != queue:
                raise InvalidArgument(f"lock {lock_id} is on queue {lock.queue!r}, not {queue!r}")
            rows = self.cache.take(lock.group, lock.count, top)
            if rows is None:
                rows = self.store.fetch_group(lock.group, top, lock.last_id)
            return [self._take(lock, rows)]
        target = self._target_group(queue, group_id, handle)
        out: list[ReceivedGroup] = []
        while len(out) < max_groups:
            if target is not None:
                key = idx.take(target)
                if key is None:
                    break
                g = target
            else:
                popped = idx.pop_ready()
                if popped is None:
                    break
                key, g = popped
            rows = self.cache.take(g, 0, top)
            if rows is None:
                rows = self.store.fetch_group(g, top)
            if not rows:  # the index was ahead of the store; it is now corrected
                idx.remove(g, idx.pending.get(g, 0))
                continue
            lock = self.locks.acquire(g, queue, owner, now, lease_s, key, rows[0][0], 0, 0)
            out.append(self._take(lock, rows))
            if target is not None:
                break
        return out

    def _target_group(self, queue: str, group_id: str | None, handle: str | None) -> int | None:
        if handle is not None:
            g = self._endpoint(handle).group_no
        elif group_id is not None:
            g = self._group_ids.get(group_id)
            if g is None:
                raise InvalidArgument(f"no conversation group {group_id!r} on this broker")
        else:
            return None
        if self._groups[g].queue != queue:
            raise InvalidArgument(
                f"conversation group {self._groups[g].group_id} is on queue "
                f"{self._groups[g].queue!r}, not {queue!r}"
            )
        return g

    def _take(self, lock: Lock, rows: list[tuple[Any, ...]]) -> ReceivedGroup:
        """Put received rows under `lock` and shape them for the caller."""
        if rows:
            if lock.count == 0:
                lock.first_id = rows[0][0]
            lock.last_id = rows[-1][0]
            lock.count += len(rows)
            lock.audit.append(rows)
        eps = self._eps
        infos = {}
        for no in {r[1] for r in rows}:
            ep = eps[no]
            infos[no] = (ep.handle, ep.conversation_id, ep.service, ep.far_service, ep.contract)
        g = self._groups[lock.group]
        return ReceivedGroup(g.group_id, lock.lock_id, self.store.group_state(g.no), infos, rows)

    def _held(self, lock_ids: Iterable[str]) -> list[Lock]:
        locks, missing = [], []
        for lid in lock_ids:
            lock = self.locks.get(lid) if isinstance(lid, str) else None
            (locks if lock else missing).append(lock or lid)
        if missing:
            raise LockNotHeld(
                f"lock(s) {', '.join(map(str, missing))} are not held (committed, rolled back, "
                "expired or lost in a broker restart); nothing was applied: receive again"
            )
        return locks

    def get_conversation_group(
        self, queue: str, owner: str | None = None, lease_s: float | None = None
    ) -> tuple[str, str] | None:
        """GET CONVERSATION GROUP: lock the next group with waiting messages without taking
        any; returns (group_id, lock_id), or None. Receive from it with `lock_id=`."""
        q = self.catalog.queue(queue)
        if not q.enabled:
            raise QueueDisabled(queue)
        popped = self._index.setdefault(queue, QueueIndex()).pop_ready()
        if popped is None:
            return None
        key, g = popped
        lock = self.locks.acquire(g, queue, owner, self.clock(), lease_s, key, 0, 0, 0)
        return self._groups[g].group_id, lock.lock_id

    def settle(
        self,
        commit: Sequence[str] = (),
        rollback: Sequence[str] = (),
        ops: Sequence[Op] = (),
        states: Mapping[str, bytes | None] | None = None,
        request_id: str | None = None,
    ) -> dict[str, Any]:
        """Commit some received groups and roll back others, in one call.

        Committing removes the received messages (or marks them, with retention), applies `ops`
        (sends, ends, begins, timers made while holding the locks) and writes each group's state,
        all in one transaction. Rolling back returns the messages to the queue."""
        if request_id is not None and self.store.request_result(request_id) is not None:
            return self._run(lambda b: None, request_id)  # already applied: same answer
        named = [*commit, *rollback]
        if len(set(named)) != len(named):
            twice = sorted({x for x in named if named.count(x) > 1})
            raise InvalidArgument(f"lock(s) {twice} are named more than once in one settle")
        committing = self._held(commit)
        rolling = self._held(rollback)
        by_gid = {self._groups[lk.group].group_id: lk for lk in committing}
        states = dict(states or {})
        for gid in states:
            if gid not in by_gid:
                raise LockNotHeld(
                    f"state for conversation group {gid!r} needs that group's lock in `commit`"
                )
            if states[gid] is not None and not isinstance(states[gid], bytes):
                raise InvalidArgument("group state must be bytes or None")

        def fn(b: _Batch) -> dict[str, Any]:
            audit = []
            for lk in committing:
                retain = self.catalog.queue(lk.queue).retention
                if lk.count:
                    self.store.remove_received(lk.group, lk.first_id, lk.last_id, retain)
                    b.removals.append((lk.queue, lk.group, lk.count, True))
                    audit.append(self._audit_record(lk, b.now))
            result = self._apply_ops(b, ops, held=frozenset(by_gid[g].group for g in by_gid))
            if states:
                self.store.set_group_states((s, by_gid[g].group) for g, s in states.items())
            if audit:
                self.store.insert_audit(b.now, msgpack.packb(audit))
            b.after.append(lambda: self._release(committing, committed=True))
            return {**result, "committed": sum(lk.count for lk in committing)}

        result = self._run(fn, request_id)
        self._rollback(rolling, "rolled back")
        return result

    def _audit_record(self, lk: Lock, now: float) -> list[Any]:
        """One committed group's delivery records, as columns (cheap to build and to store)."""
        rows = lk.audit[0] if len(lk.audit) == 1 else [r for chunk in lk.audit for r in chunk]
        _ids, ep_nos, seqs, types, _bodies, sent, arrived = zip(*rows, strict=True)
        convs = {}
        for no in set(ep_nos):
            ep = self._eps[no]
            convs[no] = (ep.conversation_id, not ep.is_initiator)  # sent by the initiator?
        return [
            self.broker_id,
            lk.queue,
            lk.received_at,
            now,
            convs,
            ep_nos,
            seqs,
            types,
            sent,
            arrived,
        ]

    def _release(self, locks: Sequence[Lock], committed: bool) -> None:
        for lk in locks:
            self.locks.release(lk)
            idx = self._index.setdefault(lk.queue, QueueIndex())
            if committed:
                self.poison.committed(lk.queue)
                idx.make_ready(lk.group, lk.last_id + 1)
            else:
                idx.make_ready(lk.group, lk.ready_key)
            self.notify(lk.queue)

    def _rollback(self, locks: Sequence[Lock], why: str) -> None:
        """Return locked groups' messages to their queues; count rollbacks toward poison."""
        if not locks:
            return
        self._release(locks, committed=False)
        for lk in locks:
            q = self.catalog.queues.get(lk.queue)
            if q is None or not q.enabled:
                continue
            if self.poison.rolled_back(q.name, q.poison_limit):
                self._disable_poisoned(q, why)

    def _disable_poisoned(self, q: Queue, why: str) -> None:
        n = self.poison.count(q.name)
        detail = (
            f"{n} receives in a row were {why} (poison_limit={q.poison_limit}); "
            "a message on it cannot be processed"
        )

        def fn(b: _Batch) -> None:
            new = dataclasses.replace(q, enabled=False)
            self.store.put_definition("queue", q.name, to_record(new))
            self.catalog.add(new)
            b.undo.append(lambda: self.catalog.add(q))
            self._event(b, "QueueDisabled", q.name, detail)

        self._run(fn)

    def release_owner(self, owner: str) -> int:
        """The holder `owner` died: roll back every lock it held. Returns how many."""
        locks = self.locks.held_by(owner)
        self._rollback(locks, "abandoned by a reader that died")
        return len(locks)

    def move_conversation(self, handle: str, group_id: str) -> None:
        """MOVE CONVERSATION to another group of the same queue. Neither group may be locked."""
        ep = self._endpoint(handle)
        new = self._group_ids.get(group_id) if isinstance(group_id, str) else None
        if new is None:
            raise InvalidArgument(f"no conversation group {group_id!r} on this broker")
        old = ep.group_no
        if self._groups[new].queue != self._groups[old].queue:
            raise InvalidArgument(
                f"group {group_id} is on queue {self._groups[new].queue!r}; conversation "
                f"{handle} is on {self._groups[old].queue!r}: a group holds one queue's dialogs"
            )
        for g in (old, new):
            if self.locks.is_locked(g):
                raise GroupLocked(
                    f"conversation group {self._groups[g].group_id} is locked by a receive; "
                    "move the conversation after it commits or rolls back"
                )
        if old == new:
            return

        def fn(b: _Batch) -> None:
            ids = self.store.move_messages(ep.no, old, new)
            b.touch(ep)
            ep.group_no = new
            self._groups[old].members -= 1
            self._groups[new].members += 1
            b.undo.append(lambda: self._move_members(new, old))
            if ids:
                queue = self._groups[old].queue
                b.removals.append((queue, old, len(ids), False))
                b.arrivals.append((queue, new, ids[0], len(ids), -1, 0))
            self.cache.drop(old)

        self._run(fn)

    def _move_members(self, frm: int, to: int) -> None:
        self._groups[frm].members -= 1
        self._groups[to].members += 1

    # --- time: timers, lifetimes, leases, purges -------------------------------------------------

    def _schedule(self, ep: Endpoint) -> None:
        for due, kind in ((ep.timer_at, "timer"), (ep.expires_at, "lifetime")):
            if due is not None:
                heapq.heappush(self._timers, (due, ep.no, kind))
        if ep.closed_at is not None:
            due = ep.closed_at + self.limits.closed_retention_s
            heapq.heappush(self._timers, (due, ep.no, "purge"))

    def tick(self) -> float | None:
        """Fire what is due: conversation timers, lifetime expiries, expired leases, purges.
        Returns when something next falls due (None: nothing scheduled)."""
        now = self.clock()
        due: list[tuple[int, str, float]] = []
        while self._timers and self._timers[0][0] <= now:
            at, no, kind = heapq.heappop(self._timers)
            ep = self._eps.get(no)
            if ep is None:
                continue
            current = {
                "timer": ep.timer_at,
                "lifetime": ep.expires_at,
                "purge": ep.closed_at and ep.closed_at + self.limits.closed_retention_s,
            }
            if kind == "purge-retry" or current[kind] == at:
                due.append((no, kind, at))
        if due:
            try:
                self._run(lambda b: self._fire(b, due))
            except Exception:
                for no, kind, at in due:  # not lost: they fire on a later tick
                    heapq.heappush(self._timers, (at, no, kind))
                raise
        expired = self.locks.expired(now)
        if expired:
            self._rollback(expired, "abandoned when their lease ran out")
        if now >= self._next_prune:
            self._prune(now)
        nexts = [
            t
            for t in (
                self._timers[0][0] if self._timers else None,
                self.locks.next_expiry(),
                self._next_prune,
            )
            if t is not None
        ]
        return min(nexts) if nexts else None

    def _fire(self, b: _Batch, due: list[tuple[int, str, float]]) -> None:
        purged: set[int] = set()
        for no, kind, _at in due:
            ep = self._eps[no]
            if kind == "timer" and ep.state is not State.CLOSED:
                b.touch(ep)
                ep.timer_at = None
                self._enqueue_own(b, ep, DIALOG_TIMER, b"")
            elif kind == "lifetime" and ep.state in (
                State.STARTED_OUTBOUND,
                State.CONVERSING,
                State.DISCONNECTED_INBOUND,
            ):
                b.touch(ep)
                ep.expires_at = None
                self._enqueue_own(
                    b, ep, ERROR, error_body(LIFETIME_EXPIRED, "the dialog's lifetime ran out")
                )
                self.store.delete_endpoint_transmission(ep.no)  # nothing more goes out
            elif kind.startswith("purge") and (
                self.locks.is_locked(ep.group_no) or self.store.has_transmission(ep.no)
            ):
                # locked, or its last messages (an EndDialog, an Error) are still on their way
                retry = b.now + self.limits.closed_retention_s
                b.after.append(
                    lambda no=no, at=retry: heapq.heappush(self._timers, (at, no, "purge-retry"))
                )
            elif kind in ("purge", "purge-retry"):
                self._remove_messages(b, ep)
                self.store.delete_endpoint_transmission(ep.no)
                b.dead_endpoints.append(ep)
                purged.add(ep.group_no)
        empty = [
            g
            for g in purged
            if self._groups[g].members == sum(1 for ep in b.dead_endpoints if ep.group_no == g)
            and not self._index_of(g).pending.get(g)
        ]
        if empty:
            self.store.delete_groups(empty)
            b.after.append(lambda: [self._forget_group(g) for g in empty])

    def _forget_group(self, g: int) -> None:
        grp = self._groups.pop(g, None)
        if grp is not None:
            self._group_ids.pop(grp.group_id, None)

    def _prune(self, now: float) -> None:
        with self.store.tx():
            self.store.prune("audit", self.limits.audit_rows)
            self.store.prune("events", self.limits.event_rows)
            self.store.prune_requests(now - self.limits.request_retention_s)
        self._next_prune = now + 60.0

    # --- views (rows built in actors/views.py) ---------------------------------------------------

    def depth(self, queue: str) -> tuple[int, int]:
        """(messages waiting or locked on a queue, messages removed from it so far)."""
        idx = self._index.get(queue)
        return (idx.depth, idx.removed) if idx else (0, 0)

    def endpoints_view(self) -> list[dict[str, Any]]:
        """sys.conversation_endpoints."""
        return views.endpoints(self)

    def queue_view(self, queue: str, limit: int = 1000) -> list[dict[str, Any]]:
        """The rows of one queue, in queue order, with each message's status."""
        return views.queue(self, queue, limit)

    def queues_view(self) -> dict[str, dict[str, Any]]:
        """Per queue: depth, locked groups, enabled, and the poison count."""
        return views.queues(self)

    def groups_view(self, queue: str | None = None) -> list[dict[str, Any]]:
        """Conversation groups: queue, waiting messages, lock, and the group's state."""
        return views.groups(self, queue)

    def transmission_view(self, limit: int = 1000) -> list[dict[str, Any]]:
        """sys.transmission_queue: messages waiting to leave this broker, and why."""
        return views.transmission(self, limit)

    def events_view(self, after_id: int = 0, limit: int = 1000) -> list[dict[str, Any]]:
        return views.events(self, after_id, limit)

    def audit_view(self, after_id: int = 0, limit: int = 1000) -> list[dict[str, Any]]:
        """Delivery records, one per committed message, oldest first."""
        return views.audit(self, after_id, limit)


def _due_times(ep: Endpoint) -> tuple[float | None, float | None, float | None]:
    return ep.timer_at, ep.expires_at, ep.closed_at


def _endpoint_row(ep: Endpoint) -> tuple[Any, ...]:
    return (
        ep.no,
        ep.handle,
        ep.conversation_id,
        int(ep.is_initiator),
        ep.service,
        ep.far_service,
        ep.contract,
        ep.group_no,
        ep.state.value,
        ep.send_seq,
        ep.recv_seq,
        ep.expires_at,
        ep.timer_at,
        ep.far_broker,
        ep.closed_at,
    )
