"""Starting a broker actor: the one place `ray.remote` is applied to `BrokerActor`, with the
restart options that make a broker survive its process."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import ray

from actors.errors import BrokerError, BrokerUnavailable, InvalidArgument
from actors.model.limits import Limits
from actors.remote.broker import BrokerActor
from actors.remote.client import DEFAULT_NAMESPACE, Broker
from actors.service.broker import check_name_and_path


def start_broker(
    name: str,
    path: str = ":memory:",
    *,
    namespace: str = DEFAULT_NAMESPACE,
    durability: str = "normal",
    detached: bool = False,
    get_if_exists: bool = True,
    retry_s: float = 60.0,
    max_body_bytes: int | None = None,
    lease_s: float | None = None,
    forward_buffer: int | None = None,
    request_retention_s: float | None = None,
    limits: Mapping[str, Any] | None = None,
    **actor_options: Any,
) -> Broker:
    """Start the broker actor `name` (or attach to it if it runs), with its store at `path`
    (a SQLite file, or ":memory:" for a broker that forgets on restart). Ray restarts the actor
    if its process dies; it reopens the store and carries on. `actor_options` go to Ray
    (num_cpus, resources, scheduling_strategy, ...) for placement. `request_retention_s`: how long
    a request id is remembered (a call retried within it applies once). `limits`: any other
    `Limits` field by name (`{"audit_rows": 10_000}` bounds the delivery audit). Attaching to a
    running broker with another path, durability or limits raises `InvalidArgument`."""
    check_name_and_path(name, path)
    if path == ":memory:":
        warnings.warn(
            f"broker {name!r} keeps its store in memory, but Ray restarts a broker whose process "
            "dies and a restart empties it (catalog, dialogs, messages); give it a file path to "
            "keep them",
            RuntimeWarning,
            stacklevel=2,
        )
    given = {
        "max_body_bytes": max_body_bytes,
        "lease_s": lease_s,
        "forward_buffer": forward_buffer,
        "request_retention_s": request_retention_s,
    }
    limits = dict(limits or {}) | {k: v for k, v in given.items() if v is not None}
    Limits.of(limits)  # bad limits are refused here, before an actor starts
    options = {"num_cpus": 0, "max_concurrency": 1000, **actor_options}
    cls = ray.remote(BrokerActor).options(
        name=name,
        namespace=namespace,
        max_restarts=-1,
        max_task_retries=0,  # the client retries, with request ids, so nothing applies twice
        lifetime="detached" if detached else None,
        get_if_exists=get_if_exists,
        **options,
    )
    broker = Broker(cls.remote(name, path, durability, limits, namespace), name, namespace, retry_s)
    try:
        info = broker.info()  # surfaces a bad path, a store in use, a bad option now
    except BrokerUnavailable:
        if _failed_for_good(broker):  # a restart could not reopen its store: free the name
            broker.stop()
        raise
    except BrokerError:
        # it did not start (its store would not open); it must not keep the name, so a
        # start with the same name and a good path works
        broker.stop()
        raise
    # an attached broker keeps what it was started with, so asking for other settings is an error
    differs = _differences(info, path, durability, limits)
    if differs:
        raise InvalidArgument(
            f"broker {name!r} already runs with other settings: {'; '.join(differs)}. "
            "Start it with the same ones, or stop it first (stop_broker)"
        )
    return broker


def _failed_for_good(broker: Broker) -> bool:
    """Whether the actor died in its constructor: Ray will not restart it, yet it keeps the name."""
    try:
        ray.get(broker.actor.__ray_ready__.remote(), timeout=1.0)
    except ray.exceptions.ActorDiedError as exc:
        return exc.actor_init_failed
    except ray.exceptions.RayError:
        return False
    return False


def _differences(
    info: dict[str, Any], path: str, durability: str, limits: dict[str, Any]
) -> list[str]:
    out = []
    if info["path"] != path:
        out.append(f"path {path!r}, it runs on {info['path']!r}")
    if info["durability"] != durability:
        out.append(f"durability {durability!r}, it runs with {info['durability']!r}")
    running = info["limits"]
    for key in sorted(set(limits) | set(running)):
        asked, has = limits.get(key), running.get(key)
        if asked != has:
            asked, has = ("the default" if v is None else repr(v) for v in (asked, has))
            out.append(f"{key} {asked}, it runs with {has}")
    return out
