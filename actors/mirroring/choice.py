"""Routes with a mirror address (seed 001, "Mirror Addresses"): which partner a sender sends to.

A route's `address` and `mirror_address` name the two partners of one mirrored broker. On the
route's first use the sender asks both which is principal and sends only to the one that says
so. From then on it sends to that one without asking. If it is unreachable, or answers that it is
no longer principal, the sender asks the other partner: if that one says it is the new principal,
the sender moves there; if it does not, the sender sends it nothing, and the batch waits to be
retried (both addresses are asked again next time). So a sender that cannot reach the principal,
while principal and mirror can still reach each other, never writes to the mirror.

Plain async Python over two callables, so unit tests drive it with in-process partners:
`ask(partner)` returns the partner's `Claim` (None: unreachable), `send(partner)` delivers the
batch there (raising `PeerUnreachable`, or `NotPrincipal` from a partner that is not principal).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from actors.errors import NotPrincipal, PeerUnreachable


class Claim(NamedTuple):
    """What a partner says of itself."""

    principal: bool
    epoch: int


Ask = Callable[[str], Awaitable[Claim | None]]
Send = Callable[[str], Awaitable[Any]]


class MirrorRoutes:
    """The principal each mirror pair was last found at (one per sender)."""

    def __init__(self) -> None:
        self.principal: dict[frozenset[str], str] = {}
        self.moves = 0  # times a sender followed a failover (for views and tests)

    def known(self, a: str, b: str) -> str | None:
        return self.principal.get(frozenset((a, b)))

    async def discover(self, a: str, b: str, ask: Ask) -> str | None:
        """Ask both partners; the one claiming principal (the higher epoch if both do)."""
        claims = {p: await ask(p) for p in (a, b)}
        claiming = [(c.epoch, p) for p, c in claims.items() if c is not None and c.principal]
        if not claiming:
            self.principal.pop(frozenset((a, b)), None)
            return None
        principal = max(claiming)[1]
        self.principal[frozenset((a, b))] = principal
        return principal

    async def send(self, a: str, b: str, ask: Ask, send: Send) -> Any:
        """Send to the pair's principal, following a failover as the seed says; raise
        `PeerUnreachable` when neither partner can take it now (nothing was sent to a partner
        that does not claim principal)."""
        pair = frozenset((a, b))
        target = self.principal.get(pair) or await self.discover(a, b, ask)
        if target is None:
            raise PeerUnreachable(a, f"neither {a!r} nor its mirror partner {b!r} claims principal")
        try:
            return await send(target)
        except (PeerUnreachable, NotPrincipal) as exc:
            why = exc.reason if isinstance(exc, PeerUnreachable) else "it is no longer principal"
        other = b if target == a else a
        claim = await ask(other)
        if claim is None or not claim.principal:
            self.principal.pop(pair, None)  # ask both again next time
            said = "is unreachable" if claim is None else "does not claim principal"
            raise PeerUnreachable(
                target, f"{why}; its partner {other!r} {said}, so nothing was sent to it"
            )
        self.principal[pair] = other
        self.moves += 1
        return await send(other)


def pairs(hops: list[Any]) -> list[list[Any]]:
    """A batch's next hops in order, a mirror pair's two hops (rank "mirror", one route) kept
    together as one entry; every other hop alone."""
    out: list[list[Any]] = []
    i = 0
    while i < len(hops):
        h = hops[i]
        nxt = hops[i + 1] if i + 1 < len(hops) else None
        if h.rank == "mirror" and nxt is not None and nxt.rank == "mirror" and nxt.route == h.route:
            out.append([h, nxt])
            i += 2
        else:
            out.append([h])
            i += 1
    return out
