"""Every verb of a broker handle, written once, and the typed shape both handles have.

`Verbs` turns a call into (method, wire arguments) and hands it to `_call`, which the Ray handle
(`actors.remote.client.Broker`) sends to the broker actor and the in-process handle
(`actors.client.local.LocalBroker`) runs on its own event loop: the same encoding, the same service
methods (`actors.client.handle.BrokerHandle`: the typed surface both implement). Plain Python,
no Ray.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from actors.calls.envelope import (
    Begin,
    End,
    Op,
    ReceivedGroup,
    Send,
    Timer,
    check_call_size,
    pack_ops,
    unpack_received,
)
from actors.errors import InvalidArgument, InvalidDefinition, shown
from actors.ids import new_request_id
from actors.model import checks
from actors.model.bodies import MAX_DEFINITION_DEPTH, too_deep
from actors.model.catalog import Definition, check_name, kind_of, to_record
from actors.model.limits import Limits

LockRef = ReceivedGroup | str  # a received group, or its lock id


def lock_ids(groups: Iterable[LockRef] | LockRef) -> list[str]:
    """Lock ids from received groups or lock ids (one or many)."""
    if isinstance(groups, (ReceivedGroup, str)):
        groups = [groups]
    out = []
    for g in checks.items("groups to commit or roll back", groups):
        if isinstance(g, ReceivedGroup):
            out.append(g.lock_id)
        elif isinstance(g, str):
            out.append(g)
        else:
            raise InvalidArgument(f"expected received groups or lock ids, got {type(g).__name__}")
    return out


def _request_id(request_id: str | None) -> str:
    """The caller's request id (a retried task passes the same one, so it applies once) or a
    fresh one."""
    return _own_request_id(request_id) or new_request_id()


def _own_request_id(request_id: str | None) -> str | None:
    """The caller's request id, checked, or None. A change sent without one is recorded under
    its place in the handle's order (actors.calls.ordering.call_key), which the handle's retries of
    the call share: one record per coalesced batch instead of one per call."""
    if request_id is None:
        return None
    if not isinstance(request_id, str) or not request_id or len(request_id) > 200:
        raise InvalidArgument(
            f"request_id must be a non-empty string of at most 200 characters, not {request_id!r}"
        )
    return request_id


def _kind(kind: str | type) -> str:
    """A catalog kind from its name ("queue") or its class (Queue)."""
    if isinstance(kind, type):
        try:
            return kind_of(kind.__new__(kind))
        except KeyError:
            pass
    elif isinstance(kind, str):
        return kind
    raise InvalidArgument(
        f"{kind!r} is not a catalog kind: pass MessageType, Contract, Queue or Service "
        "(or their names: 'message_type', 'contract', 'queue', 'service')"
    )


def _route_table(table: object) -> None:
    if not isinstance(table, str):
        raise InvalidArgument(f"route table must be 'routes' or 'instance', not {shown(table)}")


class Verbs:
    """Every verb, written once. `_call` is sync in the handles and a coroutine in their `aio`."""

    name: str
    # the broker's max_call_bytes, as far as this handle knows it (a handle that starts its
    # broker with another limit sets it): calls over it are refused before they are sent
    max_call_bytes: int = Limits.max_call_bytes

    def _call(
        self, method: str, *args: Any, post: Callable[[Any], Any] | None = None
    ) -> Any:  # pragma: no cover - each handle supplies it
        raise NotImplementedError

    def _pack(self, ops: Sequence[Op]) -> bytes:
        """Operations for the wire, once checked: each op checked itself when it was made."""
        ops = checks.items("ops", ops)
        check_call_size(ops, self.max_call_bytes)
        return pack_ops(ops)

    def _owner(self) -> tuple[str, Any] | None:
        """Who holds the locks a receive takes (None: the call's own request)."""
        return None

    # --- catalog ---------------------------------------------------------------------------------

    def create(self, definition: Definition, *, request_id: str | None = None) -> Any:
        """CREATE a MessageType, Contract, Queue or Service on this broker."""
        try:
            kind = kind_of(definition)
        except KeyError:
            raise InvalidArgument(
                f"cannot create {definition!r}: pass a MessageType, Contract, Queue or Service"
            ) from None
        return self._call("define", kind, to_record(definition), _request_id(request_id))

    def alter(
        self, kind: str | type, name: str, *, request_id: str | None = None, **changes: Any
    ) -> Any:
        """ALTER: change fields of a definition, `alter(Queue, "Q", enabled=True)`."""
        kind = _kind(kind)
        check_name(kind.replace("_", " "), name)
        if too_deep(changes, MAX_DEFINITION_DEPTH + 1):
            raise InvalidDefinition(
                f"changes to {kind} {name!r} nest lists/dicts more than {MAX_DEFINITION_DEPTH} "
                "levels deep; flatten them"
            )
        return self._call("alter", kind, name, changes, _request_id(request_id))

    def drop(self, kind: str | type, name: str, *, request_id: str | None = None) -> Any:
        """DROP a definition, `drop(Queue, "Q")`."""
        kind = _kind(kind)
        check_name(kind.replace("_", " "), name)
        return self._call("drop", kind, name, _request_id(request_id))

    # --- dialogs ---------------------------------------------------------------------------------

    def apply(self, ops: Sequence[Op], *, request_id: str | None = None) -> Any:
        """Begin, Send, End and Timer operations, in order, in one call and one transaction.
        Returns {"handles": [handles begun], "sent": messages sent}. A retried call with the same
        `request_id` is applied once."""
        return self._call("apply", self._pack(ops), _own_request_id(request_id))

    def begin_dialog(
        self,
        from_service: str,
        to_service: str,
        contract: str = "DEFAULT",
        *,
        related_conversation: str | None = None,
        related_group: str | None = None,
        lifetime: float | None = None,
        to_broker: str | None = None,
        encryption: bool = True,
    ) -> Any:
        """BEGIN DIALOG; returns the new conversation handle (`encryption`: see `Begin`)."""
        op = Begin(
            from_service,
            to_service,
            contract,
            to_broker=to_broker,
            related_conversation=related_conversation,
            related_group=related_group,
            lifetime=lifetime,
            encryption=encryption,
        )
        return self._call("apply", self._pack([op]), None, post=lambda r: r["handles"][0])

    def send(self, handles: str | Sequence[str], message_type: str, body: bytes = b"") -> Any:
        """SEND one message on one or several conversations. For many, use `apply([Send(...)])`."""
        return self.apply([Send(handles, message_type, body)])

    def end_conversation(
        self, handle: str, *, error: int | None = None, description: str = "", cleanup: bool = False
    ) -> Any:
        """END CONVERSATION [WITH ERROR = error DESCRIPTION = description | WITH CLEANUP]."""
        return self.apply([End(handle, error, description, cleanup)])

    def begin_conversation_timer(self, handle: str, timeout: float) -> Any:
        """BEGIN CONVERSATION TIMER: a DialogTimer message arrives after `timeout` seconds."""
        return self.apply([Timer(handle, timeout)])

    def move_conversation(self, handle: str, group_id: str) -> Any:
        return self._call("move_conversation", handle, group_id)

    # --- receive and commit ----------------------------------------------------------------------

    def receive(
        self,
        queue: str,
        *,
        wait: float = 0.0,
        max_groups: int = 1,
        top: int | None = None,
        group_id: str | None = None,
        handle: str | None = None,
        lock: LockRef | None = None,
        lease: float | None = None,
        commit: Iterable[LockRef] = (),
        rollback: Iterable[LockRef] = (),
        ops: Sequence[Op] = (),
        states: Mapping[str, bytes | None] | None = None,
        reader: str | None = None,
    ) -> Any:
        """RECEIVE: messages of up to `max_groups` conversation groups (all of each group's
        waiting messages, or the first `top`), each group locked until commit or rollback.
        Waits up to `wait` seconds for messages; returns [] if none came.

        `commit`/`rollback`/`ops`/`states` settle earlier groups first, in the same call, exactly
        as `settle` does (a reader loop's commit-then-receive as one round trip); if that part
        fails the error has `during == "settle"`. `reader` is set by activated readers."""
        checks.receive(max_groups, top, lease)
        checks.seconds("wait", wait, zero=True)
        options: dict[str, Any] = {
            "max_groups": max_groups,
            "top": top,
            "group_id": group_id,
            "handle": handle,
            "lease_s": lease,
        }
        if lock is not None:
            if not isinstance(lock, (ReceivedGroup, str)):
                raise InvalidArgument(
                    f"lock must be one received group or one lock id, not {type(lock).__name__}"
                )
            options["lock_id"] = lock_ids(lock)[0]
        settle = None
        commit, rollback = lock_ids(commit), lock_ids(rollback)
        if commit or rollback or ops or states:
            settle = (commit, rollback, self._pack(ops), checks.states(states), None)
        return self._call(
            "receive", queue, wait, options, self._owner(), settle, reader, post=unpack_received
        )

    def get_conversation_group(
        self, queue: str, *, wait: float = 0.0, lease: float | None = None
    ) -> Any:
        """GET CONVERSATION GROUP: lock the next group with messages, taking none of them.
        Returns (group_id, lock_id) or None; receive from it with `lock=lock_id`."""
        checks.seconds("wait", wait, zero=True)
        checks.seconds("lease", lease, none=True)
        return self._call(
            "get_conversation_group",
            queue,
            wait,
            lease,
            self._owner(),
            post=lambda r: None if r is None else tuple(r),
        )

    def settle(
        self,
        commit: Iterable[LockRef] = (),
        rollback: Iterable[LockRef] = (),
        *,
        ops: Sequence[Op] = (),
        states: Mapping[str, bytes | None] | None = None,
        request_id: str | None = None,
    ) -> Any:
        """Commit some received groups and roll back others in one call. Committing removes the
        received messages, applies `ops` and writes `states` ({group_id: bytes}) atomically."""
        return self._call(
            "settle",
            lock_ids(commit),
            lock_ids(rollback),
            self._pack(ops),
            checks.states(states),
            _own_request_id(request_id),
        )

    def commit(
        self,
        groups: Iterable[LockRef] | LockRef,
        *,
        ops: Sequence[Op] = (),
        states: Mapping[str, bytes | None] | None = None,
        request_id: str | None = None,
    ) -> Any:
        return self.settle(lock_ids(groups), (), ops=ops, states=states, request_id=request_id)

    def rollback(
        self, groups: Iterable[LockRef] | LockRef, *, request_id: str | None = None
    ) -> Any:
        return self.settle((), lock_ids(groups), request_id=request_id)

    # --- routes ----------------------------------------------------------------------------------

    def create_route(
        self,
        name: str,
        service_name: str | None = None,
        broker_instance: str | None = None,
        address: str = "LOCAL",
        mirror_address: str | None = None,
        lifetime: float | None = None,
        draining: bool = False,
        *,
        table: str = "routes",
        request_id: str | None = None,
    ) -> Any:
        """CREATE ROUTE: in this broker's own routes (`table="routes"`, for dialogs begun here)
        or its instance routes (`table="instance"`, for messages arriving from other brokers).
        `address` is "LOCAL", "TRANSPORT" or "ray://<broker>"; `lifetime` in seconds from now,
        by the broker's clock; `draining=True`: the route takes no new dialogs but still serves
        those pinned to its broker instance. Returns warnings (e.g. the multiple-target-endpoints
        hazard)."""
        record = {
            "name": name,
            "service_name": service_name,
            "broker_instance": broker_instance,
            "address": address,
            "mirror_address": mirror_address,
            "lifetime": lifetime,
            "draining": draining,
        }
        _route_table(table)
        checks.flag("draining", draining)
        return self._call("create_route", table, record, _request_id(request_id))

    def alter_route(
        self, name: str, *, table: str = "routes", request_id: str | None = None, **changes: Any
    ) -> Any:
        """ALTER ROUTE: change fields of a route (`lifetime` in seconds from now)."""
        _route_table(table)
        check_name("route", name)
        return self._call("alter_route", table, name, changes, _request_id(request_id))

    def drop_route(self, name: str, *, table: str = "routes", request_id: str | None = None) -> Any:
        _route_table(table)
        check_name("route", name)
        return self._call("drop_route", table, name, _request_id(request_id))

    def routes(self, table: str = "routes") -> Any:
        _route_table(table)
        return self._call("view", "routes", {"table": table})

    def configure(self, *, forwarding: bool | None = None) -> Any:
        """Broker settings: `forwarding=True` relays arriving messages by the instance routes."""
        return self._call("configure", forwarding)

    def retry_transmission(self, conversation_handle: str | None = None) -> Any:
        """Send the transmission queue's waiting messages (of one dialog, or all) now, not after
        their backoff; returns how many were waiting. Recorded as a TransmissionRetried event."""
        if conversation_handle is not None:
            check_name("conversation handle", conversation_handle)
        return self._call("retry_transmission", conversation_handle)

    def record_event(self, kind: str, subject: str, detail: str = "") -> Any:
        """Record an operator event (what a person or a tool did, for the next one to read in
        `events()`): `kind` a name, `subject` what it concerns, `detail` what happened."""
        return self._call("record_event", kind, subject, detail)

    # --- views -----------------------------------------------------------------------------------

    def info(self) -> Any:
        """{"name", "broker_id", "path", "durability", "limits", ...}."""
        return self._call("info")

    def definitions(self) -> Any:
        return self._call("view", "definitions", {})

    def endpoints(self, after: str | None = None, limit: int = 10_000) -> Any:
        """sys.conversation_endpoints, as a list of dicts in handle order: the first `limit`
        whose handle sorts after `after` (a broker may hold millions: pass the last handle of
        a page for the next; `dialogs()` counts them all)."""
        return self._call("view", "endpoints", {"after": after, "limit": limit})

    def rerunnable(self, after: str | None = None, limit: int = 10_000) -> Any:
        """The dialogs begun with `if_absent` (`Begin`) that a re-run of their Begin would find,
        live or ended and remembered, as [{"conversation_handle", "ended_at"}] in handle order:
        the first `limit` after handle `after` (None while the dialog lives)."""
        return self._call("view", "rerunnable", {"after": after, "limit": limit})

    def dialogs(self) -> Any:
        """{"by_state": {state: endpoints}, "secured": n, "counted_at": t}: how many dialog
        endpoints are in each state. On a broker with millions, the count may be a little old
        (`counted_at`): counting is kept to a twentieth of the broker's time."""
        return self._call("view", "dialogs", {})

    def queue(self, name: str, limit: int = 1000) -> Any:
        """The messages of one queue, in queue order, with their status."""
        return self._call("view", "queue", {"queue": name, "limit": limit})

    def queues(self) -> Any:
        """Per queue: depth, locked groups, enabled, poison count, readers."""
        return self._call("view", "queues", {})

    def groups(
        self, queue: str | None = None, after: str | None = None, limit: int = 10_000
    ) -> Any:
        """Conversation groups (of `queue`) with their waiting count, lock and state, in group
        id order: the first `limit` whose id sorts after `after` (pass the last of a page)."""
        return self._call("view", "groups", {"queue": queue, "after": after, "limit": limit})

    def transmission_queue(self, limit: int = 1000) -> Any:
        return self._call("view", "transmission_queue", {"limit": limit})

    def events(self, after_id: int = 0, limit: int = 1000, newest: bool = False) -> Any:
        """Operator events (QueueDisabled, QueueEnabled, ...) after `after_id`, oldest first:
        the first `limit` of them, or with `newest=True` the last `limit` (the most recent)."""
        return self._call(
            "view", "events", {"after_id": after_id, "limit": limit, "newest": newest}
        )

    def audit(self, after_id: int = 0, limit: int = 1000) -> Any:
        """Delivery records after `after_id`, one per committed message, oldest first, whole
        commits: at most `limit` commits, none after the one that brings the records to `limit`.
        Returns {"records": [...], "next": id to pass as `after_id`, "missed": commits the
        audit's bound dropped before they were read} (see `actors.store.audit` for the record's
        fields)."""
        return self._call("view", "audit", {"after_id": after_id, "limit": limit})

    def router(self, queue: str, service: str, limit: int = 100) -> Any:
        """A router replica (actors.ddr): how many live mappings it holds (`mappings_total`),
        the first `limit` of them (inbound, outbound, target service, since) and its counts
        of dialogs routed, messages forwarded, passed through at arrival and errors."""
        check_name("queue", queue)
        check_name("service", service)
        return self._call("view", "router", {"queue": queue, "service": service, "limit": limit})
