"""A router replica's view: its live mappings (how many, and the first of them: inbound,
outbound, target service, since) and its counts of dialogs routed, messages forwarded by its
handler, messages passed through at arrival (`Begin.relays`) and errors."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from actors.ddr.router import stats


def router(
    service: str, total: int, pairs: Iterable[str], passed_through: int = 0
) -> dict[str, Any]:
    """`total`: the router queue's live mappings; `pairs`: the first of them, each as the JSON
    the handler keeps (`Store.router_mappings`); `passed_through`: the broker's count of
    messages sent on at arrival, for all its relayed dialogs."""
    mappings = []
    for text in pairs:
        pair = json.loads(text)
        mappings.append(
            {
                "inbound": pair["in"],
                "outbound": pair["out"],
                "target_service": pair["target"],
                "since": pair["since"],
            }
        )
    return {
        "service": service,
        "mappings": mappings,
        "mappings_total": total,
        **stats(service),
        "passed_through": passed_through,
    }
