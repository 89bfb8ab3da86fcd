"""Deploying topology files: idempotent, differential (queues, routes, replicas), a dry-run plan
first, teardown; and the sales-by-region topology of seed 000 carrying orders end to end."""

from __future__ import annotations

import json
import uuid

import pytest
import yaml

from actors import Begin, Send
from tests.polling import wait_until
from topologies.commands import status_of
from topologies.deploy import deploy, plan, teardown
from topologies.loader import load

pytestmark = pytest.mark.slow


def write(tmp_path, doc) -> str:
    path = tmp_path / f"t-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def two_brokers(tag: str, queues=("Q1",), route=True) -> dict:
    """a -> b: service S on b reached by a route on a."""
    a, b = f"a-{tag}", f"b-{tag}"
    doc = {
        "brokers": [
            {
                "name": a,
                "storage": f"{a}.sqlite",
                "queues": [{"name": "AQ"}],
                "services": [{"name": "A", "queue": "AQ"}],
            },
            {
                "name": b,
                "storage": f"{b}.sqlite",
                "queues": [{"name": q} for q in queues],
                "services": [{"name": "S", "queue": queues[0], "contracts": ["DEFAULT"]}],
            },
        ]
    }
    if route:
        doc["brokers"][0]["routes"] = [
            {"name": "to-s", "service_name": "S", "address": f"ray://{b}"}
        ]
    return doc


def test_the_same_file_twice_changes_nothing_and_a_changed_file_applies_its_difference(
    ray_session, tmp_path
):
    tag = uuid.uuid4().hex[:6]
    first = load(write(tmp_path, two_brokers(tag)))
    data = str(tmp_path / "data")
    try:
        done = deploy(first, data)
        assert f"started broker a-{tag}" in done.changes
        again = deploy(first, data)
        assert again.changes == [] and plan(first, data) == []

        changed = load(write(tmp_path, two_brokers(tag, queues=("Q1", "Q2"), route=False)))
        planned = plan(changed, data)
        assert planned == [f"b-{tag}: create queue Q2", f"a-{tag}: drop route to-s (routes)"]
        assert [r["name"] for r in done.brokers[f"a-{tag}"].routes()] != ["AutoCreatedLocal"]

        applied = deploy(changed, data)

        assert applied.changes == planned
        assert "Q2" in applied.brokers[f"b-{tag}"].queues()
        assert [r["name"] for r in applied.brokers[f"a-{tag}"].routes()] == ["AutoCreatedLocal"]
        assert plan(changed, data) == []
    finally:
        stopped = teardown(first, data, delete_stores=True)
    assert sorted(stopped) == [f"a-{tag}", f"b-{tag}"]
    assert plan(first, data)[0] == f"start broker a-{tag} ({data}/a-{tag}.sqlite)"


def test_a_deployed_route_carries_a_dialog_to_the_other_broker(ray_session, tmp_path):
    tag = uuid.uuid4().hex[:6]
    topo = load(write(tmp_path, two_brokers(tag)))
    d = deploy(topo, str(tmp_path / "data"))
    try:
        a, b = d.brokers[f"a-{tag}"], d.brokers[f"b-{tag}"]
        op = Begin("A", "S", encryption=False)  # no dialog security in this file
        a.apply([op, Send(op.handle, "DEFAULT", [b"x", b"y"])])

        got = wait_until(lambda: b.receive("Q1", top=10, wait=0.5), what="the messages on b")
        assert [m.body for g in got for m in g.messages] == [b"x", b"y"]
    finally:
        d.stop(delete_stores=True)


@pytest.mark.parametrize(
    "secured, transport",
    [(False, False), (True, False), (True, True)],
    ids=["plain", "dialog-security", "dialog-and-transport-security"],
)
def test_sales_by_region_routes_each_order_to_its_region_and_back(
    ray_session, tmp_path, secured, transport
):
    path = "topologies/sales_by_region.yaml"  # as shipped: dialog and transport security
    if not transport:  # the same file with less of it
        with open(path) as f:
            doc = yaml.safe_load(f)
        assert doc["dialog_security"] is True and doc["transport_security"] is True
        path = write(tmp_path, {**doc, "dialog_security": secured, "transport_security": False})
    topo = load(path)
    d = deploy(topo, str(tmp_path / "data"))
    try:
        shop = d.brokers["shop"]
        ops, regions = [], {}
        for i in range(30):
            region = ("EU", "US", "APAC")[i % 3]
            op = Begin("Store", "SalesRouter", "Sales", encryption=secured)
            ops += [op, Send(op.handle, "Order", json.dumps({"region": region, "n": i}).encode())]
            regions[op.handle] = region
        shop.apply(ops)
        replies: dict[str, list] = {}

        def all_back():
            for g in shop.receive("StoreQ", max_groups=50, wait=0.2):
                for m in g.messages:
                    replies.setdefault(m.conversation_handle, []).append(json.loads(m.body))
                shop.commit(g)
            return sum(map(len, replies.values())) >= 30

        wait_until(all_back, timeout=120, what="a reply to every order")
        assert {h: [r["region"] for r in rs] for h, rs in replies.items()} == {
            h: [region] for h, region in regions.items()
        }
        eu = d.brokers["sales-eu"].audit()["records"]
        assert len(eu) == 10 and {r["to_service"] for r in eu} == {"SalesEU"}
        assert len(d.router_sets["sales-routers"].replicas) == 2
        brokers = [*d.brokers.values(), *d.router_sets["sales-routers"].replicas.values()]
        endpoints = [e for b in brokers for e in b.endpoints()]
        # with dialog security every dialog, the shop's and the routers', crossed sealed
        assert endpoints and {e["secured"] for e in endpoints} == {secured}
        if secured:
            assert oct((tmp_path / "data" / "master.key").stat().st_mode)[-3:] == "600"
        # with transport security every broker takes calls only from the file's others (and
        # the router replicas): none was refused, so every call came signed by one of them
        for b in brokers:
            assert b.info()["limits"].get("transport_security", False) == transport
            assert not [e for e in b.events() if e["kind"] == "TransportRefused"]
    finally:
        d.stop(delete_stores=True)


def test_the_command_line_deploys_shows_status_and_tears_down(ray_session, tmp_path, capsys):
    from actors.tools.cli import main

    tag = uuid.uuid4().hex[:6]
    path = write(tmp_path, two_brokers(tag))
    common = [path, "--data-dir", str(tmp_path / "data")]

    assert main(["deploy", *common, "--dry-run"]) == 0
    assert f"start broker a-{tag}" in capsys.readouterr().out
    assert plan(load(path), str(tmp_path / "data"))[0].startswith("start broker")  # dry: nothing

    assert main(["deploy", *common]) == 0
    assert main(["deploy", *common]) == 0
    assert "0 change(s)" in capsys.readouterr().out.splitlines()[-1]
    assert main(["status", *common, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    b = status["brokers"][f"b-{tag}"]
    assert b["running"] and b["pid"] > 0 and b["uptime_s"] >= 0 and b["node"]
    assert b["queues"]["Q1"]["depth"] == 0

    assert main(["teardown", *common, "--delete-stores"]) == 0
    assert f"stopped a-{tag}, b-{tag}" in capsys.readouterr().out
    assert not status_of(load(path))["brokers"][f"a-{tag}"]["running"]
