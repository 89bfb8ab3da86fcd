"""A mirrored broker: start it, connect to it, fail it over, see its partners' state, stop it.

One broker id, two partners (`PartnerActor`, each a named actor with its own store on its own
node) and a witness (`WitnessActor`, on the head node). `MirroredBroker` is a `Broker` handle that
follows the principal: the witness says which partner it is, and a call refused with
`NotPrincipal`, or to a partner that died or is restarting, asks again and is retried there with
the same request id (so it is applied once).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable
from typing import Any, NamedTuple

import ray

from actors.errors import (
    BrokerError,
    BrokerUnavailable,
    InvalidArgument,
    MirrorMismatch,
    MirrorPlacement,
    NotPrincipal,
    UnknownBroker,
)
from actors.mirroring.pairkey import PairKey, new_key
from actors.model.limits import Limits
from actors.remote.client import DEFAULT_NAMESPACE, Broker
from actors.remote.partner import PING_GROUP, PartnerActor
from actors.remote.witness import WitnessActor, witness_name
from actors.service.broker import check_name_and_path

START_S = 60.0  # how long a start waits for the mirror to be in step
STOP_S = 30.0  # how long a stop waits for the actors' names to be free
WATCH_S = 0.25  # a call not answered by then asks the witness for the principal (then doubling,
WATCH_MAX_S = 0.5  # up to this)


class Partner(NamedTuple):
    """One partner: its actor name, its store path (on its node's disk) and Ray actor options
    that place it (resources, scheduling_strategy, ...)."""

    name: str
    path: str
    options: dict[str, Any] = {}


def _head_node() -> str | None:
    for node in ray.nodes():
        if node.get("Alive") and "node:__internal_head__" in node.get("Resources", {}):
            return node["NodeID"]
    return None


def start_mirrored_broker(
    name: str,
    principal: Partner,
    mirror: Partner,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    durability: str = "normal",
    limits: dict[str, Any] | None = None,
    failover_after_s: float = 1.0,
    witness_path: str | None = None,
    force: bool = False,
    detached: bool = False,
    retry_s: float = 60.0,
) -> MirroredBroker:
    """Start (or attach to) the mirrored broker `name`: the witness, then both partners, then
    wait until the mirror is in step. Refused (`MirrorPlacement`) when both partners land on one
    node unless `force`; (`MirrorMismatch`) when the mirror's store holds another broker, or when
    only some of its actors run (they hold another start's key: stop it and start it again)."""
    for p in (principal, mirror):
        check_name_and_path(p.name, p.path)
    Limits.of(limits or {})
    names = (witness_name(name), principal.name, mirror.name)
    running = [n for n in names if _running(n, namespace)]
    if names[0] in running:  # other partners than its witness has: say so, as it would
        roles = roles_of(name, namespace)
        if {roles["principal"], roles["mirror"]} != {principal.name, mirror.name}:
            raise MirrorMismatch(
                f"mirrored broker {name!r} runs with partners {roles['principal']!r} and "
                f"{roles['mirror']!r}, not {principal.name!r} and {mirror.name!r}"
            )
    if running and len(running) < len(names):
        stop = (
            f"stop_mirrored_broker({name!r})"
            if names[0] in running
            else " and ".join(
                f"ray.kill(ray.get_actor({n!r}, namespace={namespace!r}))" for n in running
            )  # fmt: skip
        )
        raise MirrorMismatch(
            f"mirrored broker {name!r} runs only in part ({', '.join(map(repr, running))} of "
            f"{', '.join(map(repr, names))}): the actors of one start share a key that a new one "
            f"cannot join. Stop what runs ({stop}), then start it again; the stores and the "
            "witness's record stay"
        )
    # a new start's key; ignored by actors that already run (get_if_exists), which keep theirs
    key = PairKey(name, new_key(), (principal.name, mirror.name))
    wpath = witness_path or os.path.join(
        os.path.dirname(os.path.abspath(principal.path)), f"{name}.witness.json"
    )
    lifetime = "detached" if detached else None
    head = _head_node()
    place = {}
    if head is not None:
        # the head holds the GCS: if it goes, the cluster goes, so the witness may as well be
        # pinned there (a witness on a worker node would die with that node)
        strategy = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(head, soft=False)
        place = {"scheduling_strategy": strategy}
    witness = (
        ray.remote(WitnessActor)
        .options(
            name=witness_name(name),
            namespace=namespace,
            lifetime=lifetime,
            max_restarts=-1,
            get_if_exists=True,
            num_cpus=0,
            **place,
        )  # fmt: skip
        .remote(name, principal.name, mirror.name, wpath, namespace, key)
    )
    try:
        _get(witness.get.remote())  # surfaces a mismatched or unwritable witness record now
    except BrokerError:
        _kill([witness], None)
        raise
    actors = []
    for p in (principal, mirror):
        options = {"num_cpus": 0, "max_concurrency": 1000, **p.options}
        actors.append(
            ray.remote(concurrency_groups={PING_GROUP: 2})(PartnerActor)
            .options(
                name=p.name,
                namespace=namespace,
                lifetime=lifetime,
                max_restarts=-1,
                max_task_retries=0,
                get_if_exists=True,
                **options,
            )  # fmt: skip
            .remote(
                p.name, name, p.path, durability, limits or {}, namespace, failover_after_s, key
            )
        )
    try:
        infos = _get([a.info.remote() for a in actors])  # a store that will not open, say
    except BrokerError:
        _kill([*actors, witness], wpath)
        raise
    for p, info in zip((principal, mirror), infos, strict=True):
        if info["path"] != p.path:  # attached to a running partner started otherwise
            raise InvalidArgument(
                f"partner {p.name!r} already runs with store {info['path']!r}, not {p.path!r}; "
                "start it with the same one, or stop the mirrored broker first"
            )
    if infos[0]["node"] == infos[1]["node"] and not force:
        _kill([*actors, witness], wpath)
        raise MirrorPlacement(name, infos[0]["node"])
    handle = MirroredBroker(name, namespace, retry_s)
    # a broker that is not detached lives while its starter's handle does (as start_broker's)
    handle.owned = [*actors, witness]
    deadline = time.monotonic() + START_S
    while True:
        status = mirror_status(name, namespace)
        if status["synchronized"]:
            return handle
        reason = status["principal_state"].get("reason", "")
        # a mismatched store, or actors of two starts (one died between the check above and
        # its creation here) whose calls to each other are refused: no use waiting
        broken = ("MirrorMismatch", "holds broker", "MirrorCallerRefused", "refused: the caller")
        if any(b in reason for b in broken) or time.monotonic() > deadline:
            _kill([*actors, witness], wpath)
            raise MirrorMismatch(f"mirrored broker {name!r}: the mirror did not come in step: "
                                 f"{reason}")  # fmt: skip
        time.sleep(0.05)


def _running(actor: str, namespace: str) -> bool:
    try:
        ray.get_actor(actor, namespace=namespace)
    except ValueError:
        return False
    return True


def _get(refs: Any) -> Any:
    """ray.get, with an error raised in the actor re-raised as itself."""
    try:
        return ray.get(refs, timeout=START_S)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, BrokerError):
            raise cause.with_traceback(None) from None
        raise


def _kill(actors: list[Any], witness_file: str | None) -> None:
    for a in actors:
        with contextlib.suppress(Exception):
            ray.kill(a, no_restart=True)
    if witness_file is not None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(witness_file)


def roles_of(name: str, namespace: str = DEFAULT_NAMESPACE) -> dict[str, Any]:
    """The witness's record: principal, mirror, epoch, synchronized, failovers."""
    try:
        witness = ray.get_actor(witness_name(name), namespace=namespace)
    except ValueError:
        raise UnknownBroker(
            name,
            f"no mirrored broker of that name runs in namespace {namespace!r} (its witness "
            f"{witness_name(name)!r} is not running); start it with start_mirrored_broker",
        ) from None
    try:
        return ray.get(witness.get.remote(), timeout=10)
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
        raise BrokerUnavailable(f"the witness of mirrored broker {name!r}: {exc}") from None


def mirror_status(name: str, namespace: str = DEFAULT_NAMESPACE) -> dict[str, Any]:
    """Both partners' role and state, the mirror's lag (transactions, seconds), failovers."""
    roles = roles_of(name, namespace)
    out: dict[str, Any] = {**roles, "partners": {}}
    for partner in (roles["principal"], roles["mirror"]):
        try:
            actor = ray.get_actor(partner, namespace=namespace)
            out["partners"][partner] = ray.get(actor.mirror_status.remote(), timeout=5)
        except (ValueError, ray.exceptions.RayError) as exc:
            out["partners"][partner] = {"partner": partner, "role": "unreachable",
                                        "error": str(exc)}  # fmt: skip
    out["principal_state"] = out["partners"][roles["principal"]]
    witness = ray.get_actor(witness_name(name), namespace=namespace)
    out["events"] = ray.get(witness.recent_events.remote(), timeout=5)
    return out


def failover(name: str, namespace: str = DEFAULT_NAMESPACE) -> dict[str, Any]:
    """The operator's failover: the mirror becomes principal (refused, `NoFailover`, unless it
    is synchronized); the old principal rejoins as mirror."""
    mirror = roles_of(name, namespace)["mirror"]
    actor = ray.get_actor(mirror, namespace=namespace)
    try:
        return ray.get(actor.failover.remote())
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        raise (cause if cause is not None else exc).with_traceback(None) from None


def stop_mirrored_broker(name: str, namespace: str = DEFAULT_NAMESPACE) -> None:
    """Stop both partners and the witness (the stores and the witness file stay); returns once
    their names are free, so the mirrored broker can be started again at once."""
    roles = roles_of(name, namespace)
    names = (roles["principal"], roles["mirror"], witness_name(name))
    for actor_name in names:
        with contextlib.suppress(ValueError):
            ray.kill(ray.get_actor(actor_name, namespace=namespace), no_restart=True)
    deadline = time.monotonic() + STOP_S
    while any(_running(n, namespace) for n in names) and time.monotonic() < deadline:
        time.sleep(0.05)


class MirroredBroker(Broker):
    """A handle on a mirrored broker: the principal's actor, followed through failovers."""

    # its calls go over a direct channel to the principal, as a broker's do: a call refused
    # there with `NotPrincipal`, or not answered while the witness names another principal,
    # is sent again (through Ray, then on the new principal's channel)

    def __init__(
        self, mirrored: str, namespace: str = DEFAULT_NAMESPACE, retry_s: float = 60.0
    ) -> None:
        self.mirrored = mirrored
        self.owned: list[Any] = []  # the actors this handle started (kept alive by it)
        principal = roles_of(mirrored, namespace)["principal"]
        super().__init__(ray.get_actor(principal, namespace=namespace), principal, namespace,
                         retry_s)  # fmt: skip

    def __reduce__(self):
        return MirroredBroker, (self.mirrored, self.namespace, self.retry_s)

    def stop(self, delete_store: bool = False) -> None:
        """Stop the whole mirrored broker: both partners and the witness (stopping only the
        principal's actor would be a failover). The stores stay; `delete_store` is refused
        (each partner's file is on its own node's disk)."""
        if delete_store:
            raise InvalidArgument(
                f"mirrored broker {self.mirrored!r}: its stores are on two nodes' disks; stop it, "
                "then delete each partner's file on its node"
            )
        stop_mirrored_broker(self.mirrored, self.namespace)

    # A call to a partner whose node just died may hang until Ray notices the node is gone
    # (its health checks: seconds to tens of seconds). So a call that takes longer than
    # WATCH_S asks the witness every WATCH_S whether the principal moved, and if it did, is
    # given up (`PrincipalMoved`) and sent again, with the same request id, to the new one.

    def result(self, ref: ray.ObjectRef) -> Any:
        every = WATCH_S
        while True:
            ready, _ = ray.wait([ref], timeout=every)
            every = min(every * 2, WATCH_MAX_S)  # a long receive asks the witness seldom
            if ready:
                return ray.get(ref)
            try:
                moved = self._moved(roles_of(self.mirrored, self.namespace))
            except BrokerError:  # the witness cannot say now: keep waiting for the answer
                moved = False
            if moved:
                raise PrincipalMoved(self.name)

    async def result_async(self, ref: ray.ObjectRef) -> Any:
        return await self._watched(ref)

    async def channel_result(self, answer: Awaitable[Any]) -> Any:
        try:
            return await self._watched(answer)
        except NotPrincipal:  # this partner stepped down: ask the witness, send it again
            raise PrincipalMoved(self.name) from None

    async def _watched(self, answer: Awaitable[Any]) -> Any:
        answer = asyncio.ensure_future(answer)
        every = WATCH_S
        while True:
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(asyncio.shield(answer), every)
            every = min(every * 2, WATCH_MAX_S)
            try:
                # looked up only for a call that waits this long: a lookup is a round trip to
                # Ray's control store, which every call would otherwise pay before its answer
                witness = ray.get_actor(witness_name(self.mirrored), namespace=self.namespace)
                moved = self._moved(await asyncio.wait_for(witness.get.remote(), 10))
            except (TimeoutError, ValueError, ray.exceptions.RayError):
                moved = False  # the witness cannot say now: keep waiting for the answer
            if moved:  # its answer, if one still comes, is not waited for
                answer.add_done_callback(lambda f: f.cancelled() or f.exception())
                raise PrincipalMoved(self.name)

    def _moved(self, roles: dict[str, Any]) -> bool:
        return roles["principal"] != self.name

    def follow(self, exc: ray.exceptions.RayError) -> bool:
        cause = getattr(exc, "cause", None)
        refused = isinstance(cause, NotPrincipal)
        transient = isinstance(
            exc, ray.exceptions.RayActorError | ActorUnavailable | PrincipalMoved
        )
        if not refused and not transient:
            return False
        with contextlib.suppress(ValueError, BrokerError, ray.exceptions.RayError):
            principal = roles_of(self.mirrored, self.namespace)["principal"]
            actor = ray.get_actor(principal, namespace=self.namespace)
            self.actor, self.name = actor, principal
        return True  # retried (on the same partner while the failover is under way)


class PrincipalMoved(ray.exceptions.RayError):
    """A call gave up waiting on a partner that is no longer principal; it is sent again."""

    def __init__(self, partner: str) -> None:
        super().__init__(f"{partner!r} is no longer the principal")


ActorUnavailable = ray.exceptions.ActorUnavailableError

__all__ = [
    "MirroredBroker",
    "Partner",
    "PartnerActor",
    "failover",
    "mirror_status",
    "start_mirrored_broker",
    "stop_mirrored_broker",
]
