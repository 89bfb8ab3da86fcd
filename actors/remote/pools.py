"""Reader pools: the broker actor's side of activation (starting, watching and retiring readers).

Every decision (how many readers, when to look again, the spare actor, the back-off after a
failure) is `actors.activation.PoolPolicy`'s; what a reader does is
`actors.activation.read_until_idle`. This module only carries the decisions out, in reader actors
("pool") or as tasks in the broker's own process ("internal"), and notices when readers end.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ray

from ..activation import PoolPolicy, PoolTunables, read_until_idle
from ..catalog import Activation, resolve_handler
from ..envelope import ReceivedGroup
from .reader import ReaderActor

if TYPE_CHECKING:
    from .broker import BrokerActor

log = logging.getLogger("raybroker")


@dataclass
class _ReaderActor:
    """A reader actor's handle, and its id (the owner its locks are held under) once it answers."""

    handle: Any
    actor_id: Any  # ObjectRef[str] of ReaderActor.actor_id, asked for when the actor is made


@dataclass
class _Pool:
    readers: dict[str, asyncio.Future] = field(default_factory=dict)
    actors: dict[str, _ReaderActor] = field(default_factory=dict)  # pool readers' actors
    spare: _ReaderActor | None = None  # a started, idle reader actor (the policy says when)


class ReaderPools:
    def __init__(self, broker: BrokerActor, tunables: PoolTunables | None = None) -> None:
        self.broker = broker
        self.core = broker.core
        self.policy = PoolPolicy(time.monotonic, tunables)
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
        return [a.handle for a in pool.actors.values()] if pool else []

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
        depth, removed = self.core.depth(queue)
        decision = self.policy.decide(queue, act, depth, removed, len(pool.readers))
        if decision.drop_spare:
            self._drop_spare(pool)
        if decision.make_spare:
            pool.spare = self._new_reader_actor()
        if act is None:  # an inactive queue is never told to start readers
            return
        for _ in range(decision.start):
            self._start(queue, act, pool)

    def _start(self, queue: str, act: Activation, pool: _Pool) -> None:
        rid = f"{queue}/{act.placement}-{next(self._ids)}"
        if act.placement == "internal":
            task = asyncio.ensure_future(self._run_internal(queue, act, rid))
        else:
            task = asyncio.ensure_future(self._run_pooled(queue, act, rid, pool))
        pool.readers[rid] = task
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
        self.policy.spare_taken(queue)
        pool.actors[rid] = actor
        try:
            stats = await actor.handle.run.remote(queue, rid, act.__dict__)
        except ray.exceptions.RayActorError as exc:
            owner = await self._actor_id(actor)
            released = self.core.release_owner(owner) if owner else 0
            log.warning("reader %s died (%s); %d lock(s) released", rid, exc, released)
            self.policy.reader_ended(queue, self.activation(queue), warm=False)
            return
        except Exception as exc:
            self._failed(queue, rid, exc)
            self.policy.reader_ended(queue, self.activation(queue), warm=False)
            ray.kill(actor.handle)
            return
        finally:
            pool.actors.pop(rid, None)
        log.info("reader %s stopped (%s) after %d messages", rid, stats["reason"], stats["handled"])
        if self.policy.reader_ended(queue, self.activation(queue)):
            pool.spare = actor
        else:
            ray.kill(actor.handle)

    @staticmethod
    async def _actor_id(actor: _ReaderActor) -> str | None:
        """The reader actor's id; None if it died before it could say (then it held no locks:
        Ray runs its calls in order, and this one was its first)."""
        try:
            return await actor.actor_id
        except ray.exceptions.RayError:
            return None

    def _failed(self, queue: str, rid: str, exc: Exception) -> None:
        cause = getattr(exc, "cause", exc)
        log.error("reader %s could not run: %s", rid, cause)
        self.core.record_event("ActivationFailed", queue, f"reader {rid}: {cause}")
        self.policy.reader_failed(queue)

    def _new_reader_actor(self) -> _ReaderActor:
        if self._client is None:
            from .client import Broker

            ctx = ray.get_runtime_context()
            self._client = Broker(ctx.current_actor, self.broker.name, self.broker.namespace)
        cls = ray.remote(ReaderActor).options(
            num_cpus=0, scheduling_strategy="SPREAD", max_restarts=0
        )
        handle = cls.remote(self._client)
        return _ReaderActor(handle, handle.actor_id.remote())

    def _drop_spare(self, pool: _Pool) -> None:
        if pool.spare is not None:
            ray.kill(pool.spare.handle)
            pool.spare = None

    def shutdown(self) -> None:
        for queue, pool in self.pools.items():
            self._drop_spare(pool)
            self.policy.spare_gone(queue)


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
