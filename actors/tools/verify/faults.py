"""The injectors of `raybroker verify`: each fault kind done to the running system through Ray, and
undone where the system does not undo it itself. A fault has three steps: `inject` (the fault
itself, quick, while the sender waits), `settle` (what follows it: the route recreated, the
killed actor answering again; sets `answered_at`) and `heal` (capacity given back, so the same
kind can strike again: a removed forwarder restarted, a removed node replaced)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray

from actors.errors import BrokerError, BrokerUnavailable
from actors.tools.verify.cluster import LocalCluster
from actors.tools.verify.schedule import Fault
from topologies.deploy import Deployment
from topologies.spec import Topology

POLL_S = 0.1
READER_S = 30.0  # the longest to wait for a pool reader to kill
HELD_S = 15.0  # the longest a dropped route stays away waiting to see a message held for it


@dataclass
class Active:
    """A fault under way: when it was injected, what it found, when the thing it struck answered
    again (None until then) and how the injection went."""

    fault: Fault
    t0: float
    before: Any = None
    answered_at: float | None = None
    detail: str = ""


def _poll(check: Callable[[], Any], deadline: float) -> Any:
    """`check()` until it is truthy (returned) or `deadline` passes (None); a broker error
    while the thing restarts counts as not yet."""
    while True:
        try:
            value = check()
        except BrokerError:
            value = None
        if value or time.monotonic() > deadline:
            return value
        time.sleep(POLL_S)


def _unrouted(row: dict[str, Any]) -> bool:
    """Whether a transmission row waits for a route (the wildcard's LOCAL has no such service,
    or nothing matches at all)."""
    status = row["transmission_status"]
    return "waiting to be routed" in status or "no live route" in status


class Injector:
    def __init__(
        self, cluster: LocalCluster, deployment: Deployment, topology: Topology, data_dir: str
    ) -> None:
        self.cluster, self.topology, self.data_dir = cluster, topology, data_dir
        self.brokers = dict(deployment.brokers)
        self.router_sets = list(deployment.router_sets.values())

    def broker(self, name: str) -> Any:
        if name in self.brokers:
            return self.brokers[name]
        for rs in self.router_sets:
            if name in rs.replicas:
                return rs.replicas[name]
        raise KeyError(name)

    def all_brokers(self) -> dict[str, Any]:
        out = dict(self.brokers)
        for rs in self.router_sets:
            out.update(rs.replicas)
        return out

    # --- the three steps ---------------------------------------------------------------------

    def inject(self, fault: Fault, deadline: float) -> Active:
        name, _, part = fault.target.partition("/")
        b = self.broker(name)
        active = Active(fault, time.monotonic())
        if fault.kind in ("broker_killed", "router_killed"):
            active.before = b.info()["pid"]
            active.t0 = time.monotonic()
            ray.kill(b.actor, no_restart=False)  # its process dies; Ray starts it again
        elif fault.kind == "reader_killed":
            until = min(deadline, time.monotonic() + READER_S)
            readers = _poll(lambda: ray.get(b.actor.reader_actors.remote(part)), until)
            if not readers:
                raise RuntimeError(f"no reader actor of {fault.target} ran within {READER_S:g}s")
            active.t0 = time.monotonic()
            ray.kill(readers[0])
            active.detail = f"1 of {len(readers)} reader actor(s)"
        elif fault.kind == "forwarder_removed":
            active.t0 = time.monotonic()
            b.stop()
        elif fault.kind == "route_recreated":
            [active.before] = [r for r in b.routes() if r["name"] == part]
            active.t0 = time.monotonic()
            b.drop_route(part)
        elif fault.kind == "node_removed":
            node = b.info()["node"]
            active.before = node
            active.t0 = time.monotonic()
            if node not in self.cluster.store_nodes:
                raise RuntimeError(f"{name} is not on a removable node (it is on {node})")
            self.cluster.remove_node(node)
        return active

    def settle(self, active: Active, deadline: float) -> None:
        fault = active.fault
        name, _, part = fault.target.partition("/")
        b = self.broker(name)
        if fault.kind in ("broker_killed", "router_killed"):
            back = _poll(lambda: b.info()["pid"] != active.before, deadline)
            active.answered_at = time.monotonic() if back else None
        elif fault.kind == "reader_killed":
            running = _poll(lambda: b.queues()[part]["readers"] > 0, deadline)
            active.answered_at = time.monotonic() if running else None
        elif fault.kind == "forwarder_removed":
            active.answered_at = active.t0  # nothing comes back: the other forwarder carries on
        elif fault.kind == "route_recreated":
            self._recreate(b, active, min(deadline, time.monotonic() + HELD_S), deadline)
            active.answered_at = time.monotonic()
        elif fault.kind == "node_removed":
            moved = _poll(lambda: b.info()["node"] != active.before, deadline)
            active.answered_at = time.monotonic() if moved else None
            if moved:
                active.detail = "moved to another node"

    def heal(self, active: Active, again: bool) -> None:
        """Give back what the fault took, where the system does not: a removed forwarder is
        started again (its store keeps its routes); a removed node is replaced when another node
        fault is to come (`again`)."""
        if active.fault.kind == "forwarder_removed":
            spec = self.topology.broker(active.fault.target)
            from actors.remote.factory import start_broker

            path = os.path.join(self.data_dir, spec.storage)
            resources = dict(spec.placement.resources)
            b = start_broker(spec.name, path, limits=spec.limits or None, resources=resources)
            b.configure(forwarding=True)
            self.brokers[spec.name] = b
        elif active.fault.kind == "node_removed" and again:
            self.cluster.add_store_nodes(1)

    def _recreate(self, b: Any, active: Active, held_until: float, until: float) -> None:
        """Wait until a message is held for want of the dropped route (or `until`), then create
        the route again as it was."""
        route = active.before
        service = route["service_name"]

        def held() -> bool:
            rows = b.transmission_queue(limit=100_000)
            return any(r["to_service"] == service and _unrouted(r) for r in rows)

        if not _poll(held, held_until):
            active.detail = "no message was seen held while the route was gone"
        else:
            active.detail = "messages held while the route was gone"
        fields = ("service_name", "broker_instance", "address", "mirror_address", "draining")
        while True:  # the broker answers within its retry time, or the deadline says stop
            try:
                b.create_route(route["name"], **{f: route[f] for f in fields})
                return
            except BrokerUnavailable:
                if time.monotonic() > until:
                    raise
