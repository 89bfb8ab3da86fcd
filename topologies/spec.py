"""What a topology file declares, as `topologies.loader` hands it to a deploy: brokers (with
their catalogs, placement, forwarding, limits and routes) and router sets. Plain data, no Ray;
`unsatisfiable` checks placements against a cluster's nodes once a deploy has them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from actors.ddr.router import RouterConfig
from actors.model.catalog import Definition, Service


@dataclass(frozen=True)
class Placement:
    """Where a broker's actor may run: a node with at least `resources` (Ray custom resources)
    and exactly `node_labels`. Empty: anywhere."""

    resources: Mapping[str, float] = field(default_factory=dict)
    node_labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.resources and not self.node_labels

    def satisfied_by(self, node: Mapping[str, Any]) -> bool:
        """Whether a node ({"resources": ..., "labels": ...}, or a ray.nodes() entry) fits."""
        have = node.get("resources", node.get("Resources")) or {}
        labels = node.get("labels", node.get("Labels")) or {}
        return all(have.get(k, 0) >= v for k, v in self.resources.items()) and all(
            labels.get(k) == v for k, v in self.node_labels.items()
        )


@dataclass(frozen=True)
class RouteSpec:
    """A route to create on a broker: create_route's fields plus `table` ("routes" or
    "instance"). `broker_of` is the file's broker that `broker_instance` names (None when it
    is a broker id or absent): its id is known only once it runs, so `arguments` puts it in."""

    name: str
    service_name: str | None = None
    broker_instance: str | None = None
    address: str = "LOCAL"
    mirror_address: str | None = None
    lifetime: float | None = None
    draining: bool = False
    table: str = "routes"
    broker_of: str | None = None

    def arguments(self, broker_ids: Mapping[str, str]) -> dict[str, Any]:
        """Keyword arguments for `Broker.create_route`, given {broker name: broker id}."""
        bi = broker_ids[self.broker_of] if self.broker_of else self.broker_instance
        return {
            "name": self.name,
            "service_name": self.service_name,
            "broker_instance": bi,
            "address": self.address,
            "mirror_address": self.mirror_address,
            "lifetime": self.lifetime,
            "draining": self.draining,
            "table": self.table,
        }


@dataclass
class BrokerSpec:
    name: str
    storage: str = ":memory:"
    definitions: list[Definition] = field(default_factory=list)
    placement: Placement = field(default_factory=Placement)
    forwarding: bool = False
    limits: dict[str, Any] = field(default_factory=dict)  # checked with Limits.of
    routes: list[RouteSpec] = field(default_factory=list)

    def services(self) -> dict[str, Service]:
        return {d.name: d for d in self.definitions if isinstance(d, Service)}


@dataclass(frozen=True)
class RouterSetSpec:
    """The arguments of `actors.remote.routers.RouterSet` (brokers by name) and its replicas."""

    name: str
    service: str
    targets: Mapping[str, str]  # target service -> the file's broker hosting it
    classifier: str  # "module:function", imported by the deploy, not here
    initiators: tuple[str, ...]  # broker names
    initiator_services: tuple[str, ...]
    classifier_options: Mapping[str, Any] = field(default_factory=dict)
    mode: str = "forward"
    replicas: int = 1
    contracts: tuple[str, ...] | None = None  # None: the union of the targets' contracts
    readers: int = 2
    storage_dir: str | None = None  # None: the deploy's data directory
    code_modules: tuple[str, ...] = ()  # where the classifier may be (RouterSet's code_modules)

    @property
    def config(self) -> RouterConfig:
        return RouterConfig(
            self.service, tuple(self.targets), self.classifier, self.mode, self.classifier_options
        )


@dataclass
class Topology:
    brokers: list[BrokerSpec]
    router_sets: list[RouterSetSpec] = field(default_factory=list)
    source: str = "topology"
    # dialog security for the whole file (None: off): {"master_key_file": path or None}; see
    # topologies.deploy.secure_topology
    dialog_security: dict[str, Any] | None = None
    # transport security for the whole file: every broker an identity, trusting the file's others
    transport_security: bool = False

    def broker(self, name: str) -> BrokerSpec:
        return next(b for b in self.brokers if b.name == name)


def unsatisfiable(topology: Topology, nodes: list[dict[str, Any]]) -> list[str]:
    """One message per broker whose placement no node satisfies. `nodes`: dicts with
    "resources" and "labels" (or ray.nodes() entries; dead ones are skipped)."""
    alive = [n for n in nodes if n.get("Alive", n.get("alive", True))]
    out = []
    for b in topology.brokers:
        if b.placement.empty or any(b.placement.satisfied_by(n) for n in alive):
            continue
        wants = [f"resources {dict(b.placement.resources)}"] if b.placement.resources else []
        wants += [f"labels {dict(b.placement.node_labels)}"] if b.placement.node_labels else []
        out.append(
            f"{topology.source}: broker {b.name!r} needs a node with {' and '.join(wants)}, and "
            f"none of the cluster's {len(alive)} live node(s) has them; start a node with them "
            "(ray start --resources / --labels) or change the broker's placement"
        )
    return out


def replica_names(router_set: str, replicas: int) -> list[str]:
    """The broker names RouterSet gives its replicas."""
    return [f"{router_set}-{i}" for i in range(replicas)]
