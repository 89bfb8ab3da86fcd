"""Dialog security on brokers over Ray (seed 003): initiators, forwarders and targets, each a
broker actor with its SQLite file. A secured dialog's bodies never appear in the forwarder's
files, nor on the far side of any broker but its two endpoints'; a dialog begun with encryption
on waits, saying why, until its far service is bound; a broker that is not granted SEND gets a
typed Error; a hop that changes a body in flight gets it refused and the original delivered
once, a replay nothing; an expired certificate refuses new dialogs; rotation and anonymous
bindings lose and double nothing."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import msgpack
import pytest
import ray

from actors import (
    Begin,
    Certificate,
    End,
    Grant,
    Queue,
    RemoteServiceBinding,
    Send,
    Service,
)
from actors.errors import SecurityError
from actors.security import certificates
from actors.transport.wire import SECURITY_REFUSED
from tests.polling import wait_until

SECRET = b"card 4111-1111-1111-1111, cvv 123"


@pytest.fixture
def three(make_broker, tmp_path):
    """Initiator I (service Shop), forwarder F, target T (service Orders); I routes Orders via
    F, F forwards to T, T answers through F. Every broker has a master key."""
    key = tmp_path / "master.key"
    key.write_bytes(b"the operator's master key, 32 b.")
    limits = {"master_key_file": str(key)}
    tag = uuid.uuid4().hex[:6]
    i, f, t = (make_broker(name=f"{r}-{tag}", limits=limits) for r in ("I", "F", "T"))
    f.configure(forwarding=True)
    for b, svc, contracts in ((i, "Shop", []), (t, "Orders", ["DEFAULT"])):
        b.create(Queue("Q"))
        b.create(Service(svc, "Q", contracts))
    t_id, i_id = t.info()["broker_id"], i.info()["broker_id"]
    i.create_route("ToOrders", "Orders", t_id, f"ray://{f.name}")
    f.create_route("Orders", "Orders", t_id, f"ray://{t.name}", table="instance")
    f.create_route("Shop", "Shop", i_id, f"ray://{i.name}", table="instance")
    t.create_route("ToShop", "Shop", i_id, f"ray://{f.name}")
    return i, f, t, tmp_path


def pem(b, name: str) -> str:
    return next(
        r["certificate"] for k, r in b.definitions() if k == "certificate" and r["name"] == name
    )


def secure(i, t, grant: bool = True) -> None:
    i.create(Certificate("ShopCert", owner="Shop", days=30))
    t.create(Certificate("OrdersCert", owner="Orders", days=30))
    i.create(Certificate("OrdersCert", pem(t, "OrdersCert")))
    t.create(Certificate("ShopCert", pem(i, "ShopCert")))
    i.create(RemoteServiceBinding("ToOrders", "Orders", "OrdersCert"))
    if grant:
        t.create(Grant("ShopMaySend", "Orders", "ShopCert"))


def files_of(b, folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in folder.glob(f"{b.name}.sqlite*"))


@pytest.mark.slow
def test_a_secured_dialog_through_a_forwarder_leaves_no_body_readable_outside_its_ends(three):
    i, f, t, folder = three
    secure(i, t)
    op = Begin("Shop", "Orders", encryption=True)
    i.apply([op, Send(op.handle, "DEFAULT", [SECRET, b"line 2"])])
    [g] = t.receive("Q", wait=20)
    assert [m.body for m in g.messages] == [SECRET, b"line 2"]
    target = g.messages[0].conversation_handle
    t.commit(g, ops=[Send(target, "DEFAULT", b"receipt for " + SECRET), End(target)])
    [r] = i.receive("Q", wait=20)
    assert [m.body for m in r.messages][0] == b"receipt for " + SECRET
    i.commit(r, ops=[End(op.handle)])
    wait_until(lambda: i.transmission_queue() == [] and t.transmission_queue() == [],
               what="both sides' messages acknowledged")  # fmt: skip
    assert f.info()["name"] == f.name  # the forwarder carried it all, and is running
    assert SECRET not in files_of(f, folder)  # its store, WAL included
    assert all("4111" not in str(e) for e in f.events())


@pytest.mark.slow
def test_encryption_on_waits_for_a_binding_and_a_missing_grant_is_a_typed_error(three):
    i, _, t, _ = three
    op = Begin("Shop", "Orders", encryption=True)
    i.apply([op, Send(op.handle, "DEFAULT", [SECRET])])
    wait_until(lambda: "no remote service binding" in str(i.transmission_queue()),
               what="the message to wait with a status naming the binding")  # fmt: skip
    assert t.receive("Q", wait=0) == []
    secure(i, t, grant=False)  # bound now, but Orders does not let ShopCert send
    [err] = i.receive("Q", wait=20)
    code, why = err.messages[0].error
    assert code == SECURITY_REFUSED and "not granted SEND on service 'Orders'" in why
    assert any(e["kind"] == "SecurityRefused" for e in t.events())
    t.create(Grant("ShopMaySend", "Orders", "ShopCert"))
    again = Begin("Shop", "Orders", encryption=True)
    i.apply([again, Send(again.handle, "DEFAULT", [b"second try"])])
    [g] = t.receive("Q", wait=20)
    assert [m.body for m in g.messages] == [b"second try"]


@pytest.mark.slow
def test_a_router_set_carries_secured_dialogs_both_ways(make_broker, tmp_path):
    """A shop, two router replicas in forward mode and two regions, every dialog secured: the
    shop's to a replica (bound to that replica's certificate), the replica's to its region; the
    replies come back sealed the same two ways, each order's in order, once."""
    from actors.ddr import RouterConfig
    from actors.remote.routers import RouterSet
    from tests.integration.conftest import TEST_CODE
    from tests.integration.test_ddr import check_replies, collect, define_sales

    key = tmp_path / "master.key"
    key.write_bytes(b"the operator's master key, 32 b.")
    limits = {"master_key_file": str(key), "code_modules": list(TEST_CODE)}
    tag = uuid.uuid4().hex[:6]
    regions = {}
    for r in ("EU", "US"):
        b = make_broker(name=f"sec-sales{r}-{tag}", limits=limits)
        define_sales(b, target=f"Sales{r}")
        b.create(Certificate(f"Sales{r}Cert", owner=f"Sales{r}"))
        regions[f"Sales{r}"] = b
    shop = make_broker(name=f"sec-shop-{tag}", limits=limits)
    define_sales(shop)
    shop.create(Certificate("StoreCert", owner="Store"))
    config = RouterConfig(
        "SalesRouter", tuple(regions), "actors.ddr.classifiers:field", "forward",
        {"template": "Sales{value}"},
    )  # fmt: skip
    rs = RouterSet(f"sec-router-{tag}", config, store_dir=str(tmp_path), initiators=[shop],
                   initiator_services=["Store"], targets=regions,
                   master_key_file=str(key), dialog_security=True).start(2)  # fmt: skip
    try:
        orders = {}
        for i in range(8):
            region = ("EU", "US")[i % 2]
            op = Begin("Store", "SalesRouter", "Sales", encryption=True)
            lines = [f'{{"region": "{region}", "order": {i}, "line": {k}}}'.encode()
                     for k in range(2)]  # fmt: skip
            shop.apply([op, Send(op.handle, "Order", lines)])
            orders[op.handle] = region
        check_replies(orders, collect(shop, 16, {}), lines=2)
        per_replica = {n: v["routed"] for n, v in rs.view().items()}
        assert sorted(per_replica.values()) == [4, 4]  # both replicas, each bound on its own
        for b in [shop, *rs.replicas.values(), *regions.values()]:
            eps = b.endpoints()
            assert eps and all(e["secured"] for e in eps), (b.name, eps)
    finally:
        rs.stop()


@pytest.mark.slow
def test_a_broker_that_takes_calls_only_from_trusted_brokers_refuses_one_without_connect(
    make_broker, tmp_path
):
    from actors.model.credentials import BROKER

    key = tmp_path / "master.key"
    key.write_bytes(b"the operator's master key, 32 b.")
    tag = uuid.uuid4().hex[:6]
    a = make_broker(name=f"tA-{tag}", limits={"master_key_file": str(key)})
    t = make_broker(name=f"tT-{tag}",
                    limits={"master_key_file": str(key), "transport_security": True})  # fmt: skip
    for b, svc, contracts in ((a, "Shop", []), (t, "Orders", ["DEFAULT"])):
        b.create(Queue("Q"))
        b.create(Service(svc, "Q", contracts))
    a.create_route("ToOrders", "Orders", address=f"ray://{t.name}")
    t.create_route("ToShop", "Shop", a.info()["broker_id"], f"ray://{a.name}")
    h = a.begin_dialog("Shop", "Orders", encryption=False)  # transport security alone
    a.send(h, "DEFAULT", b"first")
    wait_until(lambda: "takes calls only from brokers it trusts" in str(a.transmission_queue()),
               what="the call to be refused for want of trust")  # fmt: skip
    assert t.receive("Q", wait=0) == []
    assert any(e["kind"] == "TransportRefused" for e in t.events())
    a.create(Certificate("ShopBroker", owner=BROKER, days=30))
    t.create(Certificate("ShopBroker", pem(a, "ShopBroker")))
    t.create(Grant("ShopBrokerMayConnect", BROKER, "ShopBroker"))
    [g] = t.receive("Q", wait=20)  # the retransmission, signed and trusted now
    assert [m.body for m in g.messages] == [b"first"]


@ray.remote(num_cpus=0)
class TamperingHop:
    """A route's next hop that is not a broker: it relays every call to broker `target`; armed,
    it flips one byte of the next sealed body it carries. It keeps the first sealed call it
    relayed, to replay it later."""

    def __init__(self, target: str, namespace: str) -> None:
        self.target = ray.get_actor(target, namespace=namespace)
        self.armed = False
        self.first: bytes | None = None

    def arm(self) -> None:
        self.armed = True

    async def deliver(self, blob: bytes) -> bytes:
        bundles = msgpack.unpackb(blob, raw=False)
        sealed = [b for b in bundles if len(b) == 14 and b[13] is not None]
        if sealed and self.first is None:
            self.first = blob
        elif sealed and self.armed:
            self.armed = False
            body = bytearray(sealed[0][13][1])
            body[len(body) // 2] ^= 0x01
            sealed[0][13][1] = bytes(body)
            blob = msgpack.packb(bundles, use_bin_type=True)
        return await self.target.deliver.remote(blob)

    async def replay(self) -> bytes:
        return await self.target.deliver.remote(self.first)


@pytest.fixture
def two(make_broker, tmp_path):
    """I (service Shop) and T (service Orders), each routing to the other directly."""
    key = tmp_path / "master.key"
    key.write_bytes(b"the operator's master key, 32 b.")
    tag = uuid.uuid4().hex[:6]
    i, t = (make_broker(name=f"{r}-{tag}", limits={"master_key_file": str(key)}) for r in "IT")
    for b, svc, contracts in ((i, "Shop", []), (t, "Orders", ["DEFAULT"])):
        b.create(Queue("Q"))
        b.create(Service(svc, "Q", contracts))
    i.create_route("ToOrders", "Orders", t.info()["broker_id"], f"ray://{t.name}")
    t.create_route("ToShop", "Shop", i.info()["broker_id"], f"ray://{i.name}")
    return i, t


def bodies_by_dialog(b, wanted: int, queue: str = "Q") -> dict[str, list[bytes]]:
    """Receive and commit until `wanted` messages came: each dialog's bodies, in order."""
    got: dict[str, list[bytes]] = {}

    def enough() -> bool:
        for g in b.receive(queue, max_groups=10, wait=0.5):
            for m in g.messages:
                got.setdefault(m.conversation_handle, []).append(m.body)
            b.commit(g)
        return sum(map(len, got.values())) >= wanted

    wait_until(enough, timeout=30, what=f"{wanted} messages at {b.name}")
    return got


@pytest.mark.slow
def test_a_body_changed_in_flight_is_refused_the_original_delivered_once_a_replay_not_at_all(
    two,
):
    i, t = two
    secure(i, t)
    name = f"hop-{uuid.uuid4().hex[:6]}"
    hop = TamperingHop.options(name=name, namespace=i.namespace).remote(t.name, t.namespace)
    ray.get(hop.__ray_ready__.remote())
    i.alter_route("ToOrders", address=f"ray://{name}")  # I -> hop -> T; T answers I directly
    h = i.begin_dialog("Shop", "Orders")
    i.send(h, "DEFAULT", b"m0")
    assert list(bodies_by_dialog(t, 1).values()) == [[b"m0"]]
    ray.get(hop.arm.remote())
    i.send(h, "DEFAULT", b"m1: " + SECRET)
    wait_until(lambda: any(e["kind"] == "SecurityRefused" for e in t.events()),
               what="the changed bundle refused")  # fmt: skip
    # the sender had no acknowledgement for it: its retransmission of the original goes once
    assert list(bodies_by_dialog(t, 1).values()) == [[b"m1: " + SECRET]]
    [refused] = [e for e in t.events() if e["kind"] == "SecurityRefused"]
    [endpoint] = t.endpoints()
    assert endpoint["conversation_id"] in refused["detail"]
    ray.get(hop.replay.remote())  # m0's call again, exactly as it first crossed
    assert t.receive("Q", wait=1.0) == []
    wait_until(lambda: i.transmission_queue() == [], what="I's messages acknowledged")
    assert [e["kind"] for e in t.events()].count("SecurityRefused") == 1


@pytest.mark.slow
def test_an_expired_certificate_refuses_new_dialogs_with_a_typed_error_and_an_event(two):
    i, t = two
    secure(i, t)
    before = i.begin_dialog("Shop", "Orders")  # begun while the binding's certificate is valid
    expired, _ = certificates.make("Orders", 1, time.time() - 3 * 86400)
    i.create(Certificate("OrdersExpired", expired))
    i.alter("remote_service_binding", "ToOrders", certificate="OrdersExpired")
    with pytest.raises(SecurityError, match=r"expired .*binding 'ToOrders'"):
        i.begin_dialog("Shop", "Orders")
    assert [e["conversation_handle"] for e in i.endpoints()] == [before]
    [event] = [e for e in i.events() if e["kind"] == "SecurityRefused"]
    assert "BEGIN DIALOG" in event["detail"] and "'Orders'" in event["detail"]
    i.send(before, "DEFAULT", b"held")  # its offer would name the expired one: it waits
    wait_until(lambda: "expired" in str(i.transmission_queue()), what="a status naming expiry")
    i.alter("remote_service_binding", "ToOrders", certificate="OrdersCert")
    assert list(bodies_by_dialog(t, 1).values()) == [[b"held"]]


@pytest.mark.slow
def test_rotation_with_dialogs_in_flight_delivers_every_message_once_in_order(two):
    i, t = two
    secure(i, t)
    old = [i.begin_dialog("Shop", "Orders") for _ in range(3)]
    for n in range(20):
        i.apply([Send(h, "DEFAULT", f"old {n}".encode()) for h in old])
        if n == 10:  # the target's successor certificate; the initiator rebinds to it
            t.create(Certificate("OrdersCert2", owner="Orders", days=60))
            i.create(Certificate("OrdersCert2", pem(t, "OrdersCert2")))
            i.alter("remote_service_binding", "ToOrders", certificate="OrdersCert2")
            new = [i.begin_dialog("Shop", "Orders") for _ in range(3)]
        if n > 10:
            i.apply([Send(h, "DEFAULT", f"new {n}".encode()) for h in new])
    got = bodies_by_dialog(t, 3 * 20 + 3 * 9)
    assert sorted(got.values()) == sorted(
        [[f"new {n}".encode() for n in range(11, 20)]] * 3
        + [[f"old {n}".encode() for n in range(20)]] * 3
    )
    assert all(e["secured"] for e in t.endpoints())


@pytest.mark.slow
def test_an_anonymous_binding_secures_a_dialog_from_a_service_without_a_certificate(two):
    i, t = two
    t.create(Certificate("OrdersCert", owner="Orders", days=30))
    i.create(Certificate("OrdersCert", pem(t, "OrdersCert")))
    i.create(RemoteServiceBinding("ToOrders", "Orders", "OrdersCert", anonymous=True))
    t.create(Grant("AnyoneMaySend", "Orders", "public"))
    h = i.begin_dialog("Shop", "Orders")
    i.send(h, "DEFAULT", SECRET)
    assert list(bodies_by_dialog(t, 1).values()) == [[SECRET]]
    assert [e["secured"] for e in t.endpoints()] == [True]
