"""A router set on Ray: `n` replicated router brokers hosting one routing service (seed 000's
"m initiators talk to n replicated routers that talk to l partitioned targets").

Each replica is a broker with its own store (its inbound<->outbound mappings are durable), whose
router queue is internally activated with `actors.ddr.router:route_messages`. Initiators reach
the replicas through one route per replica; a new dialog goes to the next replica round-robin
and stays there (pinned at BEGIN). Replicas can be added and removed while dialogs flow: a
removed replica's routes are first marked draining (no new dialogs), and it stops once its
dialogs have finished.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from actors.ddr import RouterConfig, router_contracts
from actors.ddr.router import ROUTER_QUEUE
from actors.errors import BrokerUnavailable, InvalidDefinition
from actors.model.catalog import (
    ROUTER_HANDLER,
    Activation,
    Contract,
    MessageType,
    Queue,
    Service,
    from_record,
)
from actors.model.credentials import BROKER, Certificate
from actors.remote.client import Broker
from actors.remote.factory import start_broker
from actors.remote.trust import ensure, secure_dialogs, trust_brokers

HANDLER = ROUTER_HANDLER
DRAIN_TIMEOUT_S = 300.0

Progress = Callable[[str], None]


class RouterSet:
    """Router replicas between `initiators` (brokers whose `initiator_services` begin dialogs
    with `config.service`) and `targets` ({target service: the broker hosting it}).

    `contracts`: the contracts the routing service accepts; by default the union of the targets'
    contracts (seed 000's first assumption). Given explicitly, they must cover that union.
    `code_modules`: where the classifier may be, beside the package's own (the replicas' limit
    code_modules, actors.model.code_names). `master_key_file`: the replicas' master key. With
    `dialog_security` the dialogs through the set are secured both ways (seed 003): each replica
    makes a certificate of its own for the routing service, and trusts and is trusted by every
    initiator's services and every target service (each of which needs a certificate of its
    own: actors.remote.trust). A DDR router in forward mode is an endpoint of the dialogs it
    joins: it opens what arrives and seals what it sends on. With `transport_security` each
    replica has an identity, takes calls only from brokers it trusts, and it and every initiator
    and target trust each other (each of which needs an identity of its own)."""

    def __init__(
        self,
        name: str,
        config: RouterConfig,
        *,
        store_dir: str,
        initiators: Sequence[Broker],
        initiator_services: Sequence[str],
        targets: Mapping[str, Broker],
        contracts: Sequence[str] | None = None,
        readers: int = 2,
        progress: Progress = lambda s: None,
        detached: bool = False,
        code_modules: Sequence[str] = (),
        master_key_file: str | None = None,
        dialog_security: bool = False,
        transport_security: bool = False,
    ) -> None:
        if dialog_security:  # onward dialogs held, not sent in the clear, without a binding
            config = replace(config, encryption=True)
        self.name, self.config, self.store_dir = name, config, store_dir
        self.master_key_file = master_key_file
        self.dialog_security, self.transport_security = dialog_security, transport_security
        self.code_modules = tuple(code_modules)
        self.initiators, self.initiator_services = list(initiators), list(initiator_services)
        self.targets = dict(targets)
        self.readers, self.progress = readers, progress
        self.detached = detached  # replicas outlive this driver (a deploy from the command line)
        missing = set(config.targets) - set(self.targets)
        if missing:
            raise InvalidDefinition(
                f"router set {name!r}: no broker given for target service(s) {sorted(missing)}"
            )
        config.check_classifier(self.code_modules)  # not allowed, or not there: refused now
        self.definitions = self._target_definitions()
        self.contracts = router_contracts(name, self.definitions["services"], contracts)
        self.replicas: dict[str, Broker] = {}
        self._next = 0

    # --- what the targets define -------------------------------------------------------------

    def _target_definitions(self) -> dict[str, list[Any]]:
        """The target services, their contracts and those contracts' message types, as the
        target brokers define them (the routing brokers must hold them too)."""
        services: list[Service] = []
        contracts: dict[str, Contract] = {}
        types: dict[str, MessageType] = {}
        for service, broker in self.targets.items():
            defs = {(k, r["name"]): from_record(k, r) for k, r in broker.definitions()}
            svc = defs.get(("service", service))
            if svc is None:
                raise InvalidDefinition(
                    f"router set {self.name!r}: broker {broker.name!r} has no service {service!r}"
                )
            services.append(svc)
            for c in svc.contracts:
                contract = defs.get(("contract", c))
                if contract is not None:
                    contracts[c] = contract
                    for mt in contract.messages:
                        if ("message_type", mt) in defs:
                            types[mt] = defs[("message_type", mt)]
        return {
            "services": services,
            "contracts": list(contracts.values()),
            "types": list(types.values()),
        }

    # --- replicas ------------------------------------------------------------------------------

    def start(self, replicas: int) -> RouterSet:
        for _ in range(replicas):
            self.add_replica()
        return self

    def add_replica(self) -> Broker:
        """Start one more replica; new dialogs spread over the new set from now on."""
        name = f"{self.name}-{self._next}"
        self._next += 1
        limits: dict[str, Any] = {}
        if self.code_modules:
            limits["code_modules"] = list(self.code_modules)
        if self.master_key_file:
            limits["master_key_file"] = self.master_key_file
        if self.transport_security:
            limits["transport_security"] = True
        b = start_broker(
            name,
            os.path.join(self.store_dir, f"{name}.sqlite"),
            detached=self.detached,
            limits=limits or None,
        )
        existing = {(k, r["name"]) for k, r in b.definitions()}
        for defn in [*self.definitions["types"], *self.definitions["contracts"]]:
            kind = "message_type" if isinstance(defn, MessageType) else "contract"
            if (kind, defn.name) not in existing:
                b.create(defn)
        if ("queue", ROUTER_QUEUE) not in existing:
            b.create(Queue(ROUTER_QUEUE, activation=self._activation()))
            b.create(Service(self.config.service, ROUTER_QUEUE, tuple(self.contracts)))
        have = {r["name"] for r in b.routes()}  # a restarted set finds its routes in place
        for service, target in self.targets.items():  # replica -> each target
            if f"to-{service}" not in have:
                b.create_route(f"to-{service}", service, address=f"ray://{target.name}")
        for ib in self.initiators:  # replica -> each initiator, by its broker id
            bid = ib.info()["broker_id"]
            for svc in self.initiator_services:
                if f"back-{svc}-{ib.name}" not in have:
                    b.create_route(f"back-{svc}-{ib.name}", svc, bid, f"ray://{ib.name}")
        self._direct_routes()
        bid = b.info()["broker_id"]
        if self.transport_security:  # before any call reaches it
            ensure(b, Certificate(f"{b.name}.identity", owner=BROKER, days=365))
            for peer in [*self.initiators, *self.targets.values()]:
                trust_brokers(b, peer)
        if self.dialog_security:
            self._secure(b, bid)
        for peer in [*self.initiators, *self.targets.values()]:  # initiators, targets -> it
            route = f"{self.name}-via-{name}"
            if route not in {r["name"] for r in peer.routes()}:
                peer.create_route(route, self.config.service, bid, f"ray://{name}")
        self.replicas[name] = b
        self.progress(f"router replica {name} serving {self.config.service}")
        return b

    def _secure(self, b: Broker, bid: str) -> None:
        """Secured dialogs through replica `b` (broker id `bid`), both ways."""
        svc = self.config.service
        ensure(b, Certificate(f"{b.name}.cert", owner=svc, days=365))
        for ib in self.initiators:  # initiators -> this replica (bound to it alone)
            for isvc in self.initiator_services:
                secure_dialogs(ib, isvc, b, svc, broker_instance=bid)
        for service, target in self.targets.items():  # this replica -> each target
            secure_dialogs(b, svc, target, service)

    def _direct_routes(self) -> None:
        """Initiators <-> targets directly, for dialogs begun after a redirect."""
        for ib in self.initiators:
            have = {r["name"] for r in ib.routes()}
            for service, target in self.targets.items():
                if f"direct-{service}" not in have:
                    ib.create_route(f"direct-{service}", service, address=f"ray://{target.name}")
            bid = ib.info()["broker_id"]
            for target in self.targets.values():
                have = {r["name"] for r in target.routes()}
                for svc in self.initiator_services:
                    if f"back-{svc}-{ib.name}" not in have:
                        target.create_route(f"back-{svc}-{ib.name}", svc, bid, f"ray://{ib.name}")

    def _activation(self) -> Activation:
        return Activation(
            HANDLER,
            max_readers=self.readers,
            placement="internal",
            max_groups=100,
            idle_timeout=30.0,
            options=self.config.options(),
        )

    def remove_replica(self, name: str, timeout: float = DRAIN_TIMEOUT_S) -> None:
        """Drain a replica, then stop it: no new dialog goes to it, its open dialogs finish
        (its mappings empty, nothing left to send), then its routes go and it stops."""
        b = self.replicas[name]
        route = f"{self.name}-via-{name}"
        for peer in self.initiators:
            peer.alter_route(route, draining=True)
        deadline = time.monotonic() + timeout
        while not self._drained(b):
            if time.monotonic() > deadline:
                raise BrokerUnavailable(
                    f"router replica {name!r} still has dialogs after {timeout}s; it keeps running"
                )
            time.sleep(0.2)
        for peer in [*self.initiators, *self.targets.values()]:
            peer.drop_route(route)
        b.stop()
        del self.replicas[name]
        self.progress(f"router replica {name} drained and stopped")

    def _drained(self, b: Broker) -> bool:
        view = b.router(ROUTER_QUEUE, self.config.service)
        q = b.queues()[ROUTER_QUEUE]
        return not view["mappings_total"] and q["depth"] == 0 and not b.transmission_queue()

    # --- configuration and views ---------------------------------------------------------------

    def reconfigure(self, **changes: Any) -> None:
        """Change the classifier, its options or the mode while the set runs (readers pick the
        new configuration up at once)."""
        config = replace(self.config, **changes)
        config.check_classifier(self.code_modules)
        for b in self.replicas.values():
            b.alter(Queue, ROUTER_QUEUE, activation={"options": config.options()})
        self.config = config

    def view(self) -> dict[str, dict[str, Any]]:
        """Per replica: live mappings and counts of dialogs routed, messages forwarded, errors."""
        return {n: b.router(ROUTER_QUEUE, self.config.service) for n, b in self.replicas.items()}

    def stop(self, delete_stores: bool = False) -> None:
        """Stop every replica now (open dialogs through them are cut off: drain with
        `remove_replica` to let them finish) and drop the routes to them."""
        for name, b in list(self.replicas.items()):
            route = f"{self.name}-via-{name}"
            for peer in [*self.initiators, *self.targets.values()]:
                if route in {r["name"] for r in peer.routes()}:
                    peer.drop_route(route)
            b.stop(delete_store=delete_stores)
            del self.replicas[name]
