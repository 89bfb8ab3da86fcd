"""Choosing: a match's next hops, best first, and `next_hops` (match and choose in one step,
remembered per route table for answers that hold for any conversation)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from actors.model.routing import (
    LOCAL,
    RAY_SCHEME,
    TRANSPORT,
    Match,
    Route,
    RouteTable,
    load_balance_key,
    match,
    step_3_ids,
    transport_address,
)


@dataclass(frozen=True)
class Hop:
    """One candidate next hop: `address` ("LOCAL" or "ray://<broker>"), its `broker` (None for
    LOCAL), `rank` ("mirror", "local", "ray", "transport") and the route that offered it."""

    address: str
    broker: str | None
    rank: str
    route: str


def _rotate(items: list, conversation_id: str) -> list:
    if len(items) < 2:
        return items
    # salted so the rotation is independent of step 3's broker pick, which used the plain key
    k = load_balance_key(conversation_id, salt="hops:") % len(items)
    return items[k:] + items[:k]


def choose(match: Match, *, service_is_local: bool) -> list[Hop]:
    """The match's next hops, best first: mirror pairs, LOCAL (only if the service is here),
    ray:// addresses (order spread by conversation id), then TRANSPORT. Empty: nothing usable."""
    cid = match.conversation_id
    pairs: dict[tuple[str, str], str] = {}  # (address, mirror) -> first route (by name)
    for r in match.routes:
        if r.mirror_address:
            pairs.setdefault((r.address, r.mirror_address), r.name)
    ranked: list[tuple[str, str, str]] = []  # (address, rank, route)
    for (addr, mirror), name in _rotate(sorted(pairs.items()), cid):
        ranked += [(addr, "mirror", name), (mirror, "mirror", name)]
    if service_is_local:
        ranked += [(LOCAL, "local", r.name) for r in match.routes if r.address == LOCAL]
    plain: dict[str, str] = {}  # address -> first route (by name) offering it
    for r in match.routes:
        if r.address.startswith(RAY_SCHEME) and not r.mirror_address:
            plain.setdefault(r.address, r.name)
    ranked += [(a, "ray", n) for a, n in _rotate(sorted(plain.items()), cid)]
    via = transport_address(match.service_name)
    if via is not None:
        ranked += [(via, "transport", r.name) for r in match.routes if r.address == TRANSPORT]
    hops: list[Hop] = []
    seen: set[str] = set()
    for addr, rank, name in ranked:
        if addr not in seen:
            seen.add(addr)
            broker = addr[len(RAY_SCHEME) :] if addr.startswith(RAY_SCHEME) else None
            hops.append(Hop(addr, broker, rank, name))
    return hops


def next_hops(
    table: Iterable[Route],
    service_name: str,
    broker_instance: str | None,
    conversation_id: str,
    now: float,
    *,
    local_broker_id: str,
    local_name: str,
    service_is_local: bool,
) -> tuple[Match, list[Hop]]:
    """Match and choose in one step, for either route table: the match and its usable next hops,
    best first. A route that leads back to this broker by name is not a hop (LOCAL is).

    A dialog's begin, each arriving bundle and each dispatched endpoint asks this, so a
    `RouteTable` remembers the answers that do not depend on the conversation (no choice among
    several brokers or addresses was made by its id) until its routes change or one expires."""
    memo = table.memo(now) if isinstance(table, RouteTable) else None
    key = (service_name, broker_instance, local_broker_id, local_name, service_is_local)
    if memo is not None and (hit := memo.get(key)) is not None:
        step, routes, picked, reason, hops = hit
        return Match(step, service_name, conversation_id, routes, picked, reason), list(hops)
    m = match(
        table, service_name, broker_instance, conversation_id, now, local_broker_id=local_broker_id
    )
    hops = [] if m.delayed else choose(m, service_is_local=service_is_local)
    hops = [h for h in hops if h.rank == "local" or (h.broker and h.broker != local_name)]
    if memo is not None and not _by_conversation(table, m, now):
        memo[key] = (m.step, m.routes, m.broker_instance, m.reason, tuple(hops))
    return m, hops


def _by_conversation(table: Iterable[Route], m: Match, now: float) -> bool:
    """Whether `m`'s routes or next hops were chosen by its conversation id: step 3 among
    several brokers, or a rotation of several mirror pairs or ray:// addresses (`choose`)."""
    if m.step == 3:
        named = [r for r in table if r.live(now) and r.service_name == m.service_name]
        if len(step_3_ids(named)) > 1:
            return True
    pairs = {(r.address, r.mirror_address) for r in m.routes if r.mirror_address}
    plain = {
        r.address for r in m.routes if r.address.startswith(RAY_SCHEME) and not r.mirror_address
    }
    return len(pairs) > 1 or len(plain) > 1
