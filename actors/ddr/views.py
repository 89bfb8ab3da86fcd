"""A router replica's view: its live mappings (inbound, outbound, target service, since) and
its counts of dialogs routed, messages forwarded by its handler, messages passed through at
arrival (`Begin.relays`) and errors."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from actors.ddr.router import stats


def router(
    service: str, groups: Iterable[Mapping[str, Any]], passed_through: int = 0
) -> dict[str, Any]:
    """`groups`: the router queue's conversation groups (the `groups` view); `passed_through`:
    the broker's count of messages sent on at arrival, for all its relayed dialogs."""
    mappings = []
    for g in groups:
        for pair in json.loads(g["state"]).values() if g["state"] else ():
            if pair.get("out") and not pair["out_ended"]:
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
        **stats(service),
        "passed_through": passed_through,
    }
