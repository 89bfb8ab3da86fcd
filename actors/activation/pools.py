"""Reader pools: a broker's side of activation (starting, watching and retiring readers).

Every decision (how many readers, when to look again, the spare reader, the back-off after a
failure) is `PoolPolicy`'s; what a reader does is `read_until_idle`. This module carries the
decisions out: as tasks on the broker's own event loop ("internal"), or in reader processes a
`ReaderLauncher` makes ("pool"; the Ray runtime supplies one that makes reader actors). Without a
launcher (the in-process `LocalBroker`) every reader runs internal. Plain Python, asyncio.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from actors.activation.policy import PoolPolicy
from actors.activation.reader import ReaderPort, read_until_idle
from actors.errors import InvalidDefinition, ReaderLost
from actors.model.catalog import Activation, activation_code
from actors.model.code_names import check_code_name, import_code
from actors.model.limits import Limits

log = logging.getLogger("raybroker")


class ReaderLauncher(Protocol):
    """Makes, runs and kills reader processes. `run` raises `ReaderLost` when the process died
    (with the owner id its locks were held under, if it had one)."""

    def new(self) -> Any: ...

    async def run(
        self, reader: Any, queue: str, reader_id: str, activation: Activation
    ) -> dict[str, Any]: ...

    def kill(self, reader: Any) -> None: ...

    def handle(self, reader: Any) -> Any: ...


class PoolsHost(Protocol):
    """What the pools need of their broker."""

    name: str

    def depth(self, queue: str) -> tuple[int, int]: ...
    def release_owner(self, owner: str) -> int: ...
    def write_event(self, kind: str, subject: str, detail: str) -> None: ...
    def reader_port(self) -> ReaderPort: ...
    def queue_definitions(self) -> dict[str, Any]: ...


@dataclass
class _Pool:
    readers: dict[str, asyncio.Future] = field(default_factory=dict)
    started_with: dict[str, Activation] = field(default_factory=dict)  # reader -> its activation
    processes: dict[str, Any] = field(default_factory=dict)  # pool readers' processes
    spare: Any = None  # a started, idle reader process (the policy says when)


class ReaderPools:
    def __init__(
        self, host: PoolsHost, limits: Limits, launcher: ReaderLauncher | None = None
    ) -> None:
        self.host = host
        self.launcher = launcher
        self.code_modules = limits.code_modules  # where its handlers may be
        self.policy = PoolPolicy(time.monotonic, limits)
        self.pools: dict[str, _Pool] = {}
        self._scheduled: set[str] = set()
        self._ids = itertools.count(1)

    def activation(self, queue: str) -> Activation | None:
        """The queue's activation if it should have readers now."""
        q = self.host.queue_definitions().get(queue)
        if q is None or not q.enabled or q.activation is None or not q.activation.enabled:
            return None
        return q.activation

    def wants(self, queue: str, reader: str) -> bool:
        """Whether `reader` should go on: its queue is active, and with the activation it was
        started with (an altered activation, a new handler or options, retires it)."""
        pool = self.pools.get(queue)
        act = self.activation(queue)
        return act is not None and pool is not None and pool.started_with.get(reader) == act

    def readers(self, queue: str) -> int:
        pool = self.pools.get(queue)
        return len(pool.readers) if pool else 0

    def reader_handles(self, queue: str) -> list[Any]:
        """The handles of a queue's running pool readers (for fault-injection tests)."""
        pool = self.pools.get(queue)
        if not pool or self.launcher is None:
            return []
        return [self.launcher.handle(p) for p in pool.processes.values()]

    def nudge(self, queue: str) -> None:
        """Messages arrived on `queue` (or a group came free): look at it soon."""
        queues = self.host.queue_definitions()
        if queue in self._scheduled or queue not in queues:
            return
        if queues[queue].activation is None and queue not in self.pools:
            return
        self._scheduled.add(queue)
        asyncio.get_running_loop().call_soon(self._check, queue)

    def tick(self) -> None:
        for name, q in list(self.host.queue_definitions().items()):
            if q.activation is not None or name in self.pools:
                self._check(name)

    def _check(self, queue: str) -> None:
        self._scheduled.discard(queue)
        act = self.activation(queue)
        pool = self.pools.setdefault(queue, _Pool())
        depth, removed = self.host.depth(queue)
        decision = self.policy.decide(queue, act, depth, removed, len(pool.readers))
        if decision.drop_spare:
            self._drop_spare(pool)
        if decision.make_spare and self.launcher is not None:
            pool.spare = self.launcher.new()
        if act is None:  # an inactive queue is never told to start readers
            return
        for _ in range(decision.start):
            self._start(queue, act, pool)

    def _start(self, queue: str, act: Activation, pool: _Pool) -> None:
        internal = act.placement == "internal" or self.launcher is None
        rid = f"{queue}/{'internal' if internal else act.placement}-{next(self._ids)}"
        try:  # a definition from before its module was allowed (or since disallowed) runs not
            for path in activation_code(act):
                check_code_name(path, self.code_modules)
        except InvalidDefinition as exc:
            self._failed(queue, rid, exc)
            return
        if internal:
            task = asyncio.ensure_future(self._run_internal(queue, act, rid))
        else:
            task = asyncio.ensure_future(self._run_pooled(queue, act, rid, pool))
        pool.readers[rid] = task
        pool.started_with[rid] = act
        task.add_done_callback(lambda _t: self._ended(queue, rid))

    def _ended(self, queue: str, rid: str) -> None:
        pool = self.pools.get(queue)
        if pool is not None:
            pool.readers.pop(rid, None)
            pool.started_with.pop(rid, None)
        self.nudge(queue)  # more may have come while it was leaving

    async def _run_internal(self, queue: str, act: Activation, rid: str) -> None:
        try:
            handler = import_code(act.handler)  # checked by _start
            stats = await read_until_idle(
                self.host.reader_port(), queue, act, handler, time.monotonic, rid
            )
            log.info("reader %s stopped (%s) after %d messages", rid, stats.reason, stats.handled)
        except Exception as exc:
            self._failed(queue, rid, exc)

    async def _run_pooled(self, queue: str, act: Activation, rid: str, pool: _Pool) -> None:
        launcher = self.launcher
        assert launcher is not None
        process, pool.spare = pool.spare or launcher.new(), None
        self.policy.spare_taken(queue)
        pool.processes[rid] = process
        try:
            stats = await launcher.run(process, queue, rid, act)
        except ReaderLost as exc:
            released = self.host.release_owner(exc.owner) if exc.owner else 0
            log.warning("reader %s died (%s); %d lock(s) released", rid, exc, released)
            self.policy.reader_ended(queue, self.activation(queue), warm=False)
            return
        except Exception as exc:
            self._failed(queue, rid, exc)
            self.policy.reader_ended(queue, self.activation(queue), warm=False)
            launcher.kill(process)
            return
        finally:
            pool.processes.pop(rid, None)
        log.info("reader %s stopped (%s) after %d messages", rid, stats["reason"], stats["handled"])
        if self.policy.reader_ended(queue, self.activation(queue)):
            pool.spare = process
        else:
            launcher.kill(process)

    def _failed(self, queue: str, rid: str, exc: Exception) -> None:
        cause = getattr(exc, "cause", exc)
        log.error("reader %s could not run: %s", rid, cause)
        self.host.write_event("ActivationFailed", queue, f"reader {rid}: {cause}")
        self.policy.reader_failed(queue)

    def _drop_spare(self, pool: _Pool) -> None:
        if pool.spare is not None and self.launcher is not None:
            self.launcher.kill(pool.spare)
        pool.spare = None

    def shutdown(self) -> list[asyncio.Future]:
        """Drop the spares; returns the running readers' tasks, for the caller to cancel."""
        for queue, pool in self.pools.items():
            self._drop_spare(pool)
            self.policy.spare_gone(queue)
        return [task for pool in self.pools.values() for task in pool.readers.values()]
