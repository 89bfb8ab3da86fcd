"""Seed 001, "Mirror Addresses": a sender on a route with a mirror address asks both partners
which is principal, sends only to it, follows a failover when the partner claims principal, and
sends nothing to a partner that does not claim it. In-process partners, no Ray."""

from __future__ import annotations

import asyncio

import pytest

from actors.errors import NotPrincipal, PeerUnreachable
from actors.mirroring.choice import Claim, MirrorRoutes, pairs
from actors.model.hops import Hop


class Partners:
    """Two partners: who claims principal, who is reachable, what each was asked and sent."""

    def __init__(self, principal: str = "P") -> None:
        self.principal = {"P": principal == "P", "M": principal == "M"}
        self.epoch = {"P": 1, "M": 1}
        self.down: set[str] = set()
        self.asked: list[str] = []
        self.sent: list[str] = []

    async def ask(self, p: str) -> Claim | None:
        self.asked.append(p)
        return None if p in self.down else Claim(self.principal[p], self.epoch[p])

    async def send(self, p: str) -> str:
        if p in self.down:
            raise PeerUnreachable.not_running(p)
        if not self.principal[p]:
            raise NotPrincipal(p, None)
        self.sent.append(p)
        return f"taken by {p}"

    def fail_over(self) -> None:
        self.principal = {"P": False, "M": True}
        self.epoch["M"] += 1


def run(routes: MirrorRoutes, net: Partners) -> str:
    return asyncio.run(routes.send("P", "M", net.ask, net.send))


def test_first_use_asks_both_and_sends_to_the_principal_only_even_when_listed_second():
    routes, net = MirrorRoutes(), Partners(principal="M")
    assert run(routes, net) == "taken by M"
    assert sorted(net.asked) == ["M", "P"] and net.sent == ["M"]
    net.asked.clear()
    run(routes, net)  # known now: sent without asking
    assert net.asked == [] and net.sent == ["M", "M"]


def test_an_unreachable_principal_whose_partner_claims_principal_is_followed():
    routes, net = MirrorRoutes(), Partners()
    run(routes, net)
    net.down.add("P")
    net.fail_over()
    assert run(routes, net) == "taken by M"
    assert routes.known("P", "M") == "M" and routes.moves == 1


def test_a_principal_that_says_it_no_longer_is_is_left_for_the_new_one():
    routes, net = MirrorRoutes(), Partners()
    run(routes, net)
    net.fail_over()  # P is reachable but answers NotPrincipal
    assert run(routes, net) == "taken by M"
    assert net.sent == ["P", "M"]


def test_a_partner_that_does_not_claim_principal_is_sent_nothing_and_both_are_retried():
    routes, net = MirrorRoutes(), Partners()
    run(routes, net)
    net.down.add("P")  # the sender cannot reach P; P and M still can: M stays mirror
    for _ in range(3):
        with pytest.raises(PeerUnreachable, match="claims? principal"):
            run(routes, net)
    assert net.sent == ["P"]  # nothing ever went to M
    net.asked.clear()
    net.down.clear()  # P reachable again: found by asking both, and sent to
    assert run(routes, net) == "taken by P"
    assert sorted(net.asked) == ["M", "P"]


def test_with_neither_claiming_principal_nothing_is_sent():
    routes, net = MirrorRoutes(), Partners()
    net.principal["P"] = False
    with pytest.raises(PeerUnreachable, match="claims principal"):
        run(routes, net)
    assert net.sent == []


def test_when_both_claim_principal_the_higher_epoch_wins():
    routes, net = MirrorRoutes(), Partners()
    net.principal["M"], net.epoch["M"] = True, 2  # P has not yet learned it was replaced
    assert asyncio.run(routes.discover("P", "M", net.ask)) == "M"


def test_pairs_keeps_a_mirror_routes_two_hops_together():
    hops = [Hop("ray://P", "P", "mirror", "R"), Hop("ray://M", "M", "mirror", "R"),
            Hop("ray://X", "X", "ray", "R2")]  # fmt: skip
    assert [[h.broker for h in g] for g in pairs(hops)] == [["P", "M"], ["X"]]
