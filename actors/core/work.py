"""The unit of work: the one place a verb's transaction opens.

A verb runs as `UnitOfWork.run(fn)`: `fn` plans its changes into a `Changes` while one store
transaction is open. Endpoints it touches are snapshotted first, so a verb that fails (a bad
argument, a store error) leaves memory and store exactly as they were. Changes to the in-memory
indexes (ready groups, locks, timers, the read cache) are applied only after the commit. A call
that carries a request id is recorded with its result, so a retry answers the same and applies
nothing twice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import msgpack

from actors.calls.ordering import CallKey, RequestId
from actors.core.changes import Changes
from actors.core.state import BrokerState
from actors.errors import InvalidArgument
from actors.model.dialogs import due_of, endpoint_settings, settings_of
from actors.packing import packb
from actors.store import audit
from actors.store.database import Store

T = TypeVar("T")
Clock = Callable[[], float]


class _Group:
    """An open group commit: its units, and what is written once at its end."""

    __slots__ = ("units", "touched", "settled", "requests", "looked_up", "found", "audit")

    def __init__(self) -> None:
        self.units: list[Changes] = []
        self.audit: list[list[Any]] = []  # the units' delivery records: one audit row in all
        self.touched: set[int] = set()  # endpoint numbers: their sequence numbers are written
        self.settled: set[int] = set()  # those whose other columns changed too
        self.requests: dict[RequestId, tuple[RequestId, float, bytes]] = {}  # id -> its record
        self.looked_up: set[RequestId] = set()  # request ids looked up at the group's start
        self.found: dict[RequestId, bytes] = {}  # those of them applied before: their results


class _Shared:
    """A shared unit (`UnitOfWork.shared`): its changes, and the request ids recorded in it."""

    __slots__ = ("w", "request_ids")

    def __init__(self, w: Changes) -> None:
        self.w = w
        self.request_ids: list[str] = []


_VERBS: dict[Any, str] = {}  # code object -> the verb it belongs to


def _verb(fn: Callable[..., Any]) -> str:
    """The call a unit's function belongs to (e.g. "Admin.create"), as request records name it."""
    code = getattr(fn, "__code__", None)
    verb = _VERBS.get(code) if code is not None else None
    if verb is None:
        verb = fn.__qualname__.split(".<locals>")[0]
        if code is not None:
            _VERBS[code] = verb
    return verb


class UnitOfWork:
    """Runs verbs against one broker's state and store, each in one transaction."""

    def __init__(self, state: BrokerState, store: Store, clock: Clock) -> None:
        self.state = state
        self.store = store
        self.clock = clock
        # Hooks the runtime sets: wake receivers waiting on a queue; surface an event.
        self.notify: Callable[[str], None] = lambda queue: None
        self.on_event: Callable[[str, str, str], None] = lambda kind, subject, detail: None
        self._group: _Group | None = None  # the open group commit, if any
        self._shared: _Shared | None = None  # the open shared unit, if any

    def run(
        self,
        fn: Callable[[Changes], T],
        request_id: RequestId | None = None,
        checked: bool = False,
        verb: str | None = None,
    ) -> T:
        """Run `fn` in one transaction; on any error undo everything it did. With a
        `request_id`, a call already applied under it answers as it did then (`checked`: the
        caller has looked already); `verb` names the call in its record (else the method `fn`
        was made in: a compiled extension type's closures do not carry their class's name).
        Inside `group`, the transaction is the group's and `fn` gets a savepoint of its own."""
        g = self._group
        if request_id is not None and verb is None:
            verb = _verb(fn)
        if request_id is not None and not checked and not self._fresh(g, request_id):
            found, result = self.recorded(request_id, verb)
            if found:  # a retry of a call that already committed
                return result
        s = self._shared
        if s is not None and g is not None:  # one of a run of calls (see `shared`)
            result = fn(s.w)  # an error fails the whole shared unit (its caller then goes alone)
            if request_id is not None:
                g.requests[request_id] = (request_id, s.w.now, packb([verb, result]))
                s.request_ids.append(request_id)
            return result
        w = Changes(now=self.clock())
        try:
            with self.store.savepoint() if g is not None else self.store.tx():
                result = fn(w)
                self._write(w)
                if request_id is not None:
                    record = (request_id, w.now, packb([verb, result]))
                    if g is None:
                        self.store.put_requests([record])
        except BaseException:
            self._undo(w)
            raise
        if g is not None:
            self._joined(g, w)
            if request_id is not None:
                g.requests[request_id] = record
        else:
            self._apply(w)
            self.state.trim()
        return result

    def shared(self, changes: list[Callable[[], Any]]) -> list[Any] | None:
        """Inside `group`: run `changes` (each makes one `run` call, or none) as one unit, on
        one savepoint, with one set of changes written and applied: their results, in order.
        If any of them fails, all of them are undone and None is returned, and the caller runs
        each as its own unit, so each gets its own answer. A hundred one-message calls cost one
        unit's overhead instead of a hundred; a failing call, rare, costs a second pass.
        Only for calls whose every effect goes through `run` (nothing changed outside it)."""
        g = self._group
        assert g is not None and self._shared is None, "shared units run in a group, unnested"
        s = self._shared = _Shared(Changes(now=self.clock()))
        try:
            with self.store.savepoint():
                results = [change() for change in changes]
                self._write(s.w)
        except BaseException as exc:
            self._undo(s.w)
            for request_id in s.request_ids:
                del g.requests[request_id]
            if not isinstance(exc, Exception) or self.tx_lost:
                raise  # interrupted, or the transaction is gone: the group fails as a whole
            return None
        finally:
            self._shared = None
        self._joined(g, s.w)
        return results

    def _joined(self, g: _Group, w: Changes) -> None:
        """A unit committed in the group: its indexes change once the group has committed."""
        g.units.append(w)
        if w.audit:
            g.audit += w.audit

    def recorded(self, request_id: RequestId, verb: str) -> tuple[bool, Any]:
        """(True, the answer) if a call was already applied under `request_id`."""
        if self._fresh(self._group, request_id):
            return False, None
        done = self.done(request_id)
        return (False, None) if done is None else (True, self._recorded(request_id, verb, done))

    @staticmethod
    def _fresh(g: _Group | None, request_id: RequestId) -> bool:
        """Whether `request_id` is known not to be applied: looked up when the group began (and
        not found), and not applied in it since. Most calls' ids are: no second look."""
        return (
            g is not None
            and request_id in g.looked_up
            and request_id not in g.found
            and request_id not in g.requests
        )

    @contextmanager
    def group(self, request_ids: Iterable[Any] = ()) -> Iterator[None]:
        """Group commit: the units run inside share one transaction, each on a savepoint of its
        own (one that fails is undone alone). Their in-memory changes that wait for a commit
        (ready groups, released locks, woken receivers) are applied once the group commits; if
        the commit fails, every unit's changes are undone and the error raised. Rows several
        units rewrite (endpoints) and their request records are written once, at the end.
        `request_ids`: the units' request ids, looked up here in one statement (a retry's
        earlier answer) rather than one each."""
        assert self._group is None, "group commits do not nest"
        self._group = g = _Group()
        try:
            with self.store.tx():
                ids = list({r for r in request_ids if isinstance(r, (str, CallKey)) and r})
                if ids:
                    g.found = self.store.request_results(ids)
                    g.looked_up = set(ids)
                yield
                eps = self.state.endpoints
                live = [e for e in map(eps.get, g.touched) if e is not None]
                if live:
                    self.store.update_endpoint_seqs([(e.send_seq, e.recv_seq, e.no) for e in live])
                changed = [endpoint_settings(e) for e in map(eps.get, g.settled) if e is not None]
                if changed:
                    self.store.update_endpoints(changed)
                if g.requests:
                    self.store.put_requests(g.requests.values())
                if g.audit:
                    self.store.insert_audit(g.units[-1].now, audit.pack(g.audit))
        except BaseException:
            for w in reversed(g.units):
                self._undo(w)
            raise
        finally:
            self._group = None
        for w in g.units:
            self._apply(w)
        self.state.trim()

    @property
    def tx_lost(self) -> bool:
        """Whether SQLite dropped the group's transaction (after a fault): the group must end."""
        return self.store.in_tx_lost

    @staticmethod
    def _recorded(request_id: RequestId, verb: str, blob: bytes) -> Any:
        then, result = msgpack.unpackb(blob, raw=False, strict_map_key=False)
        if then != verb:
            raise InvalidArgument(
                f"request_id {request_id!r} was already used for another call ({then}); "
                "give each call its own request id"
            )
        return result

    def done(self, request_id: RequestId) -> bytes | None:
        """The recorded result of a call already applied under `request_id`, or None."""
        if not (isinstance(request_id, str) and request_id or type(request_id) is CallKey):
            raise InvalidArgument("request_id must be a non-empty string")
        g = self._group
        if g is not None and request_id in g.requests:
            return g.requests[request_id][2]  # applied earlier in this group
        if g is not None and request_id in g.looked_up:
            return g.found.get(request_id)  # looked up when the group began
        return self.store.request_results([request_id]).get(request_id)

    def _undo(self, w: Changes) -> None:
        st = self.state
        for no, snap in w.touched.items():
            st.endpoints[no].__dict__.update(snap)
        for ep in w.new_endpoints:
            st.drop_endpoint(ep)
        for g in w.new_groups:
            st.forget_group(g.no)
        for undo in reversed(w.undo):
            undo()

    def _emptied_groups(self, w: Changes) -> list[int]:
        """The groups whose last conversations `w` ends (END WITH CLEANUP, or a closed dialog
        purged): they go once no message of them is left, so memory and store stay bounded.
        Asked before the endpoints' rows go (a group read from the store counts its rows)."""
        st = self.state
        dying = Counter({ep.no: ep.group_no for ep in w.dead_endpoints}.values())
        return [g for g, n in dying.items() if g in st.groups and st.groups[g].members <= n]

    def _drop_groups(self, w: Changes, gone: list[int]) -> None:
        st = self.state
        empty = self.store.delete_empty_groups(gone)
        if empty:
            w.after.append(lambda: [st.forget_group(g) for g in empty])

    def _remember_ended(self, w: Changes) -> None:
        """A target endpoint of a dialog from another broker is remembered after it goes: that
        broker may not have heard our acknowledgements (a one-way partition, END WITH CLEANUP),
        and a resend of what it took must not open the dialog here again (actors.transport).
        So is an initiator endpoint begun with `if_absent`: a re-run of that Begin then finds
        the dialog ended, and its Send ... AT what was sent before sends nothing."""
        st = self.state
        reruns = [ep for ep in w.dead_endpoints if ep.rerunnable]
        if st.limits.ended_retention_s <= 0:
            if reruns:
                self.store.forget_reruns(ep.handle for ep in reruns)
            return
        if reruns:
            st.reruns = True
            self.store.end_reruns(
                (ep.handle, *ep.identity(), ep.sent_by_user(), w.now) for ep in reruns
            )
        rows = [
            (ep.conversation_id, ep.recv_seq, w.now)
            for ep in w.dead_endpoints
            if not ep.is_initiator and ep.far_broker not in (None, st.broker_id)
        ]
        if rows:
            self.store.insert_ended(rows)

    def _write(self, w: Changes) -> None:
        st, store = self.state, self.store
        if w.new_groups:
            store.insert_groups((g.no, g.group_id, g.queue) for g in w.new_groups)
        dead = {ep.no for ep in w.dead_endpoints}
        born = [ep.row() for ep in w.new_endpoints if ep.no not in dead]
        if born:
            store.upsert_endpoints(born)
            reruns = [ep.handle for ep in w.new_endpoints if ep.rerunnable and ep.no not in dead]
            if reruns:
                store.trace_reruns(reruns)  # replacing what an ended one left on its handle
                st.reruns = True
            if st.reruns:  # a plain Begin on the handle of an ended one: that trace goes
                store.forget_reruns(ep.handle for ep in w.new_endpoints
                                    if ep.is_initiator and not ep.rerunnable)  # fmt: skip
        eps = st.endpoints
        changed = {no: ep for no in w.touched if no not in dead and (ep := eps.get(no)) is not None}
        # of those, the ones whose row changed beyond their sequence numbers (few: a send
        # changes only those)
        settled = w.settled = [
            no for no, ep in changed.items() if endpoint_settings(ep) != settings_of(w.touched[no])
        ]
        if self._group is not None:  # written once, when the group ends
            self._group.touched.update(changed)
            self._group.settled.update(settled)
        elif changed:
            store.update_endpoint_seqs(
                [(ep.send_seq, ep.recv_seq, no) for no, ep in changed.items()]
            )
            if settled:
                store.update_endpoints([endpoint_settings(changed[no]) for no in settled])
        if dead:
            gone = self._emptied_groups(w)
            store.delete_endpoints(dead)
            self._remember_ended(w)
            if gone:
                self._drop_groups(w, gone)
        if w.states:
            store.set_group_states(w.states)
        if w.keys:
            keyring = st.keyring
            store.put_dialog_keys([(no, keyring.wrapped(no)) for no in w.keys if no not in dead])
        if w.messages:
            store.insert_messages(w.messages)
        if w.transmission:
            store.insert_transmission(w.transmission)
        if w.events:
            store.insert_events(w.events)
        if w.audit and self._group is None:  # a group writes its units' records at its end
            store.insert_audit(w.now, audit.pack(w.audit))

    def _apply(self, w: Changes) -> None:
        """After commit: bring the in-memory indexes up to date and wake receivers."""
        st = self.state
        woken: set[str] = set()
        # unpacked: a named tuple's field read by name is a descriptor call each
        for queue, group, count, oldest in w.removals:
            st.queue_index(queue).remove(group, count)
            if oldest:  # a commit took the group's oldest messages
                st.cache.consumed(group, count)
        for queue, group, first_id, count, at, nbytes in w.arrivals:
            idx = st.queue_index(queue)
            if at >= 0:
                st.cache.arrived(group, w.messages[at], nbytes, not idx.pending.get(group))
            else:
                st.cache.drop(group)
            idx.add(group, first_id, count, locked=st.locks.is_locked(group))
            woken.add(queue)
        for ep in w.dead_endpoints:
            st.drop_endpoint(ep)
            st.parked.discard(ep.no)
        for ep in w.new_endpoints:
            st.schedule(ep)
        for no in w.settled:  # only these can have new due times (a send changes none)
            ep = st.endpoints.get(no)
            if ep is not None and ep.due_times() != due_of(w.touched[no]):
                st.schedule(ep)
        st.counts.sent += w.sent
        st.counts.passed_through += w.passed
        for fn in w.after:
            fn()
        for e in w.events:
            self.on_event(e.kind, e.subject, e.detail)
        for queue in woken:
            self.notify(queue)


class Part:
    """One group of verbs: works on the broker's state and store inside its unit of work."""

    def __init__(self, uow: UnitOfWork) -> None:
        self.uow = uow
        self.state = uow.state
        self.store = uow.store
