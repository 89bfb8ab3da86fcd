"""The broker's metrics through Ray (`ray.util.metrics`): Ray's metrics agent on each node serves
them to Prometheus at the node's metrics export port (`ray.nodes()[i]["MetricsExportPort"]`),
named `ray_raybroker_*`, tagged by broker (and queue, router service or verb)."""

from __future__ import annotations

from typing import Any

from ray.util.metrics import Counter, Gauge, Histogram

_COUNTS = {
    "sent": "messages sent by this broker's dialogs",
    "received": "messages handed to readers",
    "committed": "messages received and committed",
    "rolled_back": "messages received and rolled back",
    "forwarded": "messages relayed to another broker",
    "passed_through": "messages sent on a relayed dialog at arrival, without a reader",
}
CALL_MS = [0.5, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 5000]
DEPTH, READERS = "raybroker_queue_depth", "raybroker_queue_readers"
TRANSMISSION, ROUTED = "raybroker_transmission_depth", "raybroker_router_dialogs"
CALLS = "raybroker_call_ms"


def scraped_names() -> set[str]:
    """Every series name Prometheus scrapes these metrics under from Ray's agents: Ray's `ray_`
    prefix, a counter's `_total`, a histogram's `_bucket`, `_count` and `_sum` (what
    docs/grafana/raybroker.json reads)."""
    counters = {f"ray_raybroker_messages_{k}_total" for k in _COUNTS}
    gauges = {f"ray_{name}" for name in (DEPTH, READERS, TRANSMISSION, ROUTED)}
    return counters | gauges | {f"ray_{CALLS}_{part}" for part in ("bucket", "count", "sum")}


class RayMetrics:
    """A `actors.service.metrics.MetricsSink` exporting through Ray."""

    def __init__(self, broker: str) -> None:
        self.tags = {"broker": broker}
        self.counters = {
            k: Counter(f"raybroker_messages_{k}", description=d, tag_keys=("broker",))
            for k, d in _COUNTS.items()
        }
        self.seen = dict.fromkeys(_COUNTS, 0)
        q = ("broker", "queue")
        self.depth = Gauge(DEPTH, "messages waiting in a queue", tag_keys=q)
        self.readers = Gauge(READERS, "readers serving a queue", tag_keys=q)
        self.transmission = Gauge(TRANSMISSION, "messages waiting to leave", tag_keys=("broker",))
        self.routed = Gauge(
            ROUTED,
            "dialogs a routing service has routed (since its replica started)",
            tag_keys=("broker", "service"),
        )
        self.calls = Histogram(
            CALLS,
            "milliseconds per client call to the broker (a coalesced batch: once per verb in it)",
            boundaries=CALL_MS,
            tag_keys=("broker", "method"),
        )

    def observe_call(self, method: str, seconds: float) -> None:
        self.calls.observe(seconds * 1000, tags={**self.tags, "method": method})

    def sample(self, snapshot: dict[str, Any]) -> None:
        for k, n in snapshot["counts"].items():
            if n > self.seen[k]:  # counters only go up: add what is new since the last sample
                self.counters[k].inc(n - self.seen[k], tags=self.tags)
                self.seen[k] = n
        for queue, row in snapshot["queues"].items():
            tags = {**self.tags, "queue": queue}
            self.depth.set(row["depth"], tags=tags)
            self.readers.set(row.get("readers", 0), tags=tags)
        self.transmission.set(snapshot["transmission"], tags=self.tags)
        for service, c in snapshot["routers"].items():
            self.routed.set(c["routed"], tags={**self.tags, "service": service})
