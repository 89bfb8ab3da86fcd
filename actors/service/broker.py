"""`BrokerService`: one running broker on an asyncio event loop, without Ray.

It owns what needs a running process: receivers waiting for messages, the clock that fires timers
and leases, the sender that moves the transmission queue to other brokers (over a `Peers`), the
holders of locks, and the reader pools. Its methods are the wire verbs every handle calls (ops and
received groups travel packed), so the Ray actor (`actors.remote.broker.BrokerActor`, a thin
subclass) and the in-process `LocalBroker` run the same code. Every rule it applies is the core's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from actors.activation import ReaderLauncher, ReaderPools
from actors.activation.port import InternalPort
from actors.calls.envelope import (
    NOTHING_RECEIVED,
    Begin,
    Op,
    ReceivedGroup,
    Send,
    Timer,
    answered_locks,
    pack_received,
    unpack_ops,
)
from actors.calls.ordering import RequestId, Sequencer
from actors.compiled import running_compiled
from actors.core import BrokerCore, Limits
from actors.errors import (
    InvalidArgument,
    InvalidDefinition,
    ReaderRetired,
    StoreError,
)
from actors.model import checks
from actors.model.catalog import Queue, check_name, from_record
from actors.service.calls import BatchVerbs, metric_label
from actors.service.group_commit import GroupCommit
from actors.service.holders import Holder, LockHolders
from actors.service.metrics import SAMPLE_EVERY_S, MetricsSink
from actors.service.replies import Replies
from actors.service.routes import RouteVerbs
from actors.service.views import ViewVerbs
from actors.service.waiting import Waiting
from actors.store.database import Store
from actors.transport import Outbound, Peers

log = logging.getLogger("raybroker")

# Failpoints for fault-injection tests: "exit_after_commit" kills the process right after the next
# apply/settle commits, before its reply leaves (the window where a retry must not apply twice).
FAILPOINTS = frozenset({"exit_after_commit"})

Settle = tuple[list[str], list[str], Sequence[Op], Mapping[str, bytes | None], str | None]


def check_name_and_path(name: Any, path: Any) -> None:
    try:  # the catalog's name rule: a broker's name goes into "ray://<name>" addresses
        check_name("broker name", name)
    except InvalidDefinition as exc:
        raise InvalidArgument(str(exc)) from None
    if not isinstance(path, str) or not path:
        raise InvalidArgument(
            f"broker {name!r}: path must be a SQLite file path or ':memory:', not {path!r}"
        )


def sends_only(ops: Sequence[Op]) -> bool:
    """Whether a call's operations may share a unit of work with its neighbours' in a group
    commit (actors.service.group_commit): sends only. A Begin, End or Timer goes alone, so nothing
    it writes waits behind another caller's work."""
    return all(type(op) is Send for op in ops)


def settle_shares(rollback: Sequence[str], ops: Sequence[Op]) -> bool:
    """Whether a settle may share a unit: a commit whose outputs are sends. A rollback changes
    locks and poison counts outside its unit of work, so it goes alone."""
    return not rollback and sends_only(ops)


class BrokerService(BatchVerbs, RouteVerbs, ViewVerbs, Waiting):
    """One broker and its runtime. Construct it on the event loop it will run on."""

    def __init__(
        self,
        name: str,
        path: str,
        durability: str = "normal",
        limits: Mapping[str, Any] | None = None,
        *,
        peers: Peers | None = None,
        launcher: ReaderLauncher | None = None,
        metrics: MetricsSink | None = None,
    ) -> None:
        # first: a broker whose store did not open still answers `info` through `call`
        self._order = Sequencer()  # each client's calls start in the order it issued them
        self.replies = Replies()  # a lock-taking call runs once, however often it arrives
        self.started = time.time()
        self.metrics = metrics
        check_name_and_path(name, path)
        self.name = name
        # as started, so a second start can refuse to attach with other settings
        self.path, self.durability, self.limits = path, durability, dict(limits or {})
        store = Store(path, durability, holder=name)
        try:
            self.core = BrokerCore(store, time.time, Limits.of(self.limits), name)
        except BaseException:
            store.close()  # a broker that did not start must not keep its store file locked
            raise
        self.core.notify = self._wake
        self.core.on_event = self._surface
        self.commits = GroupCommit(self.core.uow, self._committed)
        self.peers = peers
        self.courier = self.core.transport.courier(peers) if peers is not None else None
        self.pools = ReaderPools(self, self.core.limits, launcher)
        Waiting.__init__(self)
        self.holders = LockHolders()
        self._failpoints: set[str] = set()
        loop = asyncio.get_running_loop()
        self._poke = asyncio.Event()
        self._send_poke = asyncio.Event()
        self._tasks = [loop.create_task(self._run_clock())]
        if self.courier is not None:
            self._tasks.append(loop.create_task(self._run_sender()))

    async def close(self) -> None:
        """Stop the loops and readers and close the store (the in-process broker's end)."""
        tasks = self._tasks + self.pools.shutdown()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.core.store.close()

    # --- the clock: timers, lifetimes, leases, dead holders -------------------------------------

    async def _run_clock(self) -> None:
        next_owner_check = next_sample = 0.0
        while True:
            try:
                due = self.core.tick()
                self.pools.tick()
                now = time.time()
                if now >= next_owner_check:
                    next_owner_check = now + self.core.limits.owner_check_s
                    await self._release_dead_owners()
                if self.metrics is not None and now >= next_sample:
                    next_sample = now + SAMPLE_EVERY_S
                    self.metrics.sample(self.metrics_snapshot())
            except Exception as exc:  # the clock must outlive any one failure; it is logged
                self._log_failure("a clock tick", exc)
                due = None
            most = self.core.limits.tick_max_s
            delay = most if due is None else min(most, max(0.0, due - time.time()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poke.wait(), delay)
            self._poke.clear()

    async def _release_dead_owners(self) -> None:
        to_check = self.holders.keep_only(self.core.locks.owners())
        await asyncio.gather(*(self._check_owner(o, h) for o, h in to_check))

    async def _check_owner(self, owner: str, handle: Any) -> None:
        if await self.holder_alive(handle) is False:
            n = self.core.release_owner(owner)
            self.holders.forget(owner)
            log.warning(
                "broker %s: lock holder %s is gone; %d lock(s) rolled back", self.name, owner, n
            )

    async def holder_alive(self, handle: Any) -> bool | None:
        """Whether the holder behind `handle` still runs (None: cannot tell now). In one process
        every holder is alive; the Ray runtime asks the actor."""
        return True

    # --- transport: the transmission queue goes out; bundles come in ------------------------------

    async def _run_sender(self) -> None:
        transport = self.core.transport
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._send_poke.wait(), 0.05)
            self._send_poke.clear()
            if not transport.pending:
                continue
            try:
                for out in transport.dispatch():
                    asyncio.ensure_future(self._send(out))
            except Exception as exc:  # logged; the rows stay queued and are tried again
                self._log_failure("dispatching the transmission queue", exc)

    def _log_failure(self, what: str, exc: Exception) -> None:
        """A store fault repeats on every pass until it clears: one line each, not a traceback."""
        if isinstance(exc, StoreError):
            log.warning("broker %s: %s failed: %s", self.name, what, exc)
        else:
            log.error("broker %s: %s failed", self.name, what, exc_info=exc)

    async def _send(self, out: Outbound) -> None:
        assert self.courier is not None
        if await self.courier.send(out):
            self._send_poke.set()  # the same dialogs may have more to send

    def _sent_something(self) -> None:
        if self.core.transport.pending:
            self._send_poke.set()

    async def deliver(self, blob: bytes) -> bytes:
        """Bundles from another broker: deliver, forward, acknowledge (see actors.transport)."""
        if self.courier is None:
            raise InvalidArgument(f"broker {self.name!r} runs without peers and takes no bundles")
        reply = await self.courier.deliver(blob)
        self._send_poke.set()  # replies to these dialogs may be waiting to go out
        return reply

    def _surface(self, kind: str, subject: str, detail: str) -> None:
        level = logging.WARNING if kind == "QueueDisabled" else logging.INFO
        log.log(level, "broker %s: %s %s: %s", self.name, kind, subject, detail)

    # --- what the reader pools need --------------------------------------------------------------

    def depth(self, queue: str) -> tuple[int, int]:
        return self.core.depth(queue)

    def release_owner(self, owner: str) -> int:
        return self.core.release_owner(owner)

    def write_event(self, kind: str, subject: str, detail: str) -> None:
        self.core.record_event(kind, subject, detail)

    def queue_definitions(self) -> dict[str, Queue]:
        return self.core.catalog.queues

    def reader_port(self) -> InternalPort:
        return InternalPort(self)

    # --- verbs (each one core call, one transaction) --------------------------------------------

    async def verb(self, method: str, *args: Any) -> Any:
        """Run one verb, timed for the metrics sink (the in-process handle calls this)."""
        if self.metrics is None:
            return await getattr(self, method)(*args)
        started = time.perf_counter()
        try:
            return await getattr(self, method)(*args)
        finally:
            self.metrics.observe_call(metric_label(method), time.perf_counter() - started)

    async def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "broker_id": self.core.broker_id,
            "pid": os.getpid(),
            "uptime_s": time.time() - self.started,
            "path": self.path,
            "durability": self.durability,
            "limits": self.limits,
            # how many of its modules this process runs compiled (actors.compiled)
            "compiled_modules": len(running_compiled("actors")),
            "working_set": self.core.state.working_set(),
        }

    async def define(self, kind: str, record: dict[str, Any], request_id: str) -> None:
        self.core.create(from_record(kind, record), request_id)

    async def alter(self, kind: str, name: str, changes: dict[str, Any], request_id: str) -> None:
        self.core.alter(kind, name, changes, request_id)

    async def drop(self, kind: str, name: str, request_id: str) -> None:
        self.core.drop(kind, name, request_id)

    async def apply(self, ops: bytes, request_id: RequestId | None) -> dict[str, Any]:
        return await self._start_apply(ops, request_id)

    def _start_apply(self, ops: bytes, request_id: RequestId | None) -> asyncio.Future:
        unpacked = unpack_ops(ops)
        shares = sends_only(unpacked)
        if not shares and any(isinstance(op, (Begin, Timer)) for op in unpacked):
            self._poke.set()  # a lifetime or a timer may now be due sooner than the clock knows
        return self.commits.enqueue(
            lambda: self.core.apply(unpacked, request_id), request_id=request_id, shares=shares
        )

    def _committed(self) -> None:
        """After each group commit, before any caller of it is answered."""
        self._failpoint("exit_after_commit")
        self._sent_something()

    async def receive(
        self,
        queue: str,
        wait: float,
        options: dict[str, Any],
        owner: Holder | str | None = None,
        settle: tuple[Any, ...] | None = None,
        reader: str | None = None,
    ) -> bytes:
        """RECEIVE, after first settling (committing / rolling back) the caller's previous
        groups when `settle` is given: a reader's loop costs one call per turn."""
        wait = checks.seconds("wait", wait, zero=True)
        deadline = time.monotonic() + wait
        pending = self._start_receive(queue, options, owner, settle, reader, packed=True)
        try:
            got = await pending
        except (
            asyncio.CancelledError
        ):  # its caller left (an in-process caller: actors.client.local)
            self._give_back_answered(pending, (queue, wait, options))
            raise
        if got != NOTHING_RECEIVED or settle is not None or wait == 0:
            return got
        owner = self.holders.full(owner)
        groups = await self._wait_and_take(
            queue, deadline, options, self.holders.adopt(owner), reader
        )
        if groups:
            self.holders.adopt(owner)
        return pack_received(groups)

    def _give_back_answered(self, pending: asyncio.Future, args: tuple[Any, ...]) -> None:
        """A receive cancelled just after its take was answered (between the group commit and
        its resuming): what it took goes back to the queue, not held for nobody until its lease
        ends (that rollback would count toward poison)."""
        ids = answered_locks("receive", args, pending)
        if ids:
            self.core.give_back(ids)

    def _start_receive(
        self,
        queue: str,
        options: dict[str, Any],
        owner: Holder | str | None,
        settle: tuple[Any, ...] | None,
        reader: str | None,
        packed: bool = False,
    ) -> asyncio.Future:
        """A receive's settle part (in the next group commit) and its first take (after it).
        A settle's answer is not held behind a wait: with nothing to take, the caller hears at
        once that its commit is done, and waits in its next call."""
        owner = self.holders.full(owner)  # the take below may adopt it again, later
        owner_id = self.holders.adopt(owner)
        settling = request_id = None
        shares = False
        if settle is not None:
            commit, rollback, ops, states, request_id = settle
            unpacked: Settle = (commit, rollback, unpack_ops(ops), states, request_id)
            settling = lambda: self.core.settle(*unpacked)  # noqa: E731
            shares = settle_shares(rollback, unpacked[2])

        def take() -> Any:
            groups = self._take(queue, options, owner_id, reader)
            if groups:
                self.holders.adopt(owner)  # it holds locks now: watch it (it may be forgotten)
            return pack_received(groups) if packed else groups

        return self.commits.enqueue(
            settling, take, tag="settle", request_id=request_id, shares=shares
        )

    def _take(
        self, queue: str, options: dict[str, Any], owner_id: str | None, reader: str | None
    ) -> list[ReceivedGroup]:
        if reader is not None and not self.pools.wants(queue, reader):
            # checked on every pass: a reader retired while it waited takes nothing more
            raise ReaderRetired(f"reader {reader} of queue {queue!r} is no longer wanted")
        groups = self.core.receive(queue, owner=owner_id, **options)
        if groups and options.get("lease_s"):
            self._poke.set()
        return groups

    async def _wait_and_take(
        self,
        queue: str,
        deadline: float,
        options: dict[str, Any],
        owner_id: str | None,
        reader: str | None,
    ) -> list[ReceivedGroup]:
        # a take, then the wait, with no await between: the caller's first take ran in a group
        # commit some steps ago, and a message that arrived since woke nobody (a wait that
        # began after it would have slept through it, up to its whole timeout)
        while True:
            groups = self._take(queue, options, owner_id, reader)
            if groups:
                return groups
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            await self._wait(queue, left)

    async def receive_groups(
        self,
        queue: str,
        wait: float,
        options: dict[str, Any],
        owner_id: str | None,
        settle: Settle | None,
        reader: str | None,
    ) -> list[ReceivedGroup]:
        """The in-process readers' receive (activation's internal readers): unpacked."""
        wait = checks.seconds("wait", wait, zero=True)
        deadline = time.monotonic() + wait
        settling = None if settle is None else (lambda: self.core.settle(*settle))
        groups = await self.commits.submit(
            settling, lambda: self._take(queue, options, owner_id, reader), tag="settle"
        )
        if groups or settle is not None:
            return groups
        return await self._wait_and_take(queue, deadline, options, owner_id, reader)

    async def get_conversation_group(
        self,
        queue: str,
        wait: float,
        lease_s: float | None,
        owner: Holder | str | None = None,
    ) -> tuple[str, str] | None:
        wait = checks.seconds("wait", wait, zero=True)
        deadline = time.monotonic() + wait
        owner_id = self.holders.adopt(owner)
        while True:
            found = self.core.get_conversation_group(queue, owner_id, lease_s)
            left = deadline - time.monotonic()
            if found or left <= 0:
                return found
            await self._wait(queue, left)

    async def settle_groups(
        self,
        commit: list[str],
        rollback: list[str],
        ops: Sequence[Op],
        states: Mapping[str, bytes | None],
        request_id: str | None,
    ) -> dict[str, Any]:
        """Commit / roll back, in the next group commit: every caller (clients, receive's
        settle part, internal readers) settles through here."""
        return await self._start_settle(commit, rollback, ops, states, request_id)

    def _start_settle(
        self,
        commit: list[str],
        rollback: list[str],
        ops: Sequence[Op],
        states: Mapping[str, bytes | None],
        request_id: str | None,
    ) -> asyncio.Future:
        return self.commits.enqueue(
            lambda: self.core.settle(commit, rollback, ops, states, request_id),
            request_id=request_id,
            shares=settle_shares(rollback, ops),
        )

    async def settle(
        self,
        commit: list[str],
        rollback: list[str],
        ops: bytes,
        states: dict[str, bytes | None],
        request_id: str,
    ) -> dict[str, Any]:
        return await self._start_settle(commit, rollback, unpack_ops(ops), states, request_id)

    async def move_conversation(self, handle: str, group_id: str) -> None:
        self.core.move_conversation(handle, group_id)

    async def give_back(self, lock_ids: list[str]) -> int:
        """What a waiting receive took for a caller that had stopped waiting, returned to the
        queue without counting toward poison (the client's coalescer calls it)."""
        return self.core.give_back(checks.items("lock ids", lock_ids))

    # --- fault injection -------------------------------------------------------------------------

    async def arm_failpoint(self, name: str) -> None:
        """Arm a failpoint (see FAILPOINTS); it fires once, in this process."""
        if name not in FAILPOINTS:
            raise InvalidArgument(f"unknown failpoint {name!r}; use one of {sorted(FAILPOINTS)}")
        self._failpoints.add(name)

    def _failpoint(self, name: str) -> None:
        if name in self._failpoints:
            os._exit(1)

    async def reader_actors(self, queue: str) -> list[Any]:
        """The running pool readers of a queue (for fault-injection tests and `verify`)."""
        return self.pools.reader_handles(queue)
