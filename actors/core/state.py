"""The broker's state: what one broker holds in memory, loaded from its store.

Endpoints (by number, handle and conversation) and conversation groups in use (the store holds
them all: `actors.core.working_set`), each queue's index of
waiting groups, dialogs parked in the transmission queue, timers, locks, poison counts, the read
cache, the route tables and the next free keys. Other modules read it freely; it changes only
inside a unit of work (`actors.core.work`), which can undo what a failed verb did.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from operator import attrgetter
from typing import Any, NamedTuple

from actors.core.changes import Changes, Group
from actors.core.keyring import Keyring
from actors.core.locks import LockTable, QueueIndex
from actors.core.poison import PoisonCounter
from actors.core.readcache import ReadCache
from actors.core.recount import Recount
from actors.core.working_set import Endpoints, Groups
from actors.counters import Counts
from actors.errors import ConversationNotFound, InvalidArgument
from actors.ids import new_uuid
from actors.model.catalog import Catalog, from_record
from actors.model.dialogs import Endpoint, State
from actors.model.limits import Limits
from actors.model.routing import Route, RouteTable
from actors.store.database import Store
from actors.store.keyed import EndpointRow, GroupRow

ROUTE_TABLES = ("routes", "instance")  # the broker's own routes; its instance routes
TIMER_WINDOW_S = 60.0  # how far ahead timers, lifetimes and purges are read from the store


class Due(NamedTuple):
    """A timer entry: at `at`, endpoint `endpoint_no` has a `kind` event due."""

    at: float
    endpoint_no: int
    kind: str  # "timer", "lifetime", "purge" or "purge-retry"


def _endpoint(row: EndpointRow) -> Endpoint:
    ep = Endpoint(*row[:3], bool(row[3]), *row[4:8], State(row[8]), *row[9:16], bool(row[16]))
    ep.onward, ep.rerunnable = row[17], bool(row[19])
    return ep


def group_of(row: GroupRow) -> Group:
    """A conversation group as the store gives it (`Store.group_by_no`)."""
    no, gid, queue, stateful, members = row
    return Group(no, gid, queue, members, bool(stateful))


_number = attrgetter("no")


class BrokerState:
    """Everything one broker keeps in memory, rebuilt from its store on start."""

    def __init__(self, store: Store, limits: Limits, name: str) -> None:
        self.name = name  # the broker's name: what "ray://<name>" addresses
        self.limits = limits
        self.counts = Counts()  # since this start (actors.counters)
        self.broker_id = store.broker_id
        self.catalog = Catalog(limits.code_modules)
        for kind, rec in store.load_catalog():
            self.catalog.add(from_record(kind, rec))
        self.keyring = Keyring(limits, self.catalog)
        self.locks = LockTable(limits.lease_s)
        self.poison = PoisonCounter()
        self.cache = ReadCache(limits.read_cache_bytes)
        # the store is the truth for endpoints and groups: those in use are kept in memory
        # (actors.core.working_set), and nothing here reads them all
        self.store = store
        self.groups = Groups(limits.endpoint_cache, self._group_by_no, store.group_no_of)
        self.endpoints = Endpoints(
            limits.endpoint_cache,
            lambda no: self._endpoint_of(store.endpoint_by_no(no)),
            lambda handle: self._endpoint_of(store.endpoint_by_handle(handle)),
            lambda cid, init: self._endpoint_of(store.endpoint_by_conversation(cid, init)),
            evicted=lambda ep: self.keyring.sessions.pop(ep.no, None),
        )
        if store.fits(limits.endpoint_cache // 2):  # all fit: read them once, ask no more
            for group in store.all_groups():
                self.groups.add(group_of(group))
            for row in store.all_endpoints():
                self.endpoints.add(self._endpoint_of(row))
            self.endpoints.complete = self.groups.complete = True
        self.timers: list[Due] = []  # a heap; entries no longer current are skipped
        self._current: dict[tuple[int, str], float] = {}  # (endpoint, kind) -> its due time
        # what falls due up to `horizon` is in `timers`; what falls due later is found from the
        # store's indexes when the horizon moves (`pop_due`), not scheduled for every dialog
        self.horizon: float | None = None
        # whether the store remembers any dialog begun if absent (a plain Begin that takes such
        # a handle again then drops what is remembered of it: actors.core.work)
        self.reruns = store.has_reruns()
        self.queues: dict[str, QueueIndex] = {q: QueueIndex() for q in self.catalog.queues}
        for g, queue, count, first in store.waiting_by_group():
            self.queue_index(queue).add(g, first, count, locked=False)
        self.parked: set[int] = set(store.parked_endpoints())
        # of those, the ones whose messages are on their way to another broker now (the
        # transport's dispatcher keeps it: one batch per dialog at a time)
        self.sending: set[int] = set()
        ep_max, group_max, msg_max = store.max_keys()
        self.next_endpoint, self.next_group, self.next_message = (
            ep_max + 1,
            group_max + 1,
            msg_max + 1,
        )
        self.routes = {t: RouteTable() for t in ROUTE_TABLES}
        if store.get_meta("routes") is not None:  # saved tables (AutoCreatedLocal may be dropped)
            saved: dict[str, list[Route]] = {t: [] for t in ROUTE_TABLES}
            for table, rec in store.load_routes():
                saved[table].append(Route.from_record(rec))
            self.routes = {t: RouteTable(saved[t]) for t in ROUTE_TABLES}
        self.forwarding = store.get_meta("forwarding") == "1"
        # counts of the store reused a while (actors.core.recount): dialogs by state (the
        # `dialogs` view), messages in the transmission queue (the metrics)
        self.dialog_counts: Recount[dict[str, Any]] = Recount()
        self.transmission_count: Recount[int] = Recount()
        # service -> dialogs pinned round-robin so far; memory only: a restart begins at 0 again
        self.turns: dict[str, int] = {}

    # --- lookups ---------------------------------------------------------------------------------

    def endpoint(self, handle: str) -> Endpoint:
        ep = self.endpoints.by_handle(handle)
        if ep is None:
            raise ConversationNotFound(handle)
        return ep

    def far(self, ep: Endpoint) -> Endpoint | None:
        """The other side of `ep`'s dialog, when it is on this broker too."""
        return self.endpoints.by_conversation(ep.conversation_id, not ep.is_initiator)

    def queue_index(self, queue: str) -> QueueIndex:
        idx = self.queues.get(queue)
        if idx is None:  # not setdefault: that would build an index on every call
            idx = self.queues[queue] = QueueIndex()
        return idx

    def group_no(self, group_id: Any) -> int:
        no = self.groups.by_id(group_id)
        if no is None:
            raise InvalidArgument(f"no conversation group {group_id!r} on this broker")
        return no

    def serves_here(self, ep: Endpoint) -> bool:
        """Whether `ep`'s far service could be delivered to on this broker."""
        return ep.far_service in self.catalog.services and ep.far_broker in (None, self.broker_id)

    def route_table(self, table: str) -> RouteTable:
        if not isinstance(table, str) or table not in self.routes:
            raise InvalidArgument(
                f"route table {table!r} does not exist; use one of {list(ROUTE_TABLES)}"
            )
        return self.routes[table]

    # --- registering (callers record the change in their unit of work) ---------------------------

    def _endpoint_of(self, row: EndpointRow | None) -> Endpoint | None:
        """An endpoint read from the store (`Store.endpoint_by_no`), to keep in memory: with
        its session key, if it has one."""
        if row is None:
            return None
        ep = _endpoint(row)
        if row[18] is not None:  # a secured dialog's session key: it opens with the master key
            self.keyring.load([(ep.no, row[18])], {ep.no: ep.conversation_id})
        return ep

    def every_endpoint(self) -> Iterator[tuple[Endpoint, bool]]:
        """(endpoint, has a session key) for every endpoint, as memory has it now: for views
        and checks that look at all of them (it reads the store; it caches nothing)."""
        last, sessions = 0, self.keyring.sessions
        for row in self.store.all_endpoints():
            last = row[0]
            ep = self.endpoints.peek(last)
            yield (_endpoint(row), row[18] is not None) if ep is None else (ep, last in sessions)
        # begun in the unit of work open now, not written yet: numbered after every stored one
        for ep in sorted((e for e in self.endpoints.cached() if e.no > last), key=_number):
            yield ep, ep.no in sessions

    def endpoints_after(self, handle: str | None, limit: int) -> Iterator[tuple[Endpoint, bool]]:
        """(endpoint, has a session key) for a view's page of the stored endpoints
        (`Store.endpoints_after`), as memory has them now."""
        sessions = self.keyring.sessions
        for row in self.store.endpoints_after(handle, limit):
            ep = self.endpoints.peek(row[0])
            yield (_endpoint(row), row[18] is not None) if ep is None else (ep, ep.no in sessions)

    def _group_by_no(self, no: int) -> Group | None:
        row = self.store.group_by_no(no)
        return None if row is None else group_of(row)

    def working_set(self) -> dict[str, int]:
        """What the working set holds now, and its reads of the store and evictions so far."""
        eps, groups = self.endpoints, self.groups
        return {"endpoints": len(eps), "groups": len(groups), "reads": eps.misses + groups.misses,
                "evicted": eps.evicted + groups.evicted}  # fmt: skip

    def trim(self) -> None:
        """Bring the working set back to its bound (no transaction may be open): what a
        receive holds and what is on its way to another broker stays."""
        self.endpoints.trim(self.sending.__contains__)
        self.groups.trim(self.locks.is_locked)

    def add_group(self, g: Group) -> None:
        self.groups.add(g)

    def forget_group(self, no: int) -> None:
        if self.groups.discard(no) is not None:
            self.cache.drop(no)

    def add_endpoint(self, ep: Endpoint) -> None:
        self.endpoints.add(ep)
        self.groups[ep.group_no].members += 1

    def drop_endpoint(self, ep: Endpoint) -> None:
        self.forget_schedule(ep.no)
        self.keyring.sessions.pop(ep.no, None)
        self.endpoints.discard(ep.no)
        g = self.groups.get(ep.group_no)
        if g is not None:
            g.members -= 1

    def new_group(self, w: Changes, queue: str, group_id: str | None = None) -> int:
        g = Group(self.next_group, group_id or new_uuid(), queue)
        self.next_group += 1
        self.add_group(g)
        w.new_groups.append(g)
        return g.no

    def new_endpoint(self, w: Changes, **fields: Any) -> Endpoint:
        ep = Endpoint(no=self.next_endpoint, **fields)
        self.next_endpoint += 1
        self.add_endpoint(ep)
        w.new_endpoints.append(ep)
        w.new_nos.add(ep.no)
        return ep

    def message_ids(self, n: int) -> int:
        """Allocate `n` queue positions; returns the first."""
        first = self.next_message
        self.next_message += n
        return first

    def park(self, w: Changes, ep_no: int) -> None:
        if ep_no not in self.parked:
            self.parked.add(ep_no)
            w.undo.append(lambda: self.parked.discard(ep_no))

    def unpark(self, w: Changes, ep_no: int) -> None:
        if ep_no in self.parked:
            self.parked.discard(ep_no)
            w.undo.append(lambda: self.parked.add(ep_no))

    def take_turn(self, w: Changes, service: str) -> None:
        """Count one more dialog pinned round-robin for `service` (undone if the verb fails)."""
        turn = self.turns.get(service, 0)
        self.turns[service] = turn + 1
        w.undo.append(lambda: self.turns.__setitem__(service, turn))

    # --- timers ----------------------------------------------------------------------------------

    def schedule(self, ep: Endpoint) -> None:
        """(Re)schedule what `ep` has due: its timer, its lifetime and, once closed, its purge."""
        purge_at = None if ep.closed_at is None else ep.closed_at + self.limits.closed_retention_s
        horizon = float("inf") if self.horizon is None else self.horizon
        for at, kind in ((ep.timer_at, "timer"), (ep.expires_at, "lifetime"), (purge_at, "purge")):
            if at is None or at > horizon:  # later: found in the store when the horizon moves
                self._current.pop((ep.no, kind), None)
            else:
                self.schedule_purge(ep.no, at, kind)

    def schedule_purge(self, ep_no: int, at: float, kind: str = "purge") -> None:
        if self._current.get((ep_no, kind)) == at:
            return
        self._current[(ep_no, kind)] = at
        heapq.heappush(self.timers, Due(at, ep_no, kind))
        if len(self.timers) > 2 * len(self._current) + 64:
            # Re-arming leaves stale entries behind: drop them so memory follows live timers.
            self.timers = [d for d in self.timers if self._is_current(d)]
            heapq.heapify(self.timers)

    def _is_current(self, d: Due) -> bool:
        return self._current.get((d.endpoint_no, d.kind)) == d.at

    def _advance(self, now: float) -> None:
        """Schedule what the store says falls due between the horizon and `TIMER_WINDOW_S`
        after `now`, and move the horizon there."""
        until, after = now + TIMER_WINDOW_S, self.horizon
        retention = self.limits.closed_retention_s
        for no, timer_at, expires_at, closed_at in self.store.due_between(after, until, retention):
            purge_at = None if closed_at is None else closed_at + retention
            for at, kind in ((timer_at, "timer"), (expires_at, "lifetime"), (purge_at, "purge")):
                if at is not None and (after is None or at > after) and at <= until:
                    self.schedule_purge(no, at, kind)
        self.horizon = until

    def pop_due(self, now: float) -> list[Due]:
        """Take every current entry due by `now` off the schedule."""
        if self.horizon is None or now >= self.horizon:
            self._advance(now)
        due = []
        while self.timers and self.timers[0].at <= now:
            d = heapq.heappop(self.timers)
            if self._is_current(d):
                del self._current[(d.endpoint_no, d.kind)]
                due.append(d)
        return due

    def unpop(self, due: list[Due]) -> None:
        """Put entries back (firing them failed; they fire on a later tick)."""
        for d in due:
            self.schedule_purge(d.endpoint_no, d.at, d.kind)

    def forget_schedule(self, ep_no: int) -> None:
        for kind in ("timer", "lifetime", "purge", "purge-retry"):
            self._current.pop((ep_no, kind), None)

    def next_due(self) -> float:
        """When to look at the schedule next: its first entry, or the horizon (to move it)."""
        while self.timers and not self._is_current(self.timers[0]):
            heapq.heappop(self.timers)
        horizon = 0.0 if self.horizon is None else self.horizon
        return min(self.timers[0].at, horizon) if self.timers else horizon
