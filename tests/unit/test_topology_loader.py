"""Topology files are checked before anything starts, with errors that say where."""

from __future__ import annotations

import copy
import glob
import math
import sys
import uuid
from typing import Any

import pytest

from actors import LocalBroker, Send
from actors.errors import TopologyError
from actors.model.catalog import Queue, Service
from actors.model.routing import Route, balance, target_hazards
from tests.polling import wait_until
from topologies.loader import load, parse, unsatisfiable


def test_the_priority_example_loads_with_two_activated_queues_of_different_sizes():
    topo = load("topologies/priority.yaml")
    [broker] = topo.brokers
    queues = {d.name: d for d in broker.definitions if isinstance(d, Queue)}
    assert queues["HighPriorityQueue"].activation.max_readers == 4
    assert queues["LowPriorityQueue"].activation.max_readers == 1
    assert {d.name for d in broker.definitions if isinstance(d, Service)} == {
        "Client",
        "HighPriority",
        "LowPriority",
    }


@pytest.mark.parametrize(
    ("doc", "where"),
    [
        ({}, "needs a non-empty list"),
        ({"brokers": [{"name": "b", "colour": "red"}]}, "brokers[0]: unknown key"),
        ({"brokers": [{"name": "b"}, {"name": "b"}]}, "brokers[1].name"),
        (
            {"brokers": [{"name": "b", "services": [{"name": "S", "queue": "Q"}]}]},
            "brokers[0].services[0]: unknown queue 'Q'",
        ),
        (
            {
                "brokers": [
                    {
                        "name": "b",
                        "queues": [{"name": "Q", "activation": {"handler": "no.such:thing"}}],
                    }
                ]
            },
            "brokers[0].queues[0]: handler 'no.such:thing' is in module 'no.such', which this "
            "broker does not allow",
        ),
        (
            {"brokers": [{"name": "b", "queues": [{"name": "Q", "poison_limit": -1}]}]},
            "brokers[0].queues[0]: queue 'Q': poison_limit",
        ),
        ({"brokers": [{"name": "b"}], "router_set": []}, "t.yaml: unknown key(s) ['router_set']"),
        (
            {"brokers": [{"name": "b"}], "dialog_security": {"master_key": "k"}},
            "t.yaml: dialog_security: unknown key(s) ['master_key']",
        ),
        (
            {"brokers": [{"name": "b"}], "dialog_security": {"master_key_file": 7}},
            "dialog_security.master_key_file: is a file's path, not 7",
        ),
        ({"brokers": [{"name": "b"}], "dialog_security": "yes"}, "dialog_security: must be a"),
        (
            {"brokers": [{"name": "b"}], "transport_security": "on"},
            "transport_security: transport_security must be True or False",
        ),
    ],
)
def test_a_bad_topology_is_refused_naming_the_place(doc, where):
    with pytest.raises(TopologyError, match=None) as err:
        parse(doc, "t.yaml")
    assert where in str(err.value)


def test_dialog_security_is_off_unless_the_file_turns_it_on():
    doc = {"brokers": [{"name": "b"}]}
    assert parse(doc).dialog_security is None
    assert parse({**doc, "dialog_security": False}).dialog_security is None
    assert parse({**doc, "dialog_security": True}).dialog_security == {"master_key_file": None}
    on = parse({**doc, "dialog_security": {"master_key_file": "/etc/rb/master.key"}})
    assert on.dialog_security == {"master_key_file": "/etc/rb/master.key"}
    assert (
        not on.transport_security and parse({**doc, "transport_security": True}).transport_security
    )


# --- the shipped files ---------------------------------------------------------------------------

SHIPPED = {  # file: (brokers, routes, router sets, forwarding brokers)
    "topologies/priority.yaml": (1, 0, 0, 0),
    "topologies/load_balancing.yaml": (3, 4, 0, 0),
    "topologies/high_availability.yaml": (4, 8, 0, 2),
    "topologies/load_balancing_ha.yaml": (7, 16, 0, 4),
    "topologies/concentrator.yaml": (5, 8, 0, 1),
    "topologies/sales_by_region.yaml": (4, 0, 1, 0),
}


def resolved(topo, broker: str, table: str = "routes") -> list[Route]:
    """A broker's routes as the deploy would create them, with made-up broker ids."""
    ids = {b.name: str(uuid.uuid5(uuid.NAMESPACE_DNS, b.name)) for b in topo.brokers}
    out = []
    for r in topo.broker(broker).routes:
        if r.table == table:
            args = r.arguments(ids)
            del args["table"], args["lifetime"]
            out.append(Route(**args))
    return out


@pytest.mark.parametrize("path", sorted(glob.glob("topologies/*.yaml")))
def test_every_shipped_topology_loads_with_what_it_declares(path):
    topo = load(path)
    counts = (
        len(topo.brokers),
        sum(len(b.routes) for b in topo.brokers),
        len(topo.router_sets),
        sum(b.forwarding for b in topo.brokers),
    )
    assert counts == SHIPPED[path]
    assert topo.source == path
    for b in topo.brokers:  # no seed 002 multiple-target-endpoints hazard in any of them
        for table in ("routes", "instance"):
            assert target_hazards(resolved(topo, b.name, table), now=0.0) == []


def test_the_load_balancing_file_pins_new_dialogs_round_robin_to_both_targets():
    topo = load("topologies/load_balancing.yaml")
    routes = resolved(topo, "lb-initiator")
    picks = [balance(routes, "Target", 0.0, turn) for turn in range(4)]
    ids = sorted({r.broker_instance for r in routes})
    assert len(ids) == 2 and picks == [ids[0], ids[1], ids[0], ids[1]]


def test_the_gateway_files_give_two_paths_to_each_target_broker():
    topo = load("topologies/load_balancing_ha.yaml")
    by_id: dict[str, set[str]] = {}
    for r in resolved(topo, "lbha-initiator"):
        by_id.setdefault(r.broker_instance, set()).add(r.address)
    assert sorted(len(paths) for paths in by_id.values()) == [2, 2]
    ha = load("topologies/high_availability.yaml")
    assert {r.broker_of for r in ha.broker("ha-initiator").routes} == {"ha-target"}
    assert all(b.forwarding for b in ha.brokers if b.name.startswith("ha-gateway"))


def test_a_route_names_its_target_broker_and_the_deploy_puts_in_its_id():
    topo = load("topologies/concentrator.yaml")
    [route] = topo.broker("cc-shop-1").routes
    assert (route.broker_instance, route.broker_of) == ("cc-fulfilment", "cc-fulfilment")
    args = route.arguments({"cc-fulfilment": "0" * 8 + "-0000-0000-0000-" + "0" * 12})
    assert args["broker_instance"] == "00000000-0000-0000-0000-000000000000"
    assert args["address"] == "ray://cc-concentrator" and args["table"] == "routes"
    assert topo.broker("cc-concentrator").limits == {"forward_buffer": 100000}


def test_the_sales_file_declares_a_router_set_whose_classifier_picks_a_region():
    topo = load("topologies/sales_by_region.yaml")
    [rs] = topo.router_sets
    assert (rs.name, rs.service, rs.replicas, rs.readers, rs.mode) == (
        "sales-routers",
        "SalesRouter",
        2,
        2,
        "forward",
    )
    assert rs.targets == {"SalesEU": "sales-eu", "SalesUS": "sales-us", "SalesAPAC": "sales-apac"}
    assert (rs.initiators, rs.initiator_services, rs.contracts) == (("shop",), ("Store",), None)
    classify = rs.config.check_classifier()
    options = {"targets": list(rs.config.targets), **rs.classifier_options}
    assert classify(b'{"region": "APAC"}', "Order", options) == "SalesAPAC"


def test_a_regional_sales_broker_replies_in_kind(tmp_path):
    """The sales file's regional catalog, with its activated reply_in_kind, on a LocalBroker."""
    topo = load("topologies/sales_by_region.yaml")
    with LocalBroker("sales-unit", str(tmp_path / "s.sqlite")) as b:
        for defn in topo.broker("sales-eu").definitions:
            b.create(defn)
        b.create(Queue("StoreQ"))
        b.create(Service("Store", "StoreQ"))
        h = b.begin_dialog("Store", "SalesEU", "Sales")
        b.apply([Send(h, "Order", [b'{"region": "EU", "n": 1}', b'{"region": "EU", "n": 2}'])])
        replies: list[Any] = []

        def two_replies():
            for g in b.receive("StoreQ", wait=0.1) or []:
                replies.extend((m.message_type, m.body) for m in g.messages)
                b.commit(g)
            return len(replies) >= 2

        wait_until(two_replies)
        assert replies == [
            ("Reply", b'{"region": "EU", "n": 1}'),
            ("Reply", b'{"region": "EU", "n": 2}'),
        ]


# --- bad brokers: placement, forwarding, limits, routes ------------------------------------------


def two(first: dict[str, Any], second: dict[str, Any] | None = None) -> dict[str, Any]:
    """Broker a (service A on queue QA) and broker b (service B), with extra fields each."""
    a = {"name": "a", "queues": [{"name": "QA"}], "services": [{"name": "A", "queue": "QA"}]}
    b = {"name": "b", "queues": [{"name": "QB"}], "services": [{"name": "B", "queue": "QB"}]}
    return {"brokers": [{**a, **first}, {**b, **(second or {})}]}


def routes(*rs: dict[str, Any], forwarding: bool = False) -> dict[str, Any]:
    """Broker a with these routes (and broker b beside it)."""
    return two({"routes": list(rs), "forwarding": forwarding})


R1 = {"name": "r1", "service_name": "B", "address": "ray://b"}


@pytest.mark.parametrize(
    ("doc", "where"),
    [
        pytest.param(
            two({"placement": {"resources": {"gateway": -1}}}),
            "t.yaml: brokers[0].placement.resources.gateway: an amount is a finite number > 0",
            id="negative amount",
        ),
        pytest.param(
            two({"placement": {"resources": {"gateway": math.inf}}}),
            "brokers[0].placement.resources.gateway: an amount is a finite number",
            id="infinite amount",
        ),
        pytest.param(
            two({"placement": {"resources": {"gateway": "one"}}}),
            "brokers[0].placement.resources.gateway: an amount is a finite number",
            id="amount not a number",
        ),
        pytest.param(
            two({"placement": {"resources": {"gateway": 1.5}}}),
            "brokers[0].placement.resources.gateway: an amount above 1 must be a whole number",
            id="fractional amount above one",
        ),
        pytest.param(
            two({"placement": {"resources": {"CPU": 1}}}),
            "brokers[0].placement.resources.CPU: a broker needs no CPU",
            id="CPU",
        ),
        pytest.param(
            two({"placement": {"resources": {3: 1}}}),
            "brokers[0].placement.resources: a resource name is a non-empty string",
            id="resource name not a string",
        ),
        pytest.param(
            two({"placement": {"resources": [1]}}),
            "brokers[0].placement.resources: must be a mapping",
            id="resources not a mapping",
        ),
        pytest.param(
            two({"placement": {"node_labels": {"zone": 1}}}),
            "brokers[0].placement.node_labels.zone: a label value is a string (quote it)",
            id="label value not a string",
        ),
        pytest.param(
            two({"placement": {"nodes": 2}}),
            "brokers[0].placement: unknown key(s) ['nodes']",
            id="unknown placement key",
        ),
        pytest.param(
            two({"forwarding": "yes please"}),
            "brokers[0].forwarding: forwarding must be True or False",
            id="forwarding not a bool",
        ),
        pytest.param(
            two({"limits": {"max_body_bytes": 0}}),
            "brokers[0].limits.max_body_bytes: limit max_body_bytes must be an int",
            id="bad limit value",
        ),
        pytest.param(
            two({"limits": {"retry_max_s": math.nan}}),
            "brokers[0].limits.retry_max_s: limit retry_max_s must be a finite",
            id="bad retry limit",
        ),
        pytest.param(
            two({"limits": {"colour": 1}}),
            "brokers[0].limits.colour: unknown limit(s) ['colour']",
            id="unknown limit",
        ),
        pytest.param(
            two({"limits": {"retry_min_s": 10, "retry_max_s": 1}}),
            "brokers[0].limits: limit retry_min_s (10.0) must not exceed retry_max_s",
            id="limits inconsistent together",
        ),
        pytest.param(
            two({}, {"routes": [{**R1, "address": "tcp://b:4022"}]}),
            "t.yaml: brokers[1].routes[0].address: route address 'tcp://b:4022' is not valid",
            id="address does not parse",
        ),
        pytest.param(
            routes({**R1, "address": "ray://nope"}),
            "brokers[0].routes[0].address: route r1 sends to ray://nope, which no broker in this "
            "file declares",
            id="address names no broker of the file",
        ),
        pytest.param(
            routes(
                {**R1, "broker_instance": "b", "address": "ray://a", "mirror_address": "ray://x"}
            ),
            "brokers[0].routes[0].mirror_address: route r1 sends to ray://x, which no broker",
            id="mirror names no broker of the file",
        ),
        pytest.param(
            routes({**R1, "mirror_address": "LOCAL"}),
            "brokers[0].routes[0]: route 'r1': a mirror pairs two brokers",
            id="mirror not a broker address",
        ),
        pytest.param(
            routes({**R1, "service_name": "Nope"}),
            "brokers[0].routes[0].service_name: route r1: unknown service 'Nope'",
            id="unknown service",
        ),
        pytest.param(
            routes(R1, {**R1, "address": "ray://a"}),
            "brokers[0].routes[1].name: route 'r1' is already in table 'routes' (routes[0])",
            id="duplicate route name",
        ),
        pytest.param(
            routes({**R1, "lifetime": -1}),
            "brokers[0].routes[0].lifetime: lifetime must be a finite number of seconds > 0",
            id="negative lifetime",
        ),
        pytest.param(
            routes({**R1, "lifetime": math.inf}),
            "brokers[0].routes[0].lifetime: lifetime must be",
            id="infinite lifetime",
        ),
        pytest.param(
            routes({**R1, "lifetime": "1h"}),
            "brokers[0].routes[0].lifetime: lifetime must be",
            id="lifetime not a number",
        ),
        pytest.param(
            routes({**R1, "draining": "no"}),
            "brokers[0].routes[0].draining: draining must be True or False",
            id="draining not a bool",
        ),
        pytest.param(
            routes({**R1, "table": "msdb"}),
            "brokers[0].routes[0].table: table is 'routes' or 'instance', not 'msdb'",
            id="unknown table",
        ),
        pytest.param(
            routes({**R1, "table": "instance"}),
            "brokers[0].routes[0]: an instance route to ray://b relays arriving messages, which "
            "broker 'a' does only with `forwarding: true`",
            id="instance route without forwarding",
        ),
        pytest.param(
            routes({**R1, "name": "AutoCreatedLocal"}),
            "brokers[0].routes[0].name: AutoCreatedLocal is built into every route table",
            id="the built-in route's name",
        ),
        pytest.param(
            routes({**R1, "name": True}),
            "brokers[0].routes[0].name: route name True is a boolean; quote the name",
            id="name read as a boolean",
        ),
        pytest.param(
            routes({**R1, "broker_instance": "nope"}),
            "brokers[0].routes[0].broker_instance: 'nope' is neither a broker in this file nor "
            "a broker id",
            id="broker instance neither a name nor an id",
        ),
        pytest.param(
            routes({**R1, "broker_instance": "a"}),
            "brokers[0].routes[0].broker_instance: route r1 sends service 'B' to broker 'a', "
            "which does not define it",
            id="broker instance that lacks the service",
        ),
        pytest.param(
            routes({"name": "r1", "broker_instance": "b", "address": "ray://b"}),
            "brokers[0].routes[0]: route 'r1' gives a broker instance but no service name",
            id="broker instance without a service",
        ),
        pytest.param(
            routes({**R1, "via": "b"}),
            "brokers[0].routes[0]: unknown key(s) ['via']",
            id="unknown route key",
        ),
        pytest.param(
            two({"routes": {"r1": R1}}),
            "brokers[0].routes: must be a list",
            id="routes not a list",
        ),
    ],
)
def test_a_bad_broker_setting_or_route_is_refused_naming_the_place(doc, where):
    with pytest.raises(TopologyError) as err:
        parse(doc, "t.yaml")
    assert where in str(err.value)


def test_good_routes_load_with_their_fields():
    topo = parse(
        routes(
            {**R1, "broker_instance": "b", "lifetime": 60, "draining": True},
            {**R1, "table": "instance"},  # the same name, in the other table
            {"name": "uuid", "service_name": "B", "broker_instance": str(uuid.UUID(int=7)).upper()},
            forwarding=True,
        ),
        "t.yaml",
    )
    first, other, by_id = topo.broker("a").routes
    assert (first.broker_of, first.lifetime, first.draining) == ("b", 60.0, True)
    assert (other.table, other.address) == ("instance", "ray://b")
    assert (by_id.broker_of, by_id.broker_instance) == (None, str(uuid.UUID(int=7)))


# --- router sets -------------------------------------------------------------------------------


def region(name: str, service: str, **contract: str) -> dict[str, Any]:
    messages = contract or {"Order": "initiator", "Reply": "target"}
    return {
        "name": name,
        "message_types": [{"name": "Order", "validation": "json"}, {"name": "Reply"}],
        "contracts": [{"name": "Sales", "messages": messages}],
        "queues": [{"name": "SalesQ"}],
        "services": [{"name": service, "queue": "SalesQ", "contracts": ["Sales"]}],
    }


def sales(**changes: Any) -> dict[str, Any]:
    """The sales topology as a document, its router set changed by `changes` (None: drop)."""
    shop = region("shop", "Store")
    shop["services"] = [{"name": "Store", "queue": "SalesQ"}]
    rs = {
        "name": "routers",
        "service": "SalesRouter",
        "classifier": "actors.ddr.classifiers:field",
        "classifier_options": {"field": "region", "template": "Sales{value}"},
        "targets": {"SalesEU": "eu", "SalesUS": "us"},
        "replicas": 2,
        "initiators": ["shop"],
        "initiator_services": ["Store"],
    }
    rs.update(changes)
    rs = {k: v for k, v in rs.items() if v is not None}
    doc = {"brokers": [shop, region("eu", "SalesEU"), region("us", "SalesUS")]}
    return copy.deepcopy({**doc, "router_sets": [rs]})


def with_broker(doc: dict[str, Any], broker: dict[str, Any]) -> dict[str, Any]:
    doc["brokers"].append(broker)
    return doc


def without_contracts(doc: dict[str, Any]) -> dict[str, Any]:
    doc["brokers"][0].update(contracts=[], message_types=[])
    return doc


@pytest.mark.parametrize(
    ("doc", "where"),
    [
        pytest.param(
            sales(targets={"SalesEU": "nope"}),
            "t.yaml: router_sets[0].targets.SalesEU: broker 'nope' is not declared in this file",
            id="target broker not declared",
        ),
        pytest.param(
            sales(targets={"SalesXX": "eu"}),
            "router_sets[0].targets.SalesXX: broker 'eu' does not define service 'SalesXX'",
            id="target broker lacks the service",
        ),
        pytest.param(
            sales(targets={}),
            "router_sets[0].targets: a router set needs at least one target service",
            id="no targets",
        ),
        pytest.param(
            sales(initiators=["shop", "nope"]),
            "router_sets[0].initiators[1]: broker 'nope' is not declared in this file",
            id="initiator not declared",
        ),
        pytest.param(
            sales(initiators=["shop", "shop"]),
            "router_sets[0].initiators[1]: broker 'shop' is listed twice",
            id="initiator twice",
        ),
        pytest.param(
            sales(initiators=[]),
            "router_sets[0].initiators: give at least one broker name",
            id="no initiators",
        ),
        pytest.param(
            sales(initiator_services=["Store", "Till"]),
            "router_sets[0].initiator_services[1]: initiator broker 'shop' does not define "
            "service 'Till'",
            id="initiator lacks its service",
        ),
        pytest.param(
            sales(replicas=0),
            "router_sets[0].replicas: replicas must be an int from 1",
            id="no replicas",
        ),
        pytest.param(
            sales(replicas=1.5),
            "router_sets[0].replicas: replicas must be an int",
            id="fractional replicas",
        ),
        pytest.param(
            sales(readers=True),
            "router_sets[0].readers: readers must be an int",
            id="readers a bool",
        ),
        pytest.param(
            sales(mode="broadcast"),
            "router_sets[0].mode: mode is one of ['forward', 'redirect'], not 'broadcast'",
            id="unknown mode",
        ),
        pytest.param(
            sales(classifier="classify_by_region"),
            "router_sets[0].classifier: give 'module:function', not 'classify_by_region'",
            id="classifier without a function",
        ),
        pytest.param(
            sales(classifier="my classifiers:by region"),
            "router_sets[0].classifier: give 'module:function'",
            id="classifier not identifiers",
        ),
        pytest.param(
            sales(classifier_options=["region"]),
            "router_sets[0].classifier_options: must be a mapping",
            id="options not a mapping",
        ),
        pytest.param(
            sales(classifier_options={"weight": math.nan}),
            "router_sets[0].classifier_options: must be JSON-able",
            id="options not JSON",
        ),
        pytest.param(
            sales(contracts=["DEFAULT"]),
            "router_sets[0].contracts: router set 'routers': the routing service must accept the "
            "union of its targets' contracts; it lacks ['Sales']",
            id="contracts not covered",
        ),
        pytest.param(
            sales(contracts=["Sales", "Returns"]),
            "router_sets[0].contracts: router set 'routers': contract 'Returns' is no target "
            "service's",
            id="contract no target has",
        ),
        pytest.param(
            without_contracts(sales()),
            "router_sets[0].initiators[0]: broker 'shop' does not define contract 'Sales'",
            id="initiator lacks the contract",
        ),
        pytest.param(
            with_broker(
                sales(targets={"SalesEU": "eu", "SalesUS": "us", "SalesAPAC": "apac"}),
                region("apac", "SalesAPAC", Order="initiator", Reply="any"),
            ),
            "router_sets[0].targets.SalesAPAC: Contract 'Sales' on broker 'apac' differs from "
            "its definition on broker 'eu'",
            id="contract defined differently",
        ),
        pytest.param(
            sales(service="Store"),
            "router_sets[0].service: broker 'shop' defines service 'Store' itself",
            id="routing service defined on a broker",
        ),
        pytest.param(
            with_broker(sales(), {"name": "routers-1"}),
            "router_sets[0].name: replica 'routers-1' would take a broker name already in use",
            id="replica name taken",
        ),
        pytest.param(
            sales(name="bad name"),
            "router_sets[0].name: router set name 'bad name' is not valid",
            id="bad name",
        ),
        pytest.param(
            sales(storage_dir=""),
            "router_sets[0].storage_dir: a directory path",
            id="empty storage dir",
        ),
        pytest.param(
            sales(classifier=None),
            "router_sets[0].classifier: give 'module:function', not None",
            id="no classifier",
        ),
        pytest.param(
            sales(partitions=3),
            "router_sets[0]: unknown key(s) ['partitions']",
            id="unknown router set key",
        ),
    ],
)
def test_a_bad_router_set_is_refused_naming_the_place(doc, where):
    with pytest.raises(TopologyError) as err:
        parse(doc, "t.yaml")
    assert where in str(err.value)


def test_two_router_sets_may_not_share_a_name_or_a_service():
    doc = sales()
    doc["router_sets"].append({**doc["router_sets"][0], "service": "Other"})
    with pytest.raises(TopologyError, match=r"router_sets\[1\]\.name: router set 'routers' is"):
        parse(doc, "t.yaml")
    doc["router_sets"][1].update(name="more")
    doc["router_sets"][1]["service"] = "SalesRouter"
    with pytest.raises(TopologyError, match="router_sets.1..service: router set 'routers' routes"):
        parse(doc, "t.yaml")


def test_a_router_set_loads_without_importing_its_classifier_and_routes_may_name_its_service():
    doc = sales(classifier="no_such_package.classifiers:by_region", contracts=["Sales"])
    doc["brokers"][0]["routes"] = [{"name": "ask", "service_name": "SalesRouter"}]
    with pytest.raises(TopologyError, match="router_sets.0..classifier: .* does not allow"):
        parse(doc, "t.yaml")  # a module its replicas do not allow: refused, and not imported
    doc["router_sets"][0]["code_modules"] = ["no_such_package"]
    topo = parse(doc, "t.yaml")
    [rs] = topo.router_sets
    assert rs.classifier == "no_such_package.classifiers:by_region"
    assert rs.contracts == ("Sales",) and rs.storage_dir is None
    assert rs.code_modules == ("no_such_package",) and "no_such_package" not in sys.modules
    assert topo.broker("shop").routes[0].service_name == "SalesRouter"


# --- placement against a cluster's nodes ---------------------------------------------------------


def placed(**placement: Any) -> Any:
    return parse(two({"placement": placement}), "t.yaml")


def test_a_placement_no_node_satisfies_is_named():
    topo = placed(resources={"gateway": 1}, node_labels={"zone": "eu"})
    plain = {"resources": {"CPU": 2.0}, "labels": {}}
    wrong_zone = {"resources": {"CPU": 2.0, "gateway": 1.0}, "labels": {"zone": "us"}}
    [problem] = unsatisfiable(topo, [plain, wrong_zone])
    assert "t.yaml: broker 'a' needs a node with resources {'gateway': 1} and labels" in problem
    assert "none of the cluster's 2 live node(s)" in problem


def test_a_placement_some_node_satisfies_passes():
    topo = placed(resources={"gateway": 0.5}, node_labels={"zone": "eu"})
    fits = {"resources": {"gateway": 1.0}, "labels": {"zone": "eu", "rack": "7"}}
    assert unsatisfiable(topo, [{"resources": {}, "labels": {}}, fits]) == []
    assert unsatisfiable(placed(), []) == []  # no placement: any node, even none yet


def test_ray_nodes_entries_count_only_when_alive():
    topo = placed(resources={"gateway": 1})
    node = {"Alive": True, "Resources": {"gateway": 1.0}, "Labels": {}}
    assert unsatisfiable(topo, [node]) == []
    [problem] = unsatisfiable(topo, [{**node, "Alive": False}])
    assert "broker 'a'" in problem and "0 live node(s)" in problem


def test_targets_on_different_contracts_need_only_their_own_and_initiators_need_all():
    doc = sales()
    us = doc["brokers"][2]
    us["contracts"] = [{"name": "Orders", "messages": {"Order": "initiator", "Reply": "target"}}]
    us["services"][0]["contracts"] = ["Orders"]
    with pytest.raises(TopologyError) as err:
        parse(doc, "t.yaml")
    assert "router_sets[0].initiators[0]: broker 'shop' does not define contract 'Orders'" in str(
        err.value
    )
    doc["brokers"][0]["contracts"].append(us["contracts"][0])
    [rs] = parse(doc, "t.yaml").router_sets
    assert rs.contracts is None and rs.targets == {"SalesEU": "eu", "SalesUS": "us"}
