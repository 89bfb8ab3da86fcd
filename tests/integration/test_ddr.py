"""Data-dependent routing on a real Ray: the sales-by-region topology of seed 000. Initiator
brokers (three where several shops matter) talk to three replicated router brokers, which talk
to four regional sales services, each on its own broker. Every order reaches its region; every
reply returns to its initiator, in order, once; replicas come, go and die while orders flow."""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
import ray

from actors import Activation, Begin, Contract, MessageType, Queue, Send, Service, start_broker
from actors.ddr import RouterConfig, begin_redirected
from actors.errors import InvalidDefinition
from actors.model.catalog import END_DIALOG, ERROR, REDIRECT
from actors.remote.client import Broker
from actors.remote.routers import ROUTER_QUEUE, RouterSet
from tests.integration.conftest import TEST_CODE
from tests.polling import wait_until

REGIONS = ("EU", "US", "APAC", "LATAM")
REPLY = "tests.integration.activation_handlers:reply_to_orders"


def define_sales(b, *, target: str | None = None) -> None:
    b.create(MessageType("Order", "json"))
    b.create(MessageType("Reply"))
    b.create(Contract("Sales", {"Order": "initiator", "Reply": "target"}))
    if target is None:
        b.create(Queue("StoreQ"))
        b.create(Service("Store", "StoreQ"))
    else:
        act = Activation(REPLY, placement="internal", max_readers=2, idle_timeout=10.0)
        b.create(Queue(f"{target}Q", activation=act))
        b.create(Service(target, f"{target}Q", ["Sales"]))


@pytest.fixture(scope="module")
def regions(ray_session, tmp_path_factory) -> Iterator[dict[str, Broker]]:
    """The 4 regional targets, started once for the module's tests (4 broker starts per test
    were most of each test's setup). Each test brings its own shops and router set, and reads a
    target's views only about its own dialogs."""
    folder = tmp_path_factory.mktemp("regions")
    tag = uuid.uuid4().hex[:6]
    targets = {}
    for r in REGIONS:
        b = start_broker(
            f"sales{r}-{tag}",
            str(folder / f"sales{r}.sqlite"),
            limits={"code_modules": list(TEST_CODE)},
        )
        define_sales(b, target=f"Sales{r}")
        targets[f"Sales{r}"] = b
    yield targets
    for b in targets.values():
        b.stop()


@pytest.fixture
def sales(make_broker, regions, tmp_path, request):
    """One initiator (or as many as the test's indirect parameter says), the 4 regional targets;
    the router set is the test's to start."""
    tag = uuid.uuid4().hex[:6]
    shops = getattr(request, "param", 1)
    initiators = [make_broker(name=f"shop{i}-{tag}") for i in range(shops)]
    for b in initiators:
        define_sales(b)
    targets = dict(regions)
    sets: list[RouterSet] = []

    def router_set(mode: str = "forward", replicas: int = 3, **kw) -> RouterSet:
        config = RouterConfig(
            "SalesRouter",
            tuple(targets),
            "actors.ddr.classifiers:field",
            mode,
            {"template": "Sales{value}"},
        )
        rs = RouterSet(
            f"router-{tag}",
            config,
            store_dir=str(tmp_path),
            initiators=initiators,
            initiator_services=["Store"],
            targets=targets,
            **kw,
        ).start(replicas)
        sets.append(rs)
        return rs

    yield initiators, targets, router_set
    for rs in sets:
        rs.stop()


def place_orders(shop, n: int, lines: int = 2, first: int = 0) -> dict[str, str]:
    """n orders from one shop, `lines` Order messages each; {handle: region}."""
    regions = {}
    ops = []
    for i in range(first, first + n):
        region = REGIONS[i % len(REGIONS)]
        op = Begin("Store", "SalesRouter", "Sales", encryption=False)
        bodies = [
            json.dumps({"region": region, "order": i, "line": k}).encode() for k in range(lines)
        ]
        ops += [op, Send(op.handle, "Order", bodies)]
        regions[op.handle] = region
    for k in range(0, len(ops), 200):
        shop.apply(ops[k : k + 200])
    return regions


def collect(shop, expected: int, got: dict[str, list], timeout: float = 120.0) -> dict:
    def enough():
        for g in shop.receive("StoreQ", max_groups=100, wait=0.2):
            for m in g.messages:
                got.setdefault(m.conversation_handle, []).append(m)
            shop.commit(g)
        return sum(len(v) for v in got.values()) >= expected

    wait_until(enough, timeout=timeout, what=f"{expected} replies")
    return got


def check_replies(regions: dict[str, str], got: dict[str, list], lines: int) -> None:
    assert set(got) == set(regions)
    for handle, msgs in got.items():
        bodies = [json.loads(m.body) for m in msgs]
        assert [b["line"] for b in bodies] == list(range(lines)), "in order, once"
        assert {b["region"] for b in bodies} == {regions[handle]}


@pytest.mark.slow
@pytest.mark.parametrize("sales", [3], indirect=True, ids=["three-shops"])
def test_hundreds_of_orders_reach_their_regions_and_every_reply_returns_in_order_once(sales):
    initiators, targets, router_set = sales
    rs = router_set()
    orders = [place_orders(shop, 100, first=100 * i) for i, shop in enumerate(initiators)]

    for shop, regions in zip(initiators, orders, strict=True):
        check_replies(regions, collect(shop, 200, {}), lines=2)
    views = rs.view()
    per_replica = {n: v["routed"] for n, v in views.items()}
    assert sum(per_replica.values()) == 300
    # replies to a known pair pass straight across at arrival (Begin.relays), and every message
    # a replica took, through its queue or straight across, is in its audit once
    assert sum(v["passed_through"] for v in views.values()) > 0
    ids = [
        r["message_id"]
        for b in rs.replicas.values()
        for r in b.audit(limit=100_000)["records"]
        if r["queue"] == ROUTER_QUEUE
    ]
    assert len(ids) == len(set(ids)) == 300 * 2 * 2  # each order's 2 lines and 2 replies
    # round-robin per new dialog on each shop: each shop's 100 dialogs split 34/33/33
    assert max(per_replica.values()) - min(per_replica.values()) <= len(initiators), per_replica
    for r in REGIONS:  # each region's service saw only its orders
        audit = targets[f"Sales{r}"].audit(limit=100_000)["records"]
        assert audit and all(
            json.loads(rec["body"])["region"] == r for rec in audit if "body" in rec
        )


def from_replicas(target: Broker, rs: RouterSet) -> list[dict]:
    """The target's endpoints of dialogs that router set's replicas began."""
    ids = {b.info()["broker_id"] for b in rs.replicas.values()}
    return [e for e in target.endpoints() if not e["is_initiator"] and e["far_broker"] in ids]


def test_an_end_and_an_error_pass_through_the_router_both_ways(sales):
    initiators, targets, router_set = sales
    rs = router_set(replicas=1)
    shop = initiators[0]
    eu, us = targets["SalesEU"], targets["SalesUS"]
    (h_end,) = place_orders(shop, 1, lines=1)  # EU
    (h_err,) = place_orders(shop, 1, lines=1, first=1)  # US
    collect(shop, 2, {})

    shop.end_conversation(h_end)  # the initiator ends: the router ends the dialog to SalesEU
    wait_until(
        lambda: [e["state"] for e in from_replicas(eu, rs)] == ["DISCONNECTED_INBOUND"],
        what="the end to reach SalesEU",
    )
    (target,) = [e["conversation_handle"] for e in from_replicas(us, rs)]
    us.end_conversation(target, error=4711, description="out of stock")  # the target fails

    def error_back():
        for g in shop.receive("StoreQ", max_groups=10):
            shop.commit(g)
            for m in g.messages:
                if m.message_type == ERROR and m.conversation_handle == h_err:
                    return m
        return None

    err = wait_until(error_back, what="the wrapped error at the initiator")
    assert err.error[0] == 4711 and "out of stock" in err.error[1] and "SalesRouter" in err.error[1]


def test_redirect_mode_names_the_service_and_the_initiator_talks_to_it_directly(sales):
    initiators, targets, router_set = sales
    rs = router_set(mode="redirect", replicas=2)
    shop = initiators[0]
    body = json.dumps({"region": "APAC", "order": 2, "line": 0}).encode()

    handle, service = begin_redirected(
        shop, "Store", "StoreQ", "SalesRouter", "Sales", "Order", body, encryption=False
    )

    assert service == "SalesAPAC"
    (reply,) = collect(shop, 1, {})[handle]
    assert json.loads(reply.body)["region"] == "APAC"
    apac = targets["SalesAPAC"]
    conversation = {e["conversation_handle"]: e["conversation_id"] for e in shop.endpoints()}
    [direct] = [e for e in apac.endpoints() if e["conversation_id"] == conversation[handle]]
    assert direct["far_service"] == "Store"  # the target talks to the shop itself
    assert direct["far_broker"] == shop.info()["broker_id"]
    assert from_replicas(apac, rs) == []  # and no replica began a dialog with it
    assert all(v["mappings"] == [] for v in rs.view().values())


def test_a_running_router_set_takes_a_new_mode_and_refuses_a_classifier_that_does_not_import(
    sales,
):
    initiators, targets, router_set = sales
    rs = router_set(replicas=1)
    shop = initiators[0]
    with pytest.raises(InvalidDefinition, match="router classifier"):
        rs.reconfigure(classifier="no.such:classifier")
    rs.reconfigure(mode="redirect")

    (h,) = place_orders(shop, 1, lines=1)

    assert [m.message_type for m in collect(shop, 2, {})[h]] == [REDIRECT, END_DIALOG]
    assert rs.config.mode == "redirect"


@pytest.mark.slow
def test_replicas_can_be_added_and_removed_while_orders_flow(sales):
    initiators, targets, router_set = sales
    rs = router_set(replicas=2)
    shop = initiators[0]
    regions = place_orders(shop, 60)
    added = rs.add_replica()
    regions |= place_orders(shop, 60, first=60)
    leaving = next(iter(rs.replicas))
    removal = threading.Thread(target=rs.remove_replica, args=(leaving,))
    removal.start()  # it drains: new dialogs go elsewhere, its open dialogs finish first
    wait_until(
        lambda: any(r["draining"] for r in shop.routes() if leaving in r["address"]),
        what="the leaving replica's route to drain",
    )
    leaving_id = rs.replicas[leaving].info()["broker_id"]
    later = place_orders(shop, 60, first=120)
    got = collect(shop, 2 * 180, {})
    check_replies(regions | later, got, lines=2)
    far = {e["conversation_handle"]: e["far_broker"] for e in shop.endpoints()}
    assert leaving_id not in {far[h] for h in later}  # no new dialog went to it
    for handle in got:  # the shop finishes its dialogs; the leaving replica can now stop
        shop.end_conversation(handle)

    removal.join(timeout=120)
    assert not removal.is_alive() and leaving not in rs.replicas
    assert added.name in rs.replicas and rs.view()[added.name]["routed"] > 0


@pytest.mark.slow
def test_a_router_replica_killed_mid_stream_loses_and_doubles_nothing(sales):
    initiators, targets, router_set = sales
    rs = router_set(replicas=3)
    shop = initiators[0]
    regions = place_orders(shop, 150, lines=4)
    victim = next(iter(rs.replicas.values()))
    wait_until(lambda: victim.queues()[ROUTER_QUEUE]["depth"] >= 0, what="the victim running")
    ray.kill(victim.actor, no_restart=False)  # Ray restarts it; its mappings are in its store

    check_replies(regions, collect(shop, 600, {}, timeout=180), lines=4)
    assert victim.info()["name"] == victim.name  # it came back


def test_three_thousand_dialogs_spread_evenly_over_three_replicas(sales):
    initiators, targets, router_set = sales
    rs = router_set(replicas=3)
    ids = {n: b.info()["broker_id"] for n, b in rs.replicas.items()}
    shop = initiators[0]
    ops = [Begin("Store", "SalesRouter", "Sales", encryption=False) for _ in range(3000)]
    for k in range(0, 3000, 500):
        shop.apply(ops[k : k + 500])
    far = Counter(e["far_broker"] for e in shop.endpoints() if e["far_service"] == "SalesRouter")
    counts = [far[bid] for bid in ids.values()]
    assert sum(counts) == 3000
    assert max(abs(c - 1000) for c in counts) <= 50, counts  # within 5% of even


@pytest.mark.parametrize(
    "classifier, contracts, says",
    [
        ("actors.ddr.classifiers:field", ["DEFAULT"], r"lacks \['Sales'\]"),
        ("no.such:classifier", None, "router classifier"),
    ],
)
def test_a_router_set_that_cannot_serve_its_targets_is_refused(
    sales, tmp_path, classifier, contracts, says
):
    initiators, targets, _ = sales
    config = RouterConfig("SalesRouter", tuple(targets), classifier)
    with pytest.raises(InvalidDefinition, match=says):
        RouterSet(
            "bad",
            config,
            store_dir=str(tmp_path),
            initiators=initiators,
            initiator_services=["Store"],
            targets=targets,
            contracts=contracts,
        )
    assert all(not any("bad" in r["name"] for r in b.routes()) for b in initiators)


@pytest.mark.slow
@pytest.mark.parametrize("sales", [3], indirect=True, ids=["three-shops"])
def test_a_spark_ingest_through_a_router_set_reaches_every_region_in_order_once(spark, sales):
    from pyspark.sql import functions as F

    from spark_bridge import ingest
    from spark_bridge.plan import dialog_id

    initiators, _, router_set = sales
    rs = router_set("forward", replicas=2)
    orders, lines = 120, 3
    df = spark.range(orders * lines).select(
        (F.col("id") / lines).cast("long").alias("order"),
        (F.col("id") % lines).alias("line"),
        F.struct(
            F.element_at(
                F.array(*map(F.lit, REGIONS)), ((F.col("id") / lines) % 4 + 1).cast("int")
            ).alias("region"),
            (F.col("id") / lines).cast("long").alias("order"),
            (F.col("id") % lines).alias("line"),
        ).alias("body"),
    )

    report = ingest(
        df,
        rs,
        from_service="Store",
        contract="Sales",
        message_type="Order",
        body="body",
        key="order",
        order="line",
        progress=False,
        encryption=False,
    )

    assert (report.rows, report.dialogs, report.rejected) == (orders * lines, orders, [])
    got: dict[str, list] = {}
    for shop in initiators:
        collect(shop, 0, got)  # drain what has come back so far
    wait_until(
        lambda: (
            [collect(s, 0, got) for s in initiators]
            and sum(map(len, got.values())) >= orders * lines
        ),
        what="every reply",
    )
    regions = {dialog_id(report.ingest_id, str(i)): REGIONS[i % 4] for i in range(orders)}
    check_replies(regions, got, lines)
