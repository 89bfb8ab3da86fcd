"""Reader pools: the broker actor's side of activation (starting, watching and retiring readers).

How many readers a queue needs is decided by `actors.activation.readers_to_start`; what a reader
does is `actors.activation.read_until_idle`. This module only starts them, in reader actors
("pool") or as tasks in the broker's own process ("internal"), and notices when they end.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ray

from ..activation import read_until_idle, readers_to_start
from ..catalog import Activation, resolve_handler
from ..envelope import ReceivedGroup
from .reader import ReaderActor

if TYPE_CHECKING:
    from .broker import BrokerActor

log = logging.getLogger("raybroker")

GROWTH_CHECK_S = 0.5  # how often a running pool looks at whether its queue is still growing
FAILED_START_BACKOFF_S = 5.0


@dataclass
class _Pool:
    readers: dict[str, asyncio.Future] = field(default_factory=dict)
    actors: dict[str, Any] = field(default_factory=dict)  # pool readers' actor handles
    spare: Any = None  # a started, idle reader actor, so activation does not wait for a process
    last_depth: int = 0
    last_removed: int = 0
    last_check: float = 0.0
    next_check: float = 0.0
    backoff_until: float = 0.0  # after a reader could not start: no new ones before this
    started: int = 0


class ReaderPools:
    def __init__(self, broker: BrokerActor) -> None:
        self.broker = broker
        self.core = broker.core
        self.pools: dict[str, _Pool] = {}
        self._scheduled: set[str] = set()
        self._ids = itertools.count(1)
        self._client: Any = None

    def activation(self, queue: str) -> Activation | None:
        """The queue's activation if it should have readers now."""
        q = self.core.catalog.queues.get(queue)
        if q is None or not q.enabled or q.activation is None or not q.activation.enabled:
            return None
        return q.activation

    def wants(self, queue: str, reader: str) -> bool:
        pool = self.pools.get(queue)
        return self.activation(queue) is not None and pool is not None and reader in pool.readers

    def readers(self, queue: str) -> int:
        pool = self.pools.get(queue)
        return len(pool.readers) if pool else 0

    def reader_actors(self, queue: str) -> list[Any]:
        """The actor handles of a queue's running pool readers (for fault-injection tests)."""
        pool = self.pools.get(queue)
        return list(pool.actors.values()) if pool else []

    def nudge(self, queue: str) -> None:
        """Messages arrived on `queue` (or a group came free): look at it soon."""
        if queue in self._scheduled or queue not in self.core.catalog.queues:
            return
        if self.core.catalog.queues[queue].activation is None and queue not in self.pools:
            return
        self._scheduled.add(queue)
        asyncio.get_running_loop().call_soon(self._check, queue)

    def tick(self) -> None:
        for name, q in self.core.catalog.queues.items():
            if q.activation is not None or name in self.pools:
                self._check(name)

    def _check(self, queue: str) -> None:
        self._scheduled.discard(queue)
        act = self.activation(queue)
        pool = self.pools.setdefault(queue, _Pool())
        if act is None or act.placement != "pool":
            self._drop_spare(pool)  # running readers are retired at their next receive
        if act is None:
            return
        now = time.monotonic()
        if now < pool.backoff_until:
            return
        if act.placement == "pool" and pool.spare is None and not pool.readers:
            # one started actor waits for the next activation; a reader that goes idle becomes
            # the spare (it is warm), so none is made while readers run
            pool.spare = self._new_reader_actor()
        if pool.readers and now < pool.next_check:
            return
        depth, removed = self.core.depth(queue)
        rate = (removed - pool.last_removed) / max(now - pool.last_check, 1e-3)
        n = readers_to_start(depth, pool.last_depth, len(pool.readers), act.max_readers, rate)
        pool.last_depth, pool.last_removed = depth, removed
        pool.last_check, pool.next_check = now, now + GROWTH_CHECK_S
        for _ in range(n):
            self._start(queue, act, pool)

    def _start(self, queue: str, act: Activation, pool: _Pool) -> None:
        rid = f"{queue}/{act.placement}-{next(self._ids)}"
        if act.placement == "internal":
            task = asyncio.ensure_future(self._run_internal(queue, act, rid))
        else:
            task = asyncio.ensure_future(self._run_pooled(queue, act, rid, pool))
        pool.readers[rid] = task
        pool.started += 1
        task.add_done_callback(lambda _t: self._ended(queue, rid))

    def _ended(self, queue: str, rid: str) -> None:
        pool = self.pools.get(queue)
        if pool is not None:
            pool.readers.pop(rid, None)
        self.nudge(queue)  # more may have come while it was leaving

    async def _run_internal(self, queue: str, act: Activation, rid: str) -> None:
        try:
            handler = resolve_handler(act.handler)
            stats = await read_until_idle(
                _InternalPort(self.broker), queue, act, handler, time.monotonic, rid
            )
            log.info("reader %s stopped (%s) after %d messages", rid, stats.reason, stats.handled)
        except Exception as exc:
            self._failed(queue, rid, exc)

    async def _run_pooled(self, queue: str, act: Activation, rid: str, pool: _Pool) -> None:
        actor, pool.spare = pool.spare or self._new_reader_actor(), None
        pool.actors[rid] = actor
        try:
            stats = await actor.run.remote(queue, rid, act.__dict__)
        except ray.exceptions.RayActorError as exc:
            owner = getattr(getattr(actor, "_actor_id", None), "hex", lambda: None)()
            released = self.core.release_owner(owner) if owner else 0
            log.warning("reader %s died (%s); %d lock(s) released", rid, exc, released)
            return
        except Exception as exc:
            self._failed(queue, rid, exc)
            ray.kill(actor)
            return
        finally:
            pool.actors.pop(rid, None)
        log.info("reader %s stopped (%s) after %d messages", rid, stats["reason"], stats["handled"])
        if pool.spare is None and self.activation(queue) is not None:
            pool.spare = actor
        else:
            ray.kill(actor)

    def _failed(self, queue: str, rid: str, exc: Exception) -> None:
        cause = getattr(exc, "cause", exc)
        log.error("reader %s could not run: %s", rid, cause)
        self.core.record_event("ActivationFailed", queue, f"reader {rid}: {cause}")
        pool = self.pools.get(queue)
        if pool is not None:
            pool.backoff_until = time.monotonic() + FAILED_START_BACKOFF_S

    def _new_reader_actor(self) -> Any:
        if self._client is None:
            from .client import Broker

            ctx = ray.get_runtime_context()
            self._client = Broker(ctx.current_actor, self.broker.name, self.broker.namespace)
        cls = ray.remote(ReaderActor).options(
            num_cpus=0, scheduling_strategy="SPREAD", max_restarts=0
        )
        return cls.remote(self._client)

    def _drop_spare(self, pool: _Pool) -> None:
        if pool.spare is not None:
            ray.kill(pool.spare)
            pool.spare = None

    def shutdown(self) -> None:
        for pool in self.pools.values():
            self._drop_spare(pool)


class _InternalPort:
    """The broker itself, as a reader port: no actor call per batch."""

    def __init__(self, broker: BrokerActor) -> None:
        self.broker = broker

    async def receive(
        self,
        queue: str,
        *,
        max_groups: int,
        wait: float,
        lease: float,
        reader: str | None,
        commit: list[str],
        rollback: list[str],
        ops: list[Any],
        states: dict[str, bytes | None],
    ) -> list[ReceivedGroup]:
        settle = (commit, rollback, ops, states, None) if commit or rollback else None
        options = {"max_groups": max_groups, "lease_s": lease}
        return await self.broker.receive_groups(queue, wait, options, None, settle, reader)

    async def settle(
        self,
        *,
        commit: list[str],
        rollback: list[str],
        ops: list[Any],
        states: dict[str, bytes | None],
    ) -> Any:
        return self.broker.core.settle(commit, rollback, ops, states)
