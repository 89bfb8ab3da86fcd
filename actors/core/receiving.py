"""Receiving: RECEIVE, GET CONVERSATION GROUP, commit and rollback (settle), poison counting,
and MOVE CONVERSATION. A receive only reads and locks (locks live in memory); the commit is the
one write."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from actors.calls.envelope import Op, ReceivedGroup
from actors.calls.ordering import RequestId
from actors.core.changes import Arrived, Changes, Removed
from actors.core.conversations import Conversations
from actors.core.locks import Lock, Turn
from actors.core.work import Part, UnitOfWork
from actors.errors import GroupLocked, InvalidArgument, LockNotHeld, QueueDisabled
from actors.model import checks
from actors.model.catalog import Queue, to_record
from actors.packing import made
from actors.runs import Run, count, rows_of, runs_of
from actors.store import audit

SETTLE = "Receiving.settle"  # a settle's name in its request record (stores keep it)


class Receiving(Part):
    def __init__(self, uow: UnitOfWork, conversations: Conversations) -> None:
        super().__init__(uow)
        self.conversations = conversations

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
        Returns [] when nothing is waiting (the runtime does the waiting)."""
        checks.receive(max_groups, top, lease_s)
        st = self.state
        q = st.catalog.queue(queue)
        if not q.enabled:
            raise QueueDisabled(queue)
        idx = st.queue_index(queue)
        now = self.uow.clock()
        if lock_id is not None:
            lock = self.held([lock_id])[0]
            if lock.queue != queue:
                raise InvalidArgument(f"lock {lock_id} is on queue {lock.queue!r}, not {queue!r}")
            runs, to_end = self._waiting(lock.group, lock.count, top, lock.last_id)
            return [self._take(lock, runs, to_end)]
        target = self._target_group(queue, group_id, handle)
        out: list[ReceivedGroup] = []
        turn = Turn()
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
            runs, to_end = self._waiting(g, 0, top)
            if not runs:  # the index was ahead of the store; it is now corrected
                idx.remove(g, idx.pending.get(g, 0))
                continue
            lock = st.locks.acquire(g, queue, owner, now, lease_s, key, runs[0][0], 0, 0, turn)
            out.append(self._take(lock, runs, to_end))
            if target is not None:
                break
        for g in out:  # by the runs, not .messages: those would be built for nothing
            st.counts.received += len(g)
        return out

    def _target_group(self, queue: str, group_id: str | None, handle: str | None) -> int | None:
        st = self.state
        if handle is not None:
            g = st.endpoint(handle).group_no
        elif group_id is not None:
            g = st.group_no(group_id)
        else:
            return None
        if st.groups[g].queue != queue:
            raise InvalidArgument(
                f"conversation group {st.groups[g].group_id} is on queue "
                f"{st.groups[g].queue!r}, not {queue!r}"
            )
        return g

    def _waiting(
        self, group: int, skip: int, top: int | None, after_id: int = 0
    ) -> tuple[list[Run], bool]:
        """A group's waiting runs after its first `skip` (those after `after_id`), at most
        `top` messages, from the read cache or else the store; and whether they are all that
        waits (then the last of them ends a segment: see `Lock.to_end`)."""
        cache = self.state.cache
        runs = cache.take(group, skip, top)
        if runs is not None:
            waiting = cache.waiting(group)
            return runs, top is None or waiting is not None and waiting - skip <= count(runs)
        runs = self.store.fetch_group(group, top, after_id)
        return runs, top is None or count(runs) < top  # fewer than asked for: all there was

    def _take(self, lock: Lock, runs: list[Run], to_end: bool) -> ReceivedGroup:
        """Put received runs under `lock` and shape them for the caller; `to_end`: they are
        all that waited."""
        if runs:
            if lock.count == 0:
                lock.first_id = runs[0][0]
            last = runs[-1]
            lock.last_id = last[0] + len(last[4]) - 1
            lock.count += count(runs)
            lock.to_end = to_end
            lock.audit.append(runs)
        eps = self.state.endpoints
        infos = {}
        for no in _endpoint_nos(runs):
            ep = eps[no]
            infos[no] = (ep.handle, ep.conversation_id, ep.service, ep.far_service, ep.contract)
        if len(infos) > 1:  # one conversation's messages before the next, each in sequence
            rows = rows_of(runs)
            first: dict[int, int] = {}
            for i, r in enumerate(rows):
                first.setdefault(r[1], i)
            runs = runs_of(sorted(rows, key=lambda r: (first[r[1]], r[2])))
        g = self.state.groups[lock.group]
        state = self.store.group_state(g.no) if g.stateful else None
        return ReceivedGroup(g.group_id, lock.lock_id, state, infos, runs)

    def held(self, lock_ids: Iterable[str]) -> list[Lock]:
        locks, missing = [], []
        for lid in lock_ids:
            lock = self.state.locks.get(lid) if isinstance(lid, str) else None
            if lock is not None and lock.settled:
                lock = None  # committed by an earlier caller of the same group commit
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
        checks.seconds("lease", lease_s, none=True)
        st = self.state
        q = st.catalog.queue(queue)
        if not q.enabled:
            raise QueueDisabled(queue)
        popped = st.queue_index(queue).pop_ready()
        if popped is None:
            return None
        key, g = popped
        lock = st.locks.acquire(g, queue, owner, self.uow.clock(), lease_s, key, 0, 0, 0)
        return st.groups[g].group_id, lock.lock_id

    def settle(
        self,
        commit: Sequence[str] = (),
        rollback: Sequence[str] = (),
        ops: Sequence[Op] = (),
        states: Mapping[str, bytes | None] | None = None,
        request_id: RequestId | None = None,
    ) -> dict[str, Any]:
        """Commit some received groups and roll back others, in one call.

        Committing removes the received messages (or marks them, with retention), applies `ops`
        (sends, ends, begins, timers made while holding the locks) and writes each group's state,
        all in one transaction. Rolling back returns the messages to the queue."""
        if request_id is not None:
            found, result = self.uow.recorded(request_id, SETTLE)
            if found:  # already applied (its locks are gone): the same answer
                return result
        st = self.state
        named = [*commit, *rollback]
        if len(set(named)) != len(named):
            twice = sorted({x for x in named if named.count(x) > 1})
            raise InvalidArgument(f"lock(s) {twice} are named more than once in one settle")
        committing = self.held(commit)
        rolling = self.held(rollback)
        states = checks.states(states)
        by_gid = {st.groups[lk.group].group_id: lk for lk in committing} if states else {}
        for gid in states:
            if gid not in by_gid:
                raise LockNotHeld(
                    f"state for conversation group {gid!r} needs that group's lock in `commit`"
                )

        committed = 0
        for lk in committing:
            committed += lk.count

        def fn(w: Changes) -> dict[str, Any]:
            received: dict[bool, list[tuple[int, int]]] = {}  # by the queue's retention
            cut: list[tuple[int, int]] = []  # deleted ones that may end inside a segment
            retention: dict[str, bool] = {}
            # none was settled before (`held`): undone, none is
            w.undo.append(lambda: [setattr(lk, "settled", False) for lk in committing])
            for lk in committing:
                lk.settled = True
                if lk.count:
                    retain = retention.get(lk.queue)
                    if retain is None:
                        retain = retention[lk.queue] = st.catalog.queue(lk.queue).retention
                    received.setdefault(retain, []).append((lk.group, lk.last_id))
                    if not (lk.to_end or retain):  # a kept range is marked, never cut
                        cut.append((lk.group, lk.last_id))
                    w.removals.append(made(Removed, (lk.queue, lk.group, lk.count, True)))
                    w.audit.append(self._audit_group(lk, w.now))
            for retain, ranges in received.items():
                self.store.remove_received(ranges, retain, cut)
            if ops:
                held = frozenset(lk.group for lk in committing)
                result = self.conversations.apply_ops(w, ops, held)
            else:  # a reader's plain commit: nothing to check or apply
                result = {"handles": [], "sent": 0}
            if states:
                self.store.set_group_states((s, by_gid[g].group) for g, s in states.items())
                for gid in states:
                    group = st.groups[by_gid[gid].group]
                    if not group.stateful:
                        group.stateful = True
                        w.undo.append(lambda group=group: setattr(group, "stateful", False))
            w.after.append(lambda: self._committed(committing, committed))
            result["committed"] = committed
            return result

        result = self.uow.run(fn, request_id, checked=True, verb=SETTLE)
        self.rollback(rolling, "rolled back")
        return result

    def _audit_group(self, lk: Lock, now: float) -> list[Any]:
        """One committed group's delivery records, as columns (cheap to build and to store)."""
        st = self.state
        runs = lk.audit[0] if len(lk.audit) == 1 else [r for chunk in lk.audit for r in chunk]
        senders = {no: audit.sender(st.endpoints[no], st.broker_id) for no in _endpoint_nos(runs)}
        return audit.encode_group(st.broker_id, lk.queue, lk.received_at, now, senders, runs)

    def _release(self, locks: Sequence[Lock], committed: bool) -> None:
        st = self.state
        queues: dict[str, Any] = {}
        for lk in locks:
            st.locks.release(lk)
            idx = queues.get(lk.queue)
            if idx is None:
                idx = queues[lk.queue] = st.queue_index(lk.queue)
            idx.make_ready(lk.group, lk.last_id + 1 if committed else lk.ready_key)
        for queue in queues:  # once per queue, however many of its groups were released
            if committed:
                st.poison.committed(queue)
            self.uow.notify(queue)

    def _committed(self, locks: Sequence[Lock], messages: int) -> None:
        """After a commit: its groups' locks go, the groups are ready again, and it counts."""
        self._release(locks, committed=True)
        self.state.counts.committed += messages

    def rollback(self, locks: Sequence[Lock], why: str) -> None:
        """Return locked groups' messages to their queues; count rollbacks toward poison, once
        per receive however many of its groups roll back (see `Turn`)."""
        if not locks:
            return
        self.state.counts.rolled_back += sum(lk.count for lk in locks)
        self._release(locks, committed=False)
        for lk in locks:
            if lk.turn.counted:
                continue
            lk.turn.counted = True
            q = self.state.catalog.queues.get(lk.queue)
            if q is None or not q.enabled:
                continue
            if self.state.poison.rolled_back(q.name, q.poison_limit):
                self._disable_poisoned(q, why)

    def _disable_poisoned(self, q: Queue, why: str) -> None:
        st = self.state
        n = st.poison.count(q.name)
        detail = (
            f"{n} receives in a row were {why} (poison_limit={q.poison_limit}); "
            "a message on it cannot be processed"
        )

        def fn(w: Changes) -> None:
            new = dataclasses.replace(q, enabled=False)
            self.store.put_definition("queue", q.name, to_record(new))
            st.catalog.add(new)
            w.undo.append(lambda: st.catalog.add(q))
            w.event("QueueDisabled", q.name, detail)

        self.uow.run(fn)

    def give_back(self, lock_ids: Sequence[str]) -> int:
        """Return what a waiting receive took for a caller that had stopped waiting (its wait
        ran out as the messages came; see actors.client.coalesce). The messages go back to their
        queue as a rollback's do, but nobody tried to process them, so it does not count toward
        poison. Locks no longer held (expired, settled) are passed over. Returns how many."""
        locks = [self.state.locks.get(lid) for lid in lock_ids if isinstance(lid, str)]
        held = [lk for lk in locks if lk is not None and not lk.settled]
        if held:  # not counted as rolled back either: nobody had them
            self._release(held, committed=False)
        return len(held)

    def release_owner(self, owner: str) -> int:
        """The holder `owner` died: roll back every lock it held. Returns how many."""
        locks = self.state.locks.held_by(owner)
        self.rollback(locks, "abandoned by a reader that died")
        return len(locks)

    def move_conversation(self, handle: str, group_id: str) -> None:
        """MOVE CONVERSATION to another group of the same queue. Neither group may be locked."""
        st = self.state
        ep = st.endpoint(handle)
        new = st.group_no(group_id)
        old = ep.group_no
        if st.groups[new].queue != st.groups[old].queue:
            raise InvalidArgument(
                f"group {group_id} is on queue {st.groups[new].queue!r}; conversation "
                f"{handle} is on {st.groups[old].queue!r}: a group holds one queue's dialogs"
            )
        for g in (old, new):
            if st.locks.is_locked(g):
                raise GroupLocked(
                    f"conversation group {st.groups[g].group_id} is locked by a receive; "
                    "move the conversation after it commits or rolls back"
                )
        if old == new:
            return

        def move_member(frm: int, to: int) -> None:
            st.groups[frm].members -= 1
            st.groups[to].members += 1

        def fn(w: Changes) -> None:
            ids = self.store.move_messages(ep.no, old, new)
            w.touch(ep)
            ep.group_no = new
            move_member(old, new)
            w.undo.append(lambda: move_member(new, old))
            if ids:
                queue = st.groups[old].queue
                w.removals.append(Removed(queue, old, len(ids), False))
                w.arrivals.append(Arrived(queue, new, ids[0], len(ids), -1, 0))
            st.cache.drop(old)

        self.uow.run(fn)


def _endpoint_nos(runs: Sequence[Run]) -> Iterable[int]:
    """The endpoints a group's received runs came from (most often a group has one run)."""
    return (runs[0][1],) if len(runs) == 1 else {r[1] for r in runs}
