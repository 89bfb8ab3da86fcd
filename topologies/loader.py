"""Topology files: brokers, their catalogs, routes and router sets in YAML, checked before
anything starts, then deployed onto the Ray cluster the driver is connected to.

Top level: `brokers:` (required), `router_sets:`, `dialog_security:` (true or {master_key_file:
PATH}) and `transport_security:` (true): what they set up is topologies.deploy's. A broker has
`name`, `storage` (a file name under the deploy's data directory, or ":memory:"), lists of
`message_types`, `contracts`, `queues` (with optional `activation`), `services`, `certificates`,
`remote_service_bindings` and `grants`, written as the definitions' fields, and optionally
`placement` ({resources: {name: amount}, node_labels: {key: value}}), `forwarding` (bool),
`limits` ({Limits field: value}) and `routes` (create_route's fields plus `table`). A route's
`broker_instance` is a broker id or, since ids exist only once brokers run, the name of a broker
in the file (the deploy puts in its id). A router set (seed 000) is what
`actors.remote.routers.RouterSet` takes. Checking imports no Ray and no code a file names: a
handler or a classifier must be in a module the broker allows (the package's own, or one its
`limits.code_modules` lists; a router set's own `code_modules` for its classifier), and is
imported by the broker that runs it. Every error is a TopologyError naming file and entry.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import fields, replace
from typing import Any, NoReturn

import yaml

from actors.ddr.router import MODES, RouterConfig, router_contracts
from actors.errors import BrokerError, TopologyError, shown
from actors.model import checks
from actors.model.catalog import Catalog, Contract, MessageType, Service, check_name, from_record
from actors.model.code_names import check_code_modules, check_code_name
from actors.model.limits import Limits
from actors.model.routing import AUTO_LOCAL, Route, check_broker_id, parse_address

from .spec import (
    BrokerSpec,
    Placement,
    RouterSetSpec,
    RouteSpec,
    Topology,
    replica_names,
    unsatisfiable,
)

__all__ = [
    "BrokerSpec",
    "Placement",
    "RouteSpec",
    "RouterSetSpec",
    "Topology",
    "load",
    "parse",
    "unsatisfiable",
]

SECTIONS = (
    ("message_types", "message_type"),
    ("contracts", "contract"),
    ("queues", "queue"),
    ("services", "service"),
    # dialog security (actors.model.credentials): a broker's own certificates (an owner, made by
    # the broker under its limits' master_key_file), far ones (a PEM), bindings and grants
    ("certificates", "certificate"),
    ("remote_service_bindings", "remote_service_binding"),
    ("grants", "grant"),
)
TOP_KEYS = {"brokers", "router_sets", "dialog_security", "transport_security"}
SECURITY_KEYS = {"master_key_file"}
EXTRA_KEYS = {"placement", "forwarding", "limits", "routes"}
BROKER_KEYS = {"name", "storage", *(s for s, _ in SECTIONS), *EXTRA_KEYS}
PLACEMENT_KEYS = {f.name for f in fields(Placement)}
ROUTE_KEYS = {f.name for f in fields(RouteSpec)} - {"broker_of"}  # broker_of: found, not given
ROUTER_SET_KEYS = {f.name for f in fields(RouterSetSpec)}
TABLES = ("routes", "instance")
RAY_OWN = ("CPU", "GPU")  # Ray takes these as num_cpus/num_gpus, never in `resources`


def load(path: str) -> Topology:
    """Read and check a topology file; TopologyError says where and what is wrong."""
    try:
        with open(path) as f:
            doc = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as exc:
        raise TopologyError(f"{path}: cannot read the topology: {exc}") from None
    return parse(doc, path)


def parse(doc: Any, where: str = "topology") -> Topology:
    if not isinstance(doc, dict) or not isinstance(doc.get("brokers"), list) or not doc["brokers"]:
        raise TopologyError(f"{where}: needs a non-empty list `brokers:`")
    _known_keys(doc, TOP_KEYS, where)
    specs: list[BrokerSpec] = []
    for i, b in enumerate(doc["brokers"]):
        specs.append(_broker(b, f"{where}: brokers[{i}]", {s.name for s in specs}))
    sets: list[RouterSetSpec] = []
    for i, rec in enumerate(_list(doc.get("router_sets"), f"{where}: router_sets")):
        sets.append(_router_set(rec, f"{where}: router_sets[{i}]", specs, sets))
    for i, spec in enumerate(specs):
        spec.routes = _linked_routes(spec, f"{where}: brokers[{i}]", specs, sets)
    with _at(f"{where}: transport_security"):
        transport = checks.flag("transport_security", doc.get("transport_security", False))
    return Topology(specs, sets, where, _dialog_security(doc, where), transport)


def _dialog_security(doc: Mapping[str, Any], where: str) -> dict[str, Any] | None:
    if "dialog_security" not in doc or doc["dialog_security"] is False:
        return None
    at = f"{where}: dialog_security"
    value = doc["dialog_security"]
    rec = {} if value is True else _mapping(value, at, "master_key_file: PATH")
    _known_keys(rec, SECURITY_KEYS, at)
    path = rec.get("master_key_file")
    if path is not None and (not isinstance(path, str) or not path):
        _fail(f"{at}.master_key_file", f"is a file's path, not {shown(path)}")
    return {"master_key_file": path}


# --- helpers -------------------------------------------------------------------------------------


def _fail(at: str, problem: str) -> NoReturn:
    raise TopologyError(f"{at}: {problem}")


@contextmanager
def _at(at: str) -> Iterator[None]:
    """A BrokerError raised inside becomes a TopologyError naming the place."""
    try:
        yield
    except TopologyError:
        raise
    except BrokerError as exc:
        raise TopologyError(f"{at}: {exc}") from None


def _known_keys(rec: Mapping[str, Any], keys: set[str], at: str) -> None:
    unknown = set(rec) - keys
    if unknown:
        _fail(at, f"unknown key(s) {sorted(map(str, unknown))}; use {sorted(keys)}")


def _list(value: Any, at: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        _fail(at, f"must be a list, not {shown(value)}")
    return value


def _mapping(value: Any, at: str, what: str) -> dict[Any, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        _fail(at, f"must be a mapping of {what}, not {shown(value)}")
    return value


def _name(kind: str, value: Any, at: str) -> str:
    if isinstance(value, bool):  # YAML 1.1 reads unquoted on/off/yes/no as booleans
        _fail(at, f"{kind} name {value} is a boolean; quote the name (YAML reads on/yes as true)")
    with _at(at):
        return check_name(kind, value)


def _whole(value: Any, at: str, what: str) -> int:
    with _at(at):
        return checks.whole(what, value, least=1)


# --- brokers -------------------------------------------------------------------------------------


def _broker(b: Any, at: str, taken: set[str]) -> BrokerSpec:
    if not isinstance(b, dict):
        _fail(at, "a broker is a mapping with name, storage, queues, ...")
    _known_keys(b, BROKER_KEYS, at)
    name = _name("broker", b.get("name"), f"{at}.name")
    if name in taken:
        _fail(f"{at}.name", f"broker {name!r} is declared twice")
    spec = BrokerSpec(name, str(b.get("storage", ":memory:")))
    spec.limits = _limits(b.get("limits"), f"{at}.limits")
    # checks the definitions in order, as the broker will, importing none of their code
    catalog = Catalog(Limits.of(spec.limits).code_modules, import_code=False)
    for section, kind in SECTIONS:
        for j, rec in enumerate(_list(b.get(section), f"{at}.{section}")):
            if not isinstance(rec, dict):
                _fail(f"{at}.{section}[{j}]", "each entry is a mapping of the definition's fields")
            with _at(f"{at}.{section}[{j}]"):
                defn = from_record(kind, rec)
                catalog.check_new(defn)
                catalog.add(defn)
            spec.definitions.append(defn)
    spec.placement = _placement(b.get("placement"), f"{at}.placement")
    with _at(f"{at}.forwarding"):
        spec.forwarding = checks.flag("forwarding", b.get("forwarding", False))
    seen: dict[tuple[str, str], int] = {}
    for j, rec in enumerate(_list(b.get("routes"), f"{at}.routes")):
        route = _route(rec, f"{at}.routes[{j}]", spec)
        if (route.table, route.name) in seen:
            _fail(
                f"{at}.routes[{j}].name",
                f"route {route.name!r} is already in table {route.table!r} "
                f"(routes[{seen[route.table, route.name]}]); give each route its own name",
            )
        seen[route.table, route.name] = j
        spec.routes.append(route)
    return spec


def _placement(value: Any, at: str) -> Placement:
    rec = _mapping(value, at, "resources and/or node_labels")
    _known_keys(rec, PLACEMENT_KEYS, at)
    resources: dict[str, float] = {}
    for k, v in _mapping(rec.get("resources"), f"{at}.resources", "name: amount").items():
        here = f"{at}.resources.{k}"
        if not isinstance(k, str) or not k:
            _fail(f"{at}.resources", f"a resource name is a non-empty string, not {shown(k)}")
        if k in RAY_OWN:
            _fail(here, "a broker needs no CPU or GPU; place it with a custom resource or a label")
        number = isinstance(v, (int, float)) and not isinstance(v, bool)
        if not number or not math.isfinite(v) or v <= 0:
            _fail(here, f"an amount is a finite number > 0, not {shown(v)}")
        if v > 1 and v != int(v):  # Ray's rule for resource quantities
            _fail(here, f"an amount above 1 must be a whole number, not {v}")
        resources[k] = v
    labels: dict[str, str] = {}
    for k, v in _mapping(rec.get("node_labels"), f"{at}.node_labels", "key: value").items():
        if not isinstance(k, str) or not k:
            _fail(f"{at}.node_labels", f"a label key is a non-empty string, not {shown(k)}")
        if not isinstance(v, str):
            _fail(f"{at}.node_labels.{k}", f"a label value is a string (quote it), not {shown(v)}")
        labels[k] = v
    return Placement(resources, labels)


def _limits(value: Any, at: str) -> dict[str, Any]:
    limits = _mapping(value, at, "Limits fields to values")
    for key, v in limits.items():
        with _at(f"{at}.{key}"):
            if key in ("retry_min_s", "retry_max_s"):  # the pair is checked together below
                checks.seconds(f"limit {key}", v)
            else:
                Limits.of({key: v})
    with _at(at):
        Limits.of(limits)
    return dict(limits)


def _route(rec: Any, at: str, broker: BrokerSpec) -> RouteSpec:
    """A route's own fields; what it refers to is checked once every broker is read."""
    if not isinstance(rec, dict):
        _fail(at, f"a route is a mapping of {sorted(ROUTE_KEYS)}")
    _known_keys(rec, ROUTE_KEYS, at)
    name = _name("route", rec.get("name"), f"{at}.name")
    if name == AUTO_LOCAL:
        _fail(f"{at}.name", f"{AUTO_LOCAL} is built into every route table; use another name")
    service = rec.get("service_name")
    if service is not None:
        _name("service", service, f"{at}.service_name")
    bi = rec.get("broker_instance")
    if bi is not None:
        _name("broker_instance", bi, f"{at}.broker_instance")  # an id or a broker's name
    with _at(f"{at}.address"):
        address = parse_address(rec.get("address", "LOCAL"))
    mirror = rec.get("mirror_address")
    if mirror is not None:
        with _at(f"{at}.mirror_address"):
            mirror = str(parse_address(mirror))
    with _at(f"{at}.lifetime"):
        lifetime = checks.seconds("lifetime", rec.get("lifetime"), none=True)
    with _at(f"{at}.draining"):
        draining = checks.flag("draining", rec.get("draining", False))
    table = rec.get("table", "routes")
    if table not in TABLES:
        _fail(f"{at}.table", f"table is 'routes' or 'instance', not {shown(table)}")
    if table == "instance" and address.kind == "ray" and not broker.forwarding:
        _fail(
            at,
            f"an instance route to {address} relays arriving messages, which broker "
            f"{broker.name!r} does only with `forwarding: true`; set that, or use table 'routes'",
        )
    with _at(at):  # what the broker checks of the fields together (a stand-in id for a name)
        Route(name, service, None if bi is None else str(uuid.UUID(int=0)), str(address), mirror)
    return RouteSpec(name, service, bi, str(address), mirror, lifetime, draining, table)


def _linked_routes(
    spec: BrokerSpec, at: str, brokers: list[BrokerSpec], sets: list[RouterSetSpec]
) -> list[RouteSpec]:
    """The broker's routes with what they name checked against the whole file."""
    by_name = {b.name: b for b in brokers}
    services = {s for b in brokers for s in b.services()} | {r.service for r in sets}
    out = []
    for j, r in enumerate(spec.routes):
        here = f"{at}.routes[{j}]"
        for key in ("address", "mirror_address"):
            addr = getattr(r, key)
            if addr and addr.startswith("ray://") and addr[6:] not in by_name:
                _fail(
                    f"{here}.{key}",
                    f"route {r.name} sends to {addr}, which no broker in this file declares",
                )
        if r.service_name is not None and r.service_name not in services:
            _fail(
                f"{here}.service_name",
                f"route {r.name}: unknown service {r.service_name!r}; no broker in this file "
                "defines it and no router set routes it",
            )
        if r.broker_instance in by_name:
            target = by_name[r.broker_instance]
            if r.service_name not in target.services():
                _fail(
                    f"{here}.broker_instance",
                    f"route {r.name} sends service {r.service_name!r} to broker "
                    f"{target.name!r}, which does not define it",
                )
            r = replace(r, broker_of=target.name)
        elif r.broker_instance is not None:
            try:
                r = replace(r, broker_instance=check_broker_id(r.broker_instance))
            except BrokerError:
                _fail(
                    f"{here}.broker_instance",
                    f"{r.broker_instance!r} is neither a broker in this file nor a broker id (a "
                    "UUID); name the broker that hosts the service",
                )
        out.append(r)
    return out


# --- router sets ---------------------------------------------------------------------------------


def _router_set(
    rec: Any, at: str, brokers: list[BrokerSpec], sets: list[RouterSetSpec]
) -> RouterSetSpec:
    if not isinstance(rec, dict):
        _fail(at, f"a router set is a mapping of {sorted(ROUTER_SET_KEYS)}")
    _known_keys(rec, ROUTER_SET_KEYS, at)
    by_name = {b.name: b for b in brokers}
    name = _name("router set", rec.get("name"), f"{at}.name")
    if any(s.name == name for s in sets):
        _fail(f"{at}.name", f"router set {name!r} is declared twice")
    service = _name("service", rec.get("service"), f"{at}.service")
    for b in brokers:
        if service in b.services():
            _fail(f"{at}.service", f"broker {b.name!r} defines service {service!r} itself")
    for s in sets:
        if s.service == service:
            _fail(f"{at}.service", f"router set {s.name!r} routes service {service!r} already")

    targets = _mapping(rec.get("targets"), f"{at}.targets", "target service: broker name")
    if not targets:
        _fail(f"{at}.targets", "a router set needs at least one target service")
    target_services: list[Service] = []
    for svc, bname in targets.items():
        here = f"{at}.targets.{svc}"
        _name("target service", svc, here)
        if bname not in by_name:
            _fail(here, f"broker {bname!r} is not declared in this file")
        found = by_name[bname].services().get(svc)
        if found is None:
            _fail(here, f"broker {bname!r} does not define service {svc!r}")
        target_services.append(found)

    classifier = rec.get("classifier")
    if not _is_path(classifier):
        _fail(f"{at}.classifier", f"give 'module:function', not {shown(classifier)}")
    options = _mapping(rec.get("classifier_options"), f"{at}.classifier_options", "options")
    try:
        json.dumps(options, allow_nan=False)
    except (TypeError, ValueError) as exc:
        _fail(f"{at}.classifier_options", f"must be JSON-able (they are stored): {exc}")
    mode = rec.get("mode", "forward")
    if mode not in MODES:
        _fail(f"{at}.mode", f"mode is one of {list(MODES)}, not {shown(mode)}")
    replicas = _whole(rec.get("replicas", 1), f"{at}.replicas", "replicas")
    readers = _whole(rec.get("readers", 2), f"{at}.readers", "readers")
    taken = set(by_name) | {r for s in sets for r in replica_names(s.name, s.replicas)}
    for replica in replica_names(name, replicas):
        _name("broker", replica, f"{at}.name")
        if replica in taken:
            _fail(f"{at}.name", f"replica {replica!r} would take a broker name already in use")
    storage_dir = rec.get("storage_dir")
    if storage_dir is not None and (not isinstance(storage_dir, str) or not storage_dir):
        _fail(f"{at}.storage_dir", f"a directory path, not {shown(storage_dir)}")

    initiators = _names(rec.get("initiators"), f"{at}.initiators", "broker")
    for k, bname in enumerate(initiators):
        if bname not in by_name:
            _fail(f"{at}.initiators[{k}]", f"broker {bname!r} is not declared in this file")
    init_services = _names(rec.get("initiator_services"), f"{at}.initiator_services", "service")
    for k, svc in enumerate(init_services):
        for bname in initiators:
            if svc not in by_name[bname].services():
                _fail(
                    f"{at}.initiator_services[{k}]",
                    f"initiator broker {bname!r} does not define service {svc!r}",
                )

    given = rec.get("contracts")
    if given is not None:
        given = _names(given, f"{at}.contracts", "contract")
    with _at(f"{at}.contracts"):
        accepted = router_contracts(name, target_services, given)
    _check_contracts(at, name, accepted, targets, initiators, by_name)
    with _at(f"{at}.code_modules"):
        code_modules = check_code_modules(rec.get("code_modules", []))
    with _at(f"{at}.classifier"):
        check_code_name(classifier, code_modules)  # allowed; imported by the replicas only
    with _at(at):
        RouterConfig(service, tuple(targets), classifier, mode, options)
    return RouterSetSpec(
        name=name,
        service=service,
        targets=dict(targets),
        classifier=classifier,
        initiators=tuple(initiators),
        initiator_services=tuple(init_services),
        classifier_options=dict(options),
        mode=mode,
        replicas=replicas,
        contracts=None if given is None else tuple(given),
        readers=readers,
        storage_dir=storage_dir,
        code_modules=code_modules,
    )


def _check_contracts(
    at: str,
    name: str,
    accepted: list[str],
    targets: Mapping[str, str],
    initiators: list[str],
    by_name: Mapping[str, BrokerSpec],
) -> None:
    """The replicas copy each target service's contracts (and their message types) from its
    broker; initiators begin dialogs on every accepted contract, so each must define them all.
    A contract or message type must be defined the same wherever it is."""
    union = {c for svc, b in targets.items() for c in by_name[b].services()[svc].contracts}
    for c in accepted:
        if c not in union:
            _fail(
                f"{at}.contracts",
                f"router set {name!r}: contract {c!r} is no target service's, so the replicas "
                "would not have it; leave it out",
            )
    places = [
        (f"{at}.targets.{s}", b, by_name[b].services()[s].contracts) for s, b in targets.items()
    ]
    places += [(f"{at}.initiators[{k}]", b, accepted) for k, b in enumerate(initiators)]
    defs: dict[tuple[type, str], tuple[str, Any]] = {}  # (kind, name) -> (broker, definition)
    for here, bname, needed in places:
        held = {(type(d), d.name): d for d in by_name[bname].definitions}
        for c in needed:
            if ("contract", c) in Catalog.BUILTIN:
                continue
            contract = held.get((Contract, c))
            if contract is None:
                _fail(
                    here,
                    f"broker {bname!r} does not define contract {c!r}, on which it begins "
                    f"dialogs with {name!r}; define it there with its message types",
                )
            for key in [(Contract, c)] + [(MessageType, mt) for mt in contract.messages]:
                defn = held.get(key)
                if defn is None:  # a built-in message type
                    continue
                first = defs.setdefault(key, (bname, defn))
                if first[1] != defn:
                    _fail(
                        here,
                        f"{key[0].__name__} {key[1]!r} on broker {bname!r} differs from its "
                        f"definition on broker {first[0]!r}; define it the same on both",
                    )


def _names(value: Any, at: str, kind: str) -> list[str]:
    items = _list(value, at)
    if not items:
        _fail(at, f"give at least one {kind} name")
    for k, v in enumerate(items):
        _name(kind, v, f"{at}[{k}]")
        if v in items[:k]:
            _fail(f"{at}[{k}]", f"{kind} {v!r} is listed twice")
    return list(items)


def _is_path(value: Any) -> bool:
    """The shape of a "module:function" path (the deploy imports it)."""
    if not isinstance(value, str) or value.count(":") != 1:
        return False
    module, attr = value.split(":")
    return all(p.isidentifier() for p in [*module.split("."), *attr.split(".")])
