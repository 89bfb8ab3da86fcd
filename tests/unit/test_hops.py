"""`next_hops` over a RouteTable remembers answers that hold for any conversation: they must be the
answers it would compute, follow every change and expiry of the routes, and never fix a choice
that was made by the conversation id."""

from __future__ import annotations

import itertools
import uuid

from actors.model.hops import next_hops
from actors.model.routing import Route, RouteTable

LOCAL_ID = "99999999-9999-9999-9999-999999999999"
B1 = "11111111-1111-1111-1111-111111111111"
B2 = "22222222-2222-2222-2222-222222222222"
NOW = 1000.0
CIDS = [str(uuid.uuid5(uuid.NAMESPACE_URL, f"conv-{i}")) for i in range(200)]


def hops(table, service="S", bi=None, cid=CIDS[0], now=NOW, local=False):
    m, hs = next_hops(
        table, service, bi, cid, now, local_broker_id=LOCAL_ID, local_name="me",
        service_is_local=local,
    )  # fmt: skip
    return m.step, [r.name for r in m.routes], m.conversation_id, [h.address for h in hs]


def table_of(*routes: Route) -> RouteTable:
    t = RouteTable([])  # not even AutoCreatedLocal
    for r in routes:
        t.create(r, NOW - 1)
    return t


def test_remembered_answers_are_the_computed_ones_for_every_service_broker_and_conversation():
    t = table_of(
        Route("S-any", "S", None, "ray://X"),
        Route("S-b1", "S", B1, "ray://Y", mirror_address="ray://Y2"),
        Route("R-b1", "R", B1, "ray://P"),
        Route("R-b2", "R", B2, "ray://Q"),
        Route("T-two", "T", None, "ray://U"),
        Route("T-two-b", "T", None, "ray://V"),
        Route("Wild", address="ray://Hub"),
    )
    asked = itertools.product(("S", "R", "T", "Nope"), (None, B1, B2, LOCAL_ID), CIDS[:40])
    for service, bi, cid in asked:
        for _ in range(2):  # the second time from what the table remembered, if anything
            assert hops(t, service, bi, cid) == hops(list(t), service, bi, cid), (service, bi)


def test_a_choice_made_by_the_conversation_id_is_made_again_for_each_conversation():
    # step 3 between two brokers, and two ray:// addresses in one match: both spread by the id
    t = table_of(Route("R-b1", "R", B1, "ray://P"), Route("R-b2", "R", B2, "ray://Q"))
    assert {tuple(hops(t, "R", cid=c)[3]) for c in CIDS} == {("ray://P",), ("ray://Q",)}
    t = table_of(Route("T1", "T", None, "ray://U"), Route("T2", "T", None, "ray://V"))
    firsts = {hops(t, "T", cid=c)[3][0] for c in CIDS}
    assert firsts == {"ray://U", "ray://V"}


def test_each_answer_names_the_conversation_it_was_asked_for():
    t = table_of(Route("S-any", "S", None, "ray://X"))
    assert [hops(t, cid=c)[2] for c in CIDS[:3]] == CIDS[:3]


def test_a_created_altered_or_dropped_route_changes_the_next_answer():
    t = table_of(Route("S-any", "S", None, "ray://X"))
    assert hops(t)[3] == ["ray://X"]
    t.alter("S-any", NOW, address="ray://Y")
    assert hops(t)[3] == ["ray://Y"]
    t.create(Route("S-b1", "S", B1, "ray://Z"), NOW)
    assert hops(t, bi=B1)[3] == ["ray://Z"]
    t.drop("S-b1")
    assert hops(t, bi=B1)[3] == ["ray://Y"]


def test_an_answer_is_not_kept_past_the_expiry_of_a_route():
    t = table_of(
        Route("Soon", "S", None, "ray://X", expires_at=NOW + 10), Route("Wild", address="ray://W")
    )
    assert hops(t, now=NOW)[3] == ["ray://X"]
    assert hops(t, now=NOW + 9.9)[3] == ["ray://X"]
    assert hops(t, now=NOW + 10)[1] == ["Wild"]  # step 5 once "Soon" has expired
    t = table_of(Route("Soon", "S", None, "ray://X", expires_at=NOW + 10))
    assert hops(t, now=NOW)[0] == 2
    assert hops(t, now=NOW + 11)[0] == 7  # delayed: nothing live matches


def test_changing_a_returned_list_changes_no_later_answer():
    t = table_of(Route("S-any", "S", None, "ray://X"))
    _, first = next_hops(
        t, "S", None, CIDS[0], NOW, local_broker_id=LOCAL_ID, local_name="me",
        service_is_local=False,
    )  # fmt: skip
    first.clear()
    assert hops(t)[3] == ["ray://X"]
