"""What a running broker reports for monitoring, and the shape of the sink it reports to. Plain
Python: `actors.remote.metrics.RayMetrics` is the sink that exports through Ray (and from there
to Prometheus); a broker without a sink reports nothing."""

from __future__ import annotations

from typing import Any, Protocol

SAMPLE_EVERY_S = 1.0  # how often the broker's clock hands the sink a snapshot


class MetricsSink(Protocol):
    def observe_call(self, method: str, seconds: float) -> None:
        """One client call to the broker took `seconds`."""

    def sample(self, snapshot: dict[str, Any]) -> None:
        """The broker's state now: {"counts": {sent, received, committed, rolled_back,
        forwarded} since it started, "queues": {name: {depth, readers, ...}}, "transmission":
        messages waiting to leave, "routers": {service: {routed, forwarded, errors}}}."""
