"""Round-robin per new dialog, pinned at BEGIN, and draining routes, on one real `BrokerCore`
(a :memory: or file store, a fake clock). The routes name brokers that need not run: a dialog
pinned to one waits in the transmission queue, which is all these tests look at. Messages
crossing brokers are in tests/unit/test_transport.py."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

from actors.calls.envelope import Begin, Send
from actors.client.local import LocalBroker
from actors.errors import InvalidArgument, UnknownService

IDS = sorted(str(uuid.uuid4()) for _ in range(3))  # the order round-robin takes them in


def add_routes(core, service: str = "Far", ids=IDS, **kw) -> None:
    for i, bi in enumerate(ids):
        record = {"name": f"{service}{i}", "service_name": service, "broker_instance": bi}
        core.create_route("routes", {**record, "address": f"ray://B{i}", **kw})


def begin(core, to: str = "Far", **kw) -> str:
    op = Begin("Init", to, "C", **kw)
    core.apply([op, Send(op.handle, "Req", b"m0")])
    return op.handle


def far_broker(core, handle: str) -> str | None:
    (ep,) = [e for e in core.endpoints_view() if e["conversation_handle"] == handle]
    return ep["far_broker"]


def pinned(core) -> Counter:
    return Counter(e["far_broker"] for e in core.endpoints_view() if e["is_initiator"])


@pytest.mark.parametrize("batch", [1, 7, 3000])
def test_3000_dialogs_over_three_broker_ids_are_pinned_exactly_evenly_at_begin(core, batch):
    add_routes(core)
    ops: list = []
    for _ in range(3000):
        op = Begin("Init", "Far", "C")
        ops += [op, Send(op.handle, "Req", b"m0")]
    for i in range(0, len(ops), 2 * batch):
        core.apply(ops[i : i + 2 * batch])

    assert pinned(core) == {bi: 1000 for bi in IDS}
    handles = [op.handle for op in ops[::2]]
    assert [far_broker(core, h) for h in handles[:4]] == [*IDS, IDS[0]]  # in sorted order
    rows = core.transmission_view(limit=5000)  # each waits for the broker it is pinned to
    assert Counter(r["to_broker"] for r in rows) == {bi: 1000 for bi in IDS}


def test_a_refused_batch_does_not_advance_the_round_robin_or_leave_anything(core, snapshot):
    add_routes(core)
    begin(core)  # IDS[0]
    before = snapshot(core)
    good = [Begin("Init", "Far", "C") for _ in range(2)]
    with pytest.raises(UnknownService):
        core.apply([*good, Send(good[0].handle, "Req", b"x"), Begin("Nobody", "Far", "C")])
    assert snapshot(core) == before

    assert far_broker(core, begin(core)) == IDS[1]  # as if the refused batch never was


def test_an_explicit_to_broker_is_never_overridden_and_takes_no_turn(core):
    add_routes(core)
    other = str(uuid.uuid4())  # no route names it: the dialog waits for one
    assert far_broker(core, begin(core, to_broker=IDS[2])) == IDS[2]
    assert far_broker(core, begin(core, to_broker=other)) == other
    assert far_broker(core, begin(core)) == IDS[0]


def test_each_target_service_has_its_own_turn(core):
    add_routes(core, "Far")
    add_routes(core, "Other", IDS[:2])
    picks = [far_broker(core, begin(core, to)) for to in ("Far", "Other", "Far", "Other", "Far")]
    assert picks == [IDS[0], IDS[0], IDS[1], IDS[1], IDS[2]]


def test_dialogs_routed_by_a_route_without_broker_instance_are_not_pinned(core):
    add_routes(core)
    core.create_route("routes", {"name": "AnyFar", "service_name": "Far", "address": "ray://B9"})
    assert far_broker(core, begin(core)) is None  # step 2 matches, as before


def test_one_broker_id_behind_several_routes_leaves_the_dialog_unpinned(core):
    add_routes(core, ids=[IDS[0], IDS[0]])
    assert far_broker(core, begin(core)) is None  # no choice: the first ack pins it


def test_a_service_here_reached_by_the_wildcard_route_is_unchanged(core):
    handle = begin(core, "Target")
    assert far_broker(core, handle) == core.broker_id  # the target endpoint was made here
    assert core.depth("TargetQ") == (1, 0) and core.transmission_view() == []


def test_a_dialog_pinned_to_this_broker_by_round_robin_is_delivered_here(core):
    core.create_route(
        "routes",
        {"name": "Here", "service_name": "Target", "broker_instance": core.broker_id},
    )
    core.create_route(
        "routes",
        {
            "name": "There",
            "service_name": "Target",
            "broker_instance": IDS[0],
            "address": "ray://B",
        },
    )
    picks = [far_broker(core, begin(core, "Target")) for _ in range(4)]

    assert Counter(picks) == {core.broker_id: 2, IDS[0]: 2}
    assert core.depth("TargetQ") == (2, 0)  # those pinned here arrived here
    assert len(core.transmission_view()) == 2  # the others wait for their broker


def test_a_draining_route_takes_no_new_dialogs_and_the_routes_view_shows_it(core):
    add_routes(core)
    core.alter_route("routes", "Far1", {"draining": True})
    assert [r["draining"] for r in core.routes_view("routes") if r["name"].startswith("Far")] == [
        False,
        True,
        False,
    ]
    picks = [far_broker(core, begin(core)) for _ in range(4)]
    assert picks == [IDS[0], IDS[2], IDS[0], IDS[2]]

    core.alter_route("routes", "Far1", {"draining": False})
    assert {far_broker(core, begin(core)) for _ in range(3)} == set(IDS)


def test_create_route_takes_draining_and_refuses_anything_but_a_bool(core):
    record = {"name": "R", "service_name": "Far", "broker_instance": IDS[0], "address": "ray://B"}
    core.create_route("routes", {**record, "draining": True})
    assert core.routes_view("routes")[-1]["draining"] is True
    before = core.routes_view("routes")
    for bad in ("yes", 1, None):
        with pytest.raises(InvalidArgument, match="draining must be True or False"):
            core.create_route("routes", {**record, "name": "R2", "draining": bad})
        with pytest.raises(InvalidArgument, match="draining must be True or False"):
            core.alter_route("routes", "R", {"draining": bad})
    assert core.routes_view("routes") == before


def test_the_client_refuses_a_draining_that_is_not_a_bool_before_calling():
    with LocalBroker("rr-local") as b:
        with pytest.raises(InvalidArgument, match="draining must be True or False"):
            b.create_route("R", "S", draining="no")
        assert [r["name"] for r in b.routes()] == ["AutoCreatedLocal"]
        b.create_route("R", "S", str(uuid.uuid4()), "LOCAL", draining=True)
        (made,) = [r for r in b.routes() if r["name"] == "R"]
        assert made["draining"] is True


def test_after_a_restart_draining_is_kept_and_the_turn_starts_again_at_the_first_id(
    make_core, tmp_path
):
    path = tmp_path / "b.sqlite"
    core = make_core(path)
    add_routes(core)
    core.alter_route("routes", "Far0", {"draining": True})
    assert [far_broker(core, begin(core)) for _ in range(2)] == [IDS[1], IDS[2]]
    core.store.close()

    again = make_core(path, catalog=False)
    assert [r["draining"] for r in again.routes_view("routes")[1:]] == [True, False, False]
    assert far_broker(again, begin(again)) == IDS[1]


def test_routes_saved_before_draining_existed_load_as_not_draining(make_core, tmp_path):
    path = tmp_path / "b.sqlite"
    core = make_core(path)
    add_routes(core)
    with core.store.tx():  # rewrite each route as a broker before `draining` saved it
        for rec in core.routes_view("routes"):
            core.store.put_route("routes", rec["name"], {k: rec[k] for k in rec if k != "draining"})
    assert all("draining" not in rec for t, rec in core.store.load_routes() if t == "routes")
    core.store.close()

    again = make_core(path, catalog=False)
    assert {r["draining"] for r in again.routes_view("routes")} == {False}
    assert [far_broker(again, begin(again)) for _ in range(3)] == IDS
