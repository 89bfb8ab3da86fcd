"""Deploying a loaded topology onto the Ray cluster this driver is connected to (loading and
validating, in `topologies.loader`, needs no Ray).

A deploy compares the file with what runs and applies the difference: brokers started (or
attached to), definitions created, dropped or altered, routes created and dropped, router sets
started and their replicas added or drained away. The same file twice changes nothing. `plan`
says what a deploy would change without changing it (`raybroker deploy --dry-run`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import ray

from actors import Broker, Queue, start_broker
from actors.errors import BrokerUnavailable, TopologyError
from actors.model.catalog import kind_of, to_record
from actors.model.credentials import BROKER, Certificate
from actors.remote.client import connect
from actors.remote.routers import RouterSet
from actors.remote.trust import secure_dialogs, trust_brokers

from .spec import BrokerSpec, RouterSetSpec, RouteSpec, Topology, replica_names, unsatisfiable

# Removal goes from what depends to what is depended on; creation the other way.
_DROP_ORDER = ("service", "queue", "contract", "message_type")


@dataclass
class Deployment:
    """What runs for a topology: its brokers and router sets, by name."""

    brokers: dict[str, Broker] = field(default_factory=dict)
    router_sets: dict[str, RouterSet] = field(default_factory=dict)
    changes: list[str] = field(default_factory=list)  # what this deploy changed

    def stop(self, delete_stores: bool = False) -> None:
        for rs in self.router_sets.values():
            rs.stop(delete_stores)
        for b in self.brokers.values():
            if _running(b.name) is None:  # stopped already (its store, if any, stays)
                continue
            try:
                b.stop(delete_store=delete_stores)
            except BrokerUnavailable:  # died just now
                continue


def _running(name: str) -> Broker | None:
    try:
        return connect(name, retry_s=5.0)
    except Exception:  # not running (NotFound-like errors from connect)
        return None


def _store(spec: BrokerSpec, data_dir: str) -> str:
    return spec.storage if spec.storage == ":memory:" else os.path.join(data_dir, spec.storage)


def _router_owned(topology: Topology, route: str) -> bool:
    """Whether a route is one a router set of the file made for itself (actors.remote.routers
    names them so): the file does not list those, and a deploy must not drop them."""
    for rs in topology.router_sets:
        owned = {f"to-{svc}" for svc in rs.targets} | {f"direct-{svc}" for svc in rs.targets}
        owned |= {f"back-{svc}-{b}" for svc in rs.initiator_services for b in rs.initiators}
        if route in owned or route.startswith(f"{rs.name}-via-"):
            return True
    return False


def _definition_changes(spec: BrokerSpec, broker: Broker | None) -> list[tuple[str, Any]]:
    """(action, subject) pairs: ("create", defn), ("alter", (queue, changes)), ("drop", key)."""
    have = {(k, r["name"]): r for k, r in broker.definitions()} if broker else {}
    want = {(kind_of(d), d.name): d for d in spec.definitions}
    out: list[tuple[str, Any]] = []
    for key, defn in want.items():
        if key not in have:
            out.append(("create", defn))
        elif to_record(defn) != have[key]:
            if key[0] != "queue":
                raise TopologyError(
                    f"{spec.name}: {key[0]} {key[1]!r} differs from the running one; only queues "
                    "can be altered in place (drop it from the file, deploy, then add it back)"
                )
            changes = {k: v for k, v in to_record(defn).items() if have[key].get(k) != v}
            out.append(("alter", (key[1], changes)))
    for kind in _DROP_ORDER:
        for key in have:
            if key[0] == kind and key not in want:
                out.append(("drop", key))
    return out


def _route_changes(
    topology: Topology, spec: BrokerSpec, broker: Broker | None
) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for table in ("routes", "instance"):
        have = (
            {r["name"] for r in broker.routes(table) if r["name"] != "AutoCreatedLocal"}
            if broker
            else set()
        )
        want = {r.name: r for r in spec.routes if r.table == table}
        out += [("create", r) for name, r in want.items() if name not in have]
        out += [
            ("drop", RouteSpec(name, table=table))
            for name in sorted(have - set(want))
            if not _router_owned(topology, name)
        ]
    return out


def plan(topology: Topology, data_dir: str) -> list[str]:
    """What `deploy` would change, one line each; nothing is changed."""
    lines: list[str] = []
    running = {spec.name: _running(spec.name) for spec in topology.brokers}
    for spec in topology.brokers:  # in the order deploy goes: brokers, then routes
        broker = running[spec.name]
        if broker is None:
            lines.append(f"start broker {spec.name} ({_store(spec, data_dir)})")
        for action, subject in _definition_changes(spec, broker):
            lines.append(f"{spec.name}: {action} {_what(subject)}")
    for spec in topology.brokers:
        for action, subject in _route_changes(topology, spec, running[spec.name]):
            lines.append(f"{spec.name}: {action} route {_what(subject)}")
    for rs in topology.router_sets:
        running = _running_replicas(rs)
        if len(running) < rs.replicas:
            lines.append(f"router set {rs.name}: start {rs.replicas - len(running)} replica(s)")
        elif len(running) > rs.replicas:
            lines.append(f"router set {rs.name}: drain {len(running) - rs.replicas} replica(s)")
    return lines


def _what(subject: Any) -> str:
    """A change's subject in words: a definition, a queue's changes, a route, a dropped key."""
    if isinstance(subject, RouteSpec):
        return f"{subject.name} ({subject.table})"
    if isinstance(subject, tuple) and isinstance(subject[1], dict):  # (queue, changes)
        return f"queue {subject[0]} ({', '.join(sorted(subject[1]))})"
    if isinstance(subject, tuple):  # (kind, name) or (table, name)
        return f"{subject[0].replace('_', ' ')} {subject[1]}"
    return f"{kind_of(subject).replace('_', ' ')} {subject.name}"


def _running_replicas(rs: RouterSetSpec) -> list[str]:
    out = []
    for name in replica_names(rs.name, rs.replicas + 64):  # replicas a larger file started
        try:
            ray.get_actor(name, namespace="raybroker")
        except ValueError:
            if len(out) >= rs.replicas:
                break
            continue
        out.append(name)
    return out


def _placement(spec: BrokerSpec) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if spec.placement.resources:
        options["resources"] = dict(spec.placement.resources)
    if spec.placement.node_labels:
        from ray.util.scheduling_strategies import In, NodeLabelSchedulingStrategy

        hard = {k: In(v) for k, v in spec.placement.node_labels.items()}
        options["scheduling_strategy"] = NodeLabelSchedulingStrategy(hard=hard)
    return options


def deploy(
    topology: Topology,
    data_dir: str,
    *,
    progress: Callable[[str], None] = lambda s: None,
    **broker_options: Any,
) -> Deployment:
    """Make the cluster run `topology`: start or attach to every broker, apply the difference
    in definitions and routes, start router sets and bring their replicas to the file's count.
    With `dialog_security`, every service gets a certificate of its own and the two ends of every
    route (router sets included) trust each other; with `transport_security`, every broker
    (router replicas included) an identity, taking calls only from the file's other brokers."""
    missing = unsatisfiable(topology, ray.nodes())
    if missing:
        raise TopologyError(f"{topology.source}: " + "; ".join(missing))
    os.makedirs(data_dir, exist_ok=True)
    topology, master_key_file = _with_security(topology, data_dir)
    out = Deployment()
    for spec in topology.brokers:
        before = _running(spec.name)
        b = start_broker(
            spec.name,
            _store(spec, data_dir),
            limits=spec.limits or None,
            **_placement(spec),
            **broker_options,
        )
        if before is None:
            out.changes.append(f"started broker {spec.name}")
            progress(f"broker {spec.name} started")
        if spec.forwarding:
            b.configure(forwarding=True)
        for action, subject in _definition_changes(spec, b):  # its store may have some
            if action == "create":
                b.create(subject)
            elif action == "alter":
                queue, changes = subject
                b.alter(Queue, queue, **changes)
            else:
                b.drop(*subject)
            out.changes.append(f"{spec.name}: {action} {_what(subject)}")
        out.brokers[spec.name] = b
    ids = {name: b.info()["broker_id"] for name, b in out.brokers.items()}
    for spec in topology.brokers:
        b = out.brokers[spec.name]
        for action, subject in _route_changes(topology, spec, b):
            if action == "create":
                b.create_route(**subject.arguments(ids))
            else:
                b.drop_route(subject.name, table=subject.table)
            out.changes.append(f"{spec.name}: {action} route {_what(subject)}")
    if topology.dialog_security is not None:
        _trust_along_routes(topology, out, ids)
    if topology.transport_security:
        names = [spec.name for spec in topology.brokers]
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                trust_brokers(out.brokers[a], out.brokers[b])
    detached = bool(broker_options.get("detached"))
    for rs in topology.router_sets:
        out.router_sets[rs.name] = _router_set(rs, out, data_dir, progress, detached, topology,
                                               master_key_file)  # fmt: skip
    return out


def _with_security(topology: Topology, data_dir: str) -> tuple[Topology, str | None]:
    """The topology as deployed with `dialog_security` (each service with a certificate of its
    own) and/or `transport_security` (each broker with an identity, taking calls only from those
    it trusts): each broker with the master key (the file's, or one made in the data directory on
    the first deploy, readable by its owner only); and the master key's path (None: neither)."""
    dialogs, transport = topology.dialog_security, topology.transport_security
    if dialogs is None and not transport:
        return topology, None
    path = (dialogs or {}).get("master_key_file") or os.path.join(data_dir, "master.key")
    if not os.path.exists(path):
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(os.urandom(32).hex())
    brokers = []
    for spec in topology.brokers:
        owned = {d.owner for d in spec.definitions if isinstance(d, Certificate)}
        wanted = [*(spec.services() if dialogs is not None else ()),
                  *([BROKER] if transport else ())]  # fmt: skip
        certificates = [Certificate(f"{'identity' if o == BROKER else o}.cert", owner=o)
                        for o in wanted if o not in owned]  # fmt: skip
        limits = {**spec.limits, "master_key_file": path}
        if transport:
            limits["transport_security"] = True
        brokers.append(replace(spec, limits=limits,
                               definitions=[*spec.definitions, *certificates]))  # fmt: skip
    return replace(topology, brokers=brokers), path


def _trust_along_routes(topology: Topology, out: Deployment, ids: dict[str, str]) -> None:
    """Each route's two ends trust each other: the services of the broker that has the route
    may begin secured dialogs with the route's service on the broker(s) hosting it (bound per
    broker where several host it)."""
    hosts: dict[str, list[str]] = {}
    for spec in topology.brokers:
        for svc in spec.services():
            hosts.setdefault(svc, []).append(spec.name)
    for spec in topology.brokers:
        for route in spec.routes:
            service = route.service_name
            if route.table != "routes" or service is None or service not in hosts:
                continue
            several = len(hosts[service]) > 1
            for far in [route.broker_of] if route.broker_of else hosts[service]:
                if far == spec.name:
                    continue
                for own in spec.services():
                    secure_dialogs(out.brokers[spec.name], own, out.brokers[far], service,
                                   broker_instance=ids[far] if several else None)  # fmt: skip


def _router_set(
    rs: RouterSetSpec,
    out: Deployment,
    data_dir: str,
    progress: Callable[[str], None],
    detached: bool,
    topology: Topology,
    master_key_file: str | None,
) -> RouterSet:
    running = _running_replicas(rs)
    routers = RouterSet(
        rs.name,
        rs.config,
        store_dir=rs.storage_dir or data_dir,
        initiators=[out.brokers[n] for n in rs.initiators],
        initiator_services=list(rs.initiator_services),
        targets={svc: out.brokers[b] for svc, b in rs.targets.items()},
        contracts=None if rs.contracts is None else list(rs.contracts),
        readers=rs.readers,
        progress=progress,
        detached=detached,
        code_modules=rs.code_modules,
        master_key_file=master_key_file,
        dialog_security=topology.dialog_security is not None,
        transport_security=topology.transport_security,
    )
    routers.start(max(rs.replicas, len(running)))  # attaches to the running ones
    if len(running) < rs.replicas:
        out.changes.append(f"router set {rs.name}: {rs.replicas - len(running)} replica(s) added")
    for name in sorted(routers.replicas)[rs.replicas :]:
        routers.remove_replica(name)
        out.changes.append(f"router set {rs.name}: replica {name} drained and stopped")
    return routers


def teardown(topology: Topology, data_dir: str, delete_stores: bool = False) -> list[str]:
    """Stop the topology's router replicas and brokers (their stores kept unless asked)."""
    stopped = []
    for rs in topology.router_sets:
        for name in _running_replicas(rs):
            b = _running(name)
            if b is not None:
                b.stop(delete_store=delete_stores)
                stopped.append(name)
    for spec in topology.brokers:
        b = _running(spec.name)
        if b is not None:
            b.stop(delete_store=delete_stores)
            stopped.append(spec.name)
    del data_dir  # the stores are found through the brokers themselves
    return stopped
