"""The views of a running broker (`BrokerService` inherits them): what `view` and the metrics
sink read. The core's views, plus what only the runtime knows (running readers, routers)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from actors.errors import InvalidArgument

if TYPE_CHECKING:
    from collections import Counter

    from actors.activation import ReaderPools
    from actors.core import BrokerCore


class ViewVerbs:
    """View verbs; the service supplies `core`, `pools` and `waiting`."""

    core: BrokerCore
    pools: ReaderPools
    waiting: Counter[str]

    def metrics_snapshot(self) -> dict[str, Any]:
        """What the metrics sink is handed each second (see actors.service.metrics)."""
        from actors.ddr.router import stats  # routing services count in this process

        routers = {s: stats(s) for s in self.core.state.catalog.services}
        return {
            "counts": self.core.state.counts.as_dict(),
            "queues": self._queues_view(),
            "transmission": self.core.transmission_depth(),
            "routers": {s: c for s, c in routers.items() if any(c.values())},
        }

    def _queues_view(self) -> dict[str, dict[str, Any]]:
        out = self.core.queues_view()
        for name, row in out.items():
            row["readers"] = self.pools.readers(name)
            row["waiting_receives"] = self.waiting.get(name, 0)  # receives waiting for messages
        return out

    async def view(self, name: str, kwargs: dict[str, Any]) -> Any:
        views = {
            "definitions": self.core.definitions,
            "endpoints": self.core.endpoints_view,
            "rerunnable": self.core.rerunnable_view,
            "dialogs": self.core.dialogs_view,
            "queue": self.core.queue_view,
            "queues": self._queues_view,
            "groups": self.core.groups_view,
            "routes": self.core.routes_view,
            "transmission_queue": self.core.transmission_view,
            "events": self.core.events_view,
            "audit": self.core.audit,
            "router": self._router_view,
        }
        if name not in views:
            raise InvalidArgument(f"unknown view {name!r}; use one of {sorted(views)}")
        return views[name](**kwargs)

    def _router_view(self, queue: str, service: str, limit: int = 100) -> dict[str, Any]:
        from actors.ddr.views import router  # only router replicas use it

        total, pairs = self.core.router_mappings(queue, limit)
        return router(service, total, pairs, self.core.state.counts.passed_through)
