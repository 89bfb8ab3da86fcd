"""The fault schedule of `raybroker verify`: which faults, when in the workload, on what. Pure and
seeded (`random.Random(seed)`), so a failing schedule is replayed by running again with its seed."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from actors.errors import InvalidArgument

KINDS = (
    "broker_killed",
    "reader_killed",
    "router_killed",
    "forwarder_removed",
    "route_recreated",
    "node_removed",
)
# The share of the workload's messages within which faults are placed: a start sends something
# before the first fault, and every fault leaves messages after it to show recovery.
FIRST, LAST = 0.1, 0.85


@dataclass(frozen=True)
class Fault:
    """One fault: `kind`, `at` (the share of the workload's messages sent before it is injected,
    in (0, 1)) and `target` (the broker, replica, reader pool or route it acts on)."""

    kind: str
    at: float
    target: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_kinds(text: str | None) -> tuple[str, ...]:
    """`--faults` as given: None, "" or "all" is every kind once; else comma-separated kinds (a
    kind named twice is injected twice; "none" means no fault)."""
    if text is None or text.strip() in ("", "all"):
        return KINDS
    if text.strip() == "none":
        return ()
    kinds = tuple(k.strip() for k in text.split(","))
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise InvalidArgument(
            f"--faults: unknown fault kind(s) {unknown}; choose from {', '.join(KINDS)} "
            "(comma-separated), all, or none"
        )
    return kinds


def plan(seed: int, kinds: Sequence[str], targets: Mapping[str, Sequence[str]]) -> list[Fault]:
    """The faults in injection order: `kinds` shuffled, each at a random point of its own slot
    between FIRST and LAST (so they spread over the run and never coincide), each on a target
    drawn from `targets[kind]`. The same arguments give the same schedule."""
    for kind in kinds:
        if kind not in KINDS:
            raise InvalidArgument(f"unknown fault kind {kind!r}; choose from {', '.join(KINDS)}")
        if not targets.get(kind):
            raise InvalidArgument(f"fault kind {kind!r} has no target to act on")
    rng = random.Random(seed)
    order = list(kinds)
    rng.shuffle(order)
    slot = (LAST - FIRST) / max(1, len(order))
    return [
        Fault(
            kind,
            round(FIRST + slot * (i + rng.uniform(0.2, 0.8)), 4),
            rng.choice(sorted(targets[kind])),
        )
        for i, kind in enumerate(order)
    ]
