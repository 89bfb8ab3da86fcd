"""Routing: route validation, the route table, seed 001's matching steps, choosing next hops."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import uuid
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.errors import AlreadyExists, InvalidArgument, NotFound, UnknownRoute
from actors.model.hops import choose
from actors.model.routing import (
    AUTO_LOCAL,
    Address,
    Match,
    Route,
    RouteTable,
    balance,
    load_balance_key,
    match,
    parse_address,
    target_hazards,
    transport_address,
)

LOCAL_ID = "99999999-9999-9999-9999-999999999999"  # this broker
B1 = "11111111-1111-1111-1111-111111111111"
B2 = "22222222-2222-2222-2222-222222222222"
B3 = "33333333-3333-3333-3333-333333333333"
NOW = 1000.0
CID = "00000000-0000-0000-0000-000000000001"
CIDS = [str(uuid.uuid5(uuid.NAMESPACE_URL, f"conv-{i}")) for i in range(1000)]


def m(routes, service="S", bi=None, cid=CID, now=NOW, dynamic=None) -> Match:
    return match(routes, service, bi, cid, now, local_broker_id=LOCAL_ID, dynamic=dynamic)


def names(result: Match) -> list[str]:
    return [r.name for r in result.routes]


def addresses(hops) -> list[str]:
    return [h.address for h in hops]


WILD = Route("Wild", address="ray://Hub")


# --- matching steps ------------------------------------------------------------------------------


def test_step_1_a_route_with_the_dialogs_service_and_broker_instance_matches_first():
    routes = [Route("Exact", "S", B1, "ray://X"), Route("Any", "S", None, "ray://Y"), WILD]
    result = m(routes, bi=B1)
    assert (result.step, names(result)) == (1, ["Exact"])


def test_step_2_a_service_route_without_broker_instance_beats_broker_id_routes():
    routes = [Route("ById", "S", B1, "ray://X"), Route("Any", "S", None, "ray://Y"), WILD]
    result = m(routes, bi=None)
    assert (result.step, names(result)) == (2, ["Any"])


def test_step_2_applies_when_no_route_has_the_broker_instance_the_dialog_names():
    routes = [Route("ById", "S", B1, "ray://X"), Route("Any", "S", None, "ray://Y")]
    assert m(routes, bi=B3).step == 2


def test_step_3_picks_one_broker_instance_and_keeps_only_its_routes():
    routes = [
        Route("B1a", "S", B1, "ray://G1"),
        Route("B1b", "S", B1, "ray://G2"),
        Route("B2", "S", B2, "ray://G3"),
        WILD,
    ]
    result = m(routes, bi=None)
    assert result.step == 3
    assert result.broker_instance in (B1, B2)
    assert names(result) == (["B1a", "B1b"] if result.broker_instance == B1 else ["B2"])


def test_step_3_does_not_apply_when_the_dialog_names_a_broker_instance():
    routes = [Route("ById", "S", B1, "ray://X"), WILD]
    assert (m(routes, bi=B2).step, names(m(routes, bi=B2))) == (5, ["Wild"])


def test_step_4_the_dynamic_hook_is_asked_after_the_service_steps_and_before_wildcards():
    asked: list[tuple[str, str | None]] = []

    def hook(service, bi):
        asked.append((service, bi))
        return [Route("Dyn", service, None, "ray://D")]

    assert (m([WILD], dynamic=hook).step, asked) == (4, [("S", None)])
    assert m([Route("Any", "S", None, "ray://Y")], dynamic=hook).step == 2
    assert len(asked) == 1  # a service route matched, so the hook was not asked again


def test_a_dynamic_hook_returning_none_falls_through_to_the_wildcard():
    assert m([WILD], dynamic=lambda s, b: None).step == 5


def test_routes_from_the_dynamic_hook_that_are_expired_or_for_other_targets_are_ignored():
    offered = [
        Route("Old", "S", None, "ray://D", expires_at=NOW),
        Route("Other", "T", None, "ray://D"),
        Route("OtherBroker", "S", B2, "ray://D"),
        Route("Good", "S", B1, "ray://D"),
    ]
    result = m([WILD], bi=B1, dynamic=lambda s, b: offered)
    assert (result.step, names(result)) == (4, ["Good"])


def test_step_5_a_wildcard_route_such_as_AutoCreatedLocal_matches_any_service():
    result = m(RouteTable(), service="Anything", bi=B2)
    assert (result.step, names(result)) == (5, [AUTO_LOCAL])


def test_step_6_a_dialog_for_this_brokers_id_is_routed_LOCAL_when_nothing_else_matches():
    result = m([], bi=LOCAL_ID)
    assert result.step == 6
    [route] = result.routes
    assert (route.service_name, route.broker_instance, route.address) == ("S", LOCAL_ID, "LOCAL")


def test_step_6_does_not_apply_to_a_dialog_without_broker_instance():
    assert m([], bi=None).delayed


def test_step_7_with_no_matching_route_the_dialog_is_delayed_with_an_actionable_reason():
    result = m([Route("ForT", "T", None, "ray://X")], bi=B1)
    assert (result.step, result.delayed, result.routes) == (7, True, ())
    assert "'S'" in result.reason and B1 in result.reason and "Create a route" in result.reason
    assert result.describe().startswith("delayed: ")


def test_the_delay_reason_names_routes_that_would_have_matched_but_expired():
    result = m([Route("Gone", "S", None, "LOCAL", expires_at=NOW - 1)])
    assert result.delayed and "['Gone']" in result.reason and "expired" in result.reason


@pytest.mark.parametrize(
    ("bi", "layers"),
    [
        (LOCAL_ID, [1, 2, 4, 5, 6]),  # step 3 needs a dialog without broker instance; with
        (None, [2, 3, 4, 5, 7]),  # this broker's id step 6 always applies; steps 1, 6 need one
    ],
)
def test_each_step_beats_every_later_step(bi, layers):
    by_step = {
        1: [Route("R1", "S", LOCAL_ID, "ray://One")],
        2: [Route("R2", "S", None, "ray://Two")],
        3: [Route("R3", "S", B1, "ray://Three")],
        5: [Route("R5", None, None, "ray://Five")],
    }
    dyn = [Route("R4", "S", None, "ray://Four")]
    for i, step in enumerate(layers):
        present = layers[i:]
        table = [r for s in present for r in by_step.get(s, [])]
        hook = (lambda s, b: dyn) if 4 in present else None
        assert m(table, bi=bi, dynamic=hook).step == step


def test_an_expired_route_is_skipped_and_the_next_step_applies():
    routes = [Route("Exact", "S", B1, "ray://X", expires_at=NOW), Route("Any", "S", None, "LOCAL")]
    assert m(routes, bi=B1, now=NOW - 0.001).step == 1
    assert (m(routes, bi=B1, now=NOW).step, names(m(routes, bi=B1, now=NOW))) == (2, ["Any"])


def test_an_expired_wildcard_route_is_ignored_too():
    assert m([Route("W", expires_at=NOW)], bi=B1).delayed


def test_match_does_not_depend_on_the_order_of_the_table():
    routes = [Route(f"R{i}", "S", (B1, B2, B3)[i % 3], f"ray://G{i}") for i in range(9)]
    for cid in CIDS[:50]:
        assert m(routes, cid=cid) == m(list(reversed(routes)), cid=cid)


# --- load balancing (step 3) ---------------------------------------------------------------------


def test_load_balance_key_is_a_fixed_sha256_derived_value():
    # fixed: a change of hash function would move live dialogs to other brokers after an upgrade
    assert load_balance_key(CID) == 8845554376707389133
    routes = [Route("B1", "S", B1, "ray://X"), Route("B2", "S", B2, "ray://Y")]
    assert m(routes, cid=CID).broker_instance == B2


def test_1000_conversations_split_over_two_broker_ids_within_10_percent_of_even():
    routes = [Route("B1", "S", B1, "ray://X"), Route("B2", "S", B2, "ray://Y")]
    counts = Counter(m(routes, cid=cid).broker_instance for cid in CIDS)
    assert set(counts) == {B1, B2}
    assert all(450 <= n <= 550 for n in counts.values())


def test_a_second_route_to_one_broker_id_does_not_skew_the_split():
    two = [Route("B1", "S", B1, "ray://X"), Route("B2", "S", B2, "ray://Y")]
    three = [*two, Route("B2bis", "S", B2, "ray://Z")]
    assert [m(two, cid=c).broker_instance for c in CIDS] == [
        m(three, cid=c).broker_instance for c in CIDS
    ]


def test_the_same_conversation_id_always_picks_the_same_broker():
    routes = [Route(f"R{i}", "S", bi, "ray://X") for i, bi in enumerate((B1, B2, B3))]
    picks = {cid: m(routes, cid=cid).broker_instance for cid in CIDS[:100]}
    for _ in range(3):
        assert {cid: m(routes, cid=cid).broker_instance for cid in CIDS[:100]} == picks


def test_the_pick_is_the_same_in_other_processes_whatever_their_hash_seed():
    code = (
        "import sys; from actors.model.routing import Route, match\n"
        f"rs = [Route('a', 'S', {B1!r}, 'ray://X'), Route('b', 'S', {B2!r}, 'ray://Y')]\n"
        f"for c in {CIDS[:20]!r}:\n"
        f"    print(match(rs, 'S', None, c, 0.0, local_broker_id={LOCAL_ID!r}).broker_instance)\n"
    )
    routes = [Route("a", "S", B1, "ray://X"), Route("b", "S", B2, "ray://Y")]
    expected = [m(routes, cid=c).broker_instance for c in CIDS[:20]]
    root = str(Path(__file__).resolve().parents[2])
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": root}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert out.stdout.split() == expected


# --- round-robin at BEGIN and draining routes ----------------------------------------------------


def test_balance_goes_round_robin_over_the_distinct_broker_ids_in_sorted_order():
    routes = [
        Route("Z", "S", B3, "ray://Z"),
        Route("A", "S", B1, "ray://X"),
        Route("Abis", "S", B1, "ray://Y"),  # a second path to B1 does not give it a second turn
        Route("M", "S", B2, "ray://M"),
        WILD,
    ]
    assert [balance(routes, "S", NOW, t) for t in range(7)] == [B1, B2, B3, B1, B2, B3, B1]


def test_3000_turns_over_three_broker_ids_are_exactly_even():
    routes = [Route(f"R{i}", "S", bi, "ray://X") for i, bi in enumerate((B1, B2, B3))]
    counts = Counter(balance(routes, "S", NOW, t) for t in range(3000))
    assert counts == {B1: 1000, B2: 1000, B3: 1000}


@pytest.mark.parametrize(
    "routes",
    [
        [],  # no route: nothing to balance
        [WILD],  # step 5
        [Route("Any", "S", None, "ray://Y"), Route("B1", "S", B1, "ray://X")],  # step 2 wins
        [Route("B1", "S", B1, "ray://X"), Route("B1bis", "S", B1, "ray://Y")],  # one id: no choice
        [Route("T1", "T", B1, "ray://X"), Route("T2", "T", B2, "ray://Y")],  # another service
        [Route("B1", "S", B1, "ray://X", expires_at=NOW), Route("B2", "S", B2, "ray://Y")],
    ],
)
def test_balance_picks_nothing_when_step_3_has_no_choice_between_brokers(routes):
    assert balance(routes, "S", NOW, 0) is None


def test_balance_skips_draining_routes_but_still_pins_while_one_broker_drains():
    routes = [
        Route("B1", "S", B1, "ray://X", draining=True),
        Route("B2", "S", B2, "ray://Y"),
        Route("B3", "S", B3, "ray://Z"),
    ]
    assert [balance(routes, "S", NOW, t) for t in range(4)] == [B2, B3, B2, B3]
    one_left = [routes[0], routes[1]]
    assert {balance(one_left, "S", NOW, t) for t in range(4)} == {B2}
    all_draining = [replace(r, draining=True) for r in routes]
    assert balance(all_draining, "S", NOW, 0) is None


def test_a_broker_id_with_one_draining_path_and_one_open_path_still_takes_new_dialogs():
    routes = [
        Route("B1old", "S", B1, "ray://Old", draining=True),
        Route("B1new", "S", B1, "ray://New"),
        Route("B2", "S", B2, "ray://Y"),
    ]
    assert [balance(routes, "S", NOW, t) for t in range(2)] == [B1, B2]
    picked_b1 = next(c for c in CIDS if m(routes, cid=c).broker_instance == B1)
    assert names(m(routes, cid=picked_b1)) == ["B1new"]  # the draining path is not used


def test_step_3_hash_pick_skips_draining_routes():
    routes = [Route("B1", "S", B1, "ray://X", draining=True), Route("B2", "S", B2, "ray://Y")]
    picks = {m(routes, cid=c).broker_instance for c in CIDS[:200]}
    assert picks == {B2}
    assert all(names(m(routes, cid=c)) == ["B2"] for c in CIDS[:20])


def test_step_3_falls_through_to_later_steps_when_every_broker_id_route_drains():
    routes = [Route("B1", "S", B1, "ray://X", draining=True), WILD]
    assert (m(routes).step, names(m(routes))) == (5, ["Wild"])
    assert m([routes[0]]).step == 7


def test_step_1_still_matches_a_draining_route_for_dialogs_pinned_to_its_broker():
    routes = [Route("B1", "S", B1, "ray://X", draining=True), Route("B2", "S", B2, "ray://Y")]
    result = m(routes, bi=B1)
    assert (result.step, names(result)) == (1, ["B1"])
    assert addresses(choose(result, service_is_local=False)) == ["ray://X"]


@pytest.mark.parametrize("bad", [None, 0, 1, "no", "False", []])
def test_draining_must_be_a_real_bool(bad):
    with pytest.raises(InvalidArgument, match="draining must be True or False") as e:
        Route("R", "S", B1, "ray://X", draining=bad)
    assert type(e.value) is InvalidArgument
    table = RouteTable([Route("R", "S", B1, "ray://X")])
    before = table.routes()
    with pytest.raises(InvalidArgument, match="draining"):
        table.alter("R", NOW, draining=bad)
    assert table.routes() == before


def test_draining_is_altered_both_ways_and_kept_in_records():
    table = RouteTable([Route("R", "S", B1, "ray://X")])
    table.alter("R", NOW, draining=True)
    assert table.get("R").draining is True
    record = json.loads(json.dumps(table.get("R").to_record()))
    assert record["draining"] is True and Route.from_record(record) == table.get("R")
    table.alter("R", NOW, draining=False)
    assert table.get("R") == Route("R", "S", B1, "ray://X")


def test_a_route_record_saved_before_draining_existed_loads_as_not_draining():
    old = {"name": "R", "service_name": "S", "broker_instance": B1, "address": "ray://X",
           "mirror_address": None, "expires_at": None}  # fmt: skip
    assert Route.from_record(old).draining is False


# --- choosing next hops --------------------------------------------------------------------------


def test_choose_orders_mirror_then_local_then_network_then_transport():
    routes = [
        Route("Net", "ray://Far/S", None, "ray://Net"),
        Route("Loc", "ray://Far/S", None, "LOCAL"),
        Route("Tr", "ray://Far/S", None, "TRANSPORT"),
        Route("Mir", "ray://Far/S", None, "ray://Prin", mirror_address="ray://Part"),
    ]
    hops = choose(m(routes, service="ray://Far/S"), service_is_local=True)
    assert [(h.rank, h.address) for h in hops] == [
        ("mirror", "ray://Prin"),
        ("mirror", "ray://Part"),
        ("local", "LOCAL"),
        ("ray", "ray://Net"),
        ("transport", "ray://Far"),
    ]
    assert [h.broker for h in hops] == ["Prin", "Part", None, "Net", "Far"]
    assert [h.route for h in hops] == ["Mir", "Mir", "Loc", "Net", "Tr"]


def test_LOCAL_is_not_a_hop_when_the_service_is_not_on_this_broker():
    routes = [Route("Loc", "S", None, "LOCAL"), Route("Net", "S", None, "ray://Net")]
    assert addresses(choose(m(routes), service_is_local=False)) == ["ray://Net"]


def test_implicit_LOCAL_offers_no_hop_when_the_service_is_not_here():
    result = m([], bi=LOCAL_ID)
    assert choose(result, service_is_local=False) == []
    assert addresses(choose(result, service_is_local=True)) == ["LOCAL"]


def test_TRANSPORT_offers_no_hop_when_the_service_name_carries_no_broker():
    assert choose(m([Route("Tr", "S", None, "TRANSPORT")]), service_is_local=True) == []


def test_a_delayed_match_offers_no_hops():
    assert choose(m([]), service_is_local=True) == []


def test_an_address_offered_twice_is_one_hop_at_its_best_rank():
    routes = [
        Route("A", "S", None, "ray://X"),
        Route("B", "S", None, "ray://X"),
        Route("M", "S", None, "ray://Y", mirror_address="ray://X"),
        Route("L1", "S", None, "LOCAL"),
        Route("L2", "S", None, "LOCAL"),
    ]
    hops = choose(m(routes), service_is_local=True)
    assert [(h.rank, h.address) for h in hops] == [
        ("mirror", "ray://Y"),
        ("mirror", "ray://X"),
        ("local", "LOCAL"),
    ]


def test_several_routes_to_one_broker_id_are_failover_paths_in_a_fixed_order_per_dialog():
    routes = [Route("ViaG1", "S", B1, "ray://G1"), Route("ViaG2", "S", B1, "ray://G2")]
    firsts = Counter()
    for cid in CIDS:
        hops = choose(m(routes, bi=B1, cid=cid), service_is_local=False)
        assert sorted(addresses(hops)) == ["ray://G1", "ray://G2"]
        assert choose(m(routes, bi=B1, cid=cid), service_is_local=False) == hops
        firsts[hops[0].address] += 1
    assert all(450 <= n <= 550 for n in firsts.values())  # dialogs start on different paths


def test_dialogs_pinned_to_one_broker_by_step_3_still_spread_over_its_paths():
    # the path order uses a salted key: reusing step 3's key would send every dialog that
    # picked B1 (an even key, say) down the same first path
    routes = [
        Route("B1viaG1", "S", B1, "ray://G1"),
        Route("B1viaG2", "S", B1, "ray://G2"),
        Route("B2viaG3", "S", B2, "ray://G3"),
    ]
    firsts = Counter()
    for cid in CIDS:
        result = m(routes, cid=cid)
        if result.broker_instance == B1:
            firsts[choose(result, service_is_local=False)[0].address] += 1
    total = sum(firsts.values())
    assert set(firsts) == {"ray://G1", "ray://G2"}
    assert all(0.4 * total <= n <= 0.6 * total for n in firsts.values())


def test_describe_names_the_step_and_routes_for_status_text():
    routes = [Route("B1", "S", B1, "ray://X"), Route("B2", "S", B2, "ray://Y")]
    assert m(routes, cid=CID).describe() == (
        "routed by step 3, service, broker instance picked by conversation id "
        f"(broker instance {B2}): B2"
    )


# --- the route table -----------------------------------------------------------------------------


def test_a_new_table_holds_only_AutoCreatedLocal_a_wildcard_LOCAL_route():
    assert RouteTable().routes() == (Route(AUTO_LOCAL, None, None, "LOCAL"),)


def test_AutoCreatedLocal_can_be_dropped_and_then_unknown_services_are_delayed():
    table = RouteTable()
    table.drop(AUTO_LOCAL)
    assert table.routes() == ()
    assert m(table, bi=B1).delayed


def test_create_alter_and_drop_a_route():
    table = RouteTable()
    assert table.create(Route("ToB", "S", B1, "ray://B"), NOW) == []
    assert table.alter("ToB", NOW, address="ray://C", expires_at=NOW + 60) == []
    assert table.get("ToB") == Route("ToB", "S", B1, "ray://C", expires_at=NOW + 60)
    assert table.drop("ToB") == Route("ToB", "S", B1, "ray://C", expires_at=NOW + 60)
    assert [r.name for r in table.routes()] == [AUTO_LOCAL]


def test_creating_a_duplicate_name_raises_AlreadyExists_and_leaves_the_table_unchanged():
    table = RouteTable()
    table.create(Route("R", "S", None, "ray://B"), NOW)
    before = table.routes()
    with pytest.raises(AlreadyExists) as e:
        table.create(Route("R", "T", None, "LOCAL"), NOW)
    assert type(e.value) is AlreadyExists and e.value.kind == "route"
    assert table.routes() == before


@pytest.mark.parametrize("verb", ["alter", "drop", "get"])
def test_an_unknown_route_name_raises_UnknownRoute(verb):
    table = RouteTable()
    call = {
        "alter": lambda: table.alter("Nope", NOW, address="LOCAL"),
        "drop": lambda: table.drop("Nope"),
        "get": lambda: table.get("Nope"),
    }[verb]
    with pytest.raises(UnknownRoute) as e:
        call()
    assert type(e.value) is UnknownRoute and e.value.name == "Nope"
    assert table.routes() == RouteTable().routes()


def test_creating_a_route_whose_lifetime_already_passed_is_refused():
    table = RouteTable()
    with pytest.raises(InvalidArgument) as e:
        table.create(Route("Old", "S", None, "LOCAL", expires_at=NOW), NOW)
    assert type(e.value) is InvalidArgument and "expires_at" in str(e.value)
    assert table.routes() == RouteTable().routes()


@pytest.mark.parametrize(
    "changes",
    [
        {"expires_at": NOW - 1},
        {"address": "tcp://x"},
        {"broker_instance": "not-a-uuid"},
        {"name": "Renamed"},
        {"colour": "blue"},
    ],
)
def test_a_refused_alter_leaves_the_route_unchanged(changes):
    table = RouteTable()
    table.create(Route("R", "S", None, "ray://B"), NOW)
    before = table.routes()
    with pytest.raises(InvalidArgument) as e:
        table.alter("R", NOW, **changes)
    assert type(e.value) is InvalidArgument
    assert table.routes() == before


def test_a_restored_table_holds_exactly_the_given_routes():
    assert RouteTable([]).routes() == ()
    with pytest.raises(AlreadyExists):
        RouteTable([Route("R"), Route("R")])


def test_the_table_is_iterable_for_match():
    table = RouteTable()
    table.create(Route("R", "S", None, "ray://B"), NOW)
    assert names(m(table)) == ["R"]


# --- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text", ["ray://", "tcp://x", "", "ray://a b", "ray://a/b", "ray://-x", "LOCALX", None, 5]
)
def test_a_malformed_address_raises_InvalidArgument_with_the_accepted_forms(text):
    with pytest.raises(InvalidArgument) as e:
        parse_address(text)
    assert type(e.value) is InvalidArgument and "ray://" in str(e.value)


@pytest.mark.parametrize(
    ("text", "parsed", "canonical"),
    [
        ("LOCAL", Address("local"), "LOCAL"),
        ("local", Address("local"), "LOCAL"),
        ("TRANSPORT", Address("transport"), "TRANSPORT"),
        ("ray://B1", Address("ray", "B1"), "ray://B1"),
        ("RAY://B1", Address("ray", "B1"), "ray://B1"),
    ],
)
def test_addresses_parse_to_a_kind_and_print_in_canonical_form(text, parsed, canonical):
    assert parse_address(text) == parsed
    assert str(parsed) == canonical
    assert Route("R", "S", None, text).address == canonical


@pytest.mark.parametrize(
    "kwargs",
    [
        {"address": "LOCAL", "mirror_address": "ray://M"},
        {"address": "ray://P", "mirror_address": "LOCAL"},
        {"address": "ray://P", "mirror_address": "TRANSPORT"},
        {"address": "ray://P", "mirror_address": "ray://P"},
        {"broker_instance": "DatabaseB"},
        {"broker_instance": B1, "service_name": None},
        {"name": "bad name"},
        {"service_name": ""},
        {"expires_at": float("nan")},
        {"expires_at": True},
        {"expires_at": "soon"},
    ],
)
def test_an_invalid_route_raises_InvalidArgument(kwargs):
    fields = {"name": "R", "service_name": "S", "address": "LOCAL", **kwargs}
    with pytest.raises(InvalidArgument) as e:
        Route(**fields)
    assert type(e.value) is InvalidArgument


def test_broker_instances_are_compared_in_canonical_uuid_form():
    route = Route("R", "S", B1.upper(), "ray://X")
    assert route.broker_instance == B1
    assert m([route], bi=uuid.UUID(B1)).step == 1


@pytest.mark.parametrize(
    ("service", "expected"),
    [
        ("ray://BrokerA/Orders", "ray://BrokerA"),
        ("ray://BrokerA/a/b", "ray://BrokerA"),
        ("Orders", None),
        ("ray://BrokerA", None),
        ("ray://BrokerA/", None),
        ("ray:///Orders", None),
    ],
)
def test_transport_address_comes_from_a_ray_service_name(service, expected):
    assert transport_address(service) == expected


# --- the multiple target endpoints hazard --------------------------------------------------------


def test_routes_for_one_service_to_different_addresses_without_broker_ids_warn_with_the_fix():
    table = RouteTable()
    assert table.create(Route("ToB", "S", None, "ray://B"), NOW) == []
    [warning] = table.create(Route("ToC", "S", None, "ray://C"), NOW)
    assert "['ToB', 'ToC']" in warning and "'S'" in warning
    assert "multiple target endpoints" in warning and "broker_instance" in warning
    assert len(table.routes()) == 3  # a warning, not a refusal


@pytest.mark.parametrize(
    "routes",
    [
        [Route("ToB", "S", B1, "ray://B"), Route("ToC", "S", B2, "ray://C")],  # broker ids
        [Route("ViaG1", "S", None, "ray://B"), Route("ViaG1bis", "S", None, "ray://B")],
        [Route("ToB", "S", None, "ray://B"), Route("ToC", "T", None, "ray://C")],
        [Route("ToB", "S", None, "ray://B"), Route("Old", "S", None, "ray://C", expires_at=NOW)],
    ],
)
def test_no_hazard_when_routes_give_broker_ids_share_an_address_differ_or_expired(routes):
    assert target_hazards(routes, NOW) == []


def test_altering_a_route_into_the_hazard_warns_too():
    table = RouteTable()
    table.create(Route("ToB", "S", None, "ray://B"), NOW)
    table.create(Route("ToB2", "S", None, "ray://B"), NOW)
    assert len(table.alter("ToB2", NOW, address="ray://C")) == 1


# --- records and errors --------------------------------------------------------------------------


def test_a_route_survives_a_json_record_round_trip():
    route = Route("R", "S", B1, "ray://P", mirror_address="ray://Q", expires_at=NOW)
    record = json.loads(json.dumps(route.to_record()))
    assert Route.from_record(record) == route


def test_a_record_with_unknown_fields_is_refused():
    with pytest.raises(InvalidArgument):
        Route.from_record({"name": "R", "colour": "blue"})


def test_UnknownRoute_is_a_NotFound_of_kind_route_that_survives_pickle():
    err = UnknownRoute("R")
    assert isinstance(err, NotFound) and err.kind == "route"
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is UnknownRoute and str(back) == str(err) and back.name == "R"


# --- property ------------------------------------------------------------------------------------

IDS = [B1, B2, LOCAL_ID]


@st.composite
def routes_st(draw, name: str) -> Route:
    service = draw(st.sampled_from([None, "S", "T"]))
    bi = None if service is None else draw(st.sampled_from([None, *IDS]))
    address = draw(st.sampled_from(["LOCAL", "TRANSPORT", "ray://A", "ray://B"]))
    mirror = draw(st.sampled_from([None, "ray://M"])) if address.startswith("ray://") else None
    expires = draw(st.none() | st.floats(0, 20))
    draining = draw(st.booleans())
    return Route(name, service, bi, address, mirror, expires, draining)


@st.composite
def tables_st(draw, prefix: str) -> list[Route]:
    n = draw(st.integers(0, 8))
    return [draw(routes_st(f"{prefix}{i}")) for i in range(n)]


@settings(max_examples=300, deadline=None)
@given(
    table=tables_st("R"),
    offered=st.none() | tables_st("D"),
    service=st.sampled_from(["S", "T"]),
    bi=st.sampled_from([None, *IDS, B3]),
    cid=st.text(max_size=40),
    now=st.floats(0, 20),
    local=st.booleans(),
)
def test_match_is_deterministic_and_every_route_is_live_and_obeys_its_steps_rule(
    table, offered, service, bi, cid, now, local
):
    hook = None if offered is None else (lambda s, b: offered)

    def run(routes):
        return match(routes, service, bi, cid, now, local_broker_id=LOCAL_ID, dynamic=hook)

    result = run(table)
    assert result == run(table) == run(list(reversed(table)))
    assert choose(result, service_is_local=local) == choose(run(table), service_is_local=local)
    assert all(r.live(now) for r in result.routes)
    live = [r for r in table if r.live(now)]
    rules = {
        1: lambda r: bi is not None and r.service_name == service and r.broker_instance == bi,
        2: lambda r: r.service_name == service and r.broker_instance is None,
        3: lambda r: (
            bi is None
            and r.service_name == service
            and r.broker_instance is not None
            and not r.draining
        ),
        5: lambda r: r.service_name is None and r.broker_instance is None,
    }
    for step, rule in rules.items():  # no earlier step could have matched
        if step < result.step:
            assert not any(rule(r) for r in live)
    if result.step in rules:
        assert result.routes and all(rules[result.step](r) for r in result.routes)
        assert all(r in table for r in result.routes)
    if result.step == 3:
        assert {r.broker_instance for r in result.routes} == {result.broker_instance}
        same = [r for r in live if rules[3](r) and r.broker_instance == result.broker_instance]
        assert sorted(same, key=lambda r: r.name) == list(result.routes)
    if result.step == 4:
        assert all(r in (offered or []) for r in result.routes)
        assert all(r.service_name in (None, service) for r in result.routes)
        assert all(bi is None or r.broker_instance in (None, bi) for r in result.routes)
    if result.step == 6:
        assert bi == LOCAL_ID and [r.address for r in result.routes] == ["LOCAL"]
    if result.step == 7:
        assert result.routes == () and result.reason
        assert bi != LOCAL_ID
    picked = balance(table, service, now, len(cid))
    if picked is not None:  # a dialog pinned at BEGIN matches its broker's routes at step 1
        if bi is None:
            assert result.step == 3
        pinned = match(table, service, picked, cid, now, local_broker_id=LOCAL_ID)
        assert pinned.step == 1 and {r.broker_instance for r in pinned.routes} == {picked}
    hops = choose(result, service_is_local=local)
    assert len({h.address for h in hops}) == len(hops)
    assert local or "LOCAL" not in addresses(hops)
