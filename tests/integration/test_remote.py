"""Brokers talking to brokers on a real Ray: seed 002's examples (load balancing, high
availability through gateways, both combined), forwarding loops, delayed dialogs, TRANSPORT
routes, bad routes, and a target broker killed mid-stream."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import ray

from actors import Begin, End, Queue, Send, Service
from actors.errors import AlreadyExists, InvalidArgument
from tests.polling import wait_until


@pytest.fixture
def brokers(make_broker):
    """Named brokers for one test (names are unique per test, so routes can name them)."""
    made = {}

    def make(*roles: str, forwarding: bool = False):
        out = []
        for role in roles:
            b = make_broker(name=f"{role}-{uuid.uuid4().hex[:6]}")
            if forwarding:
                b.configure(forwarding=True)
            made[role] = b
            out.append(b)
        return out

    return make


def host(b, service: str = "Target", initiator: str = "Init") -> None:
    b.create(Queue("InitQueue"))
    b.create(Queue("TargetQueue"))
    b.create(Service(initiator, "InitQueue"))
    b.create(Service(service, "TargetQueue", ["DEFAULT"]))


def bid(b) -> str:
    return b.info()["broker_id"]


def addr(b) -> str:
    return f"ray://{b.name}"


def drain(b, queue: str = "TargetQueue") -> dict[str, list[int]]:
    """Receive and commit everything waiting; sequence numbers per conversation, in order."""
    seen: dict[str, list[int]] = {}
    while groups := b.receive(queue, max_groups=50):
        for g in groups:
            for m in g.messages:
                seen.setdefault(m.conversation_id, []).append(m.sequence_number)
        b.commit(groups)
    return seen


def sent_out(b) -> bool:
    return b.transmission_queue() == []


def test_a_dialog_crosses_two_brokers_and_replies_come_back(brokers):
    a, t = brokers("A", "T")
    host(a)
    host(t)
    a.create_route("ToTarget", "Target", address=addr(t))
    t.create_route("ToInit", "Init", address=addr(a))
    h = a.begin_dialog("Init", "Target", encryption=False)
    a.apply([Send(h, "DEFAULT", [b"1", b"2", b"3"])])
    [g] = t.receive("TargetQueue", wait=10)
    assert [m.body for m in g.messages] == [b"1", b"2", b"3"]
    target = g.messages[0].conversation_handle
    t.commit(g, ops=[Send(target, "DEFAULT", b"reply"), End(target)])
    [r] = a.receive("InitQueue", wait=10)
    assert [m.message_type for m in r.messages] == ["DEFAULT", "EndDialog"]
    a.commit(r, ops=[End(h)])
    [mine] = [e for e in a.endpoints() if e["conversation_handle"] == h]
    assert mine["far_broker"] == bid(t)  # pinned by the first acknowledgement
    wait_until(
        lambda: {e["state"] for e in t.endpoints()} == {"CLOSED"},
        what="the target endpoint to close when its EndDialog is acknowledged",
    )


def test_deliveries_between_brokers_go_over_a_direct_channel_once_it_is_open(brokers):
    a, t = brokers("A", "T")
    host(a)
    host(t)
    a.create_route("ToTarget", "Target", address=addr(t))
    h = a.begin_dialog("Init", "Target", encryption=False)
    a.apply([Send(h, "DEFAULT", b"0")])  # through Ray; A opens its channel to T meanwhile
    wait_until(lambda: sent_out(a), what="the first message to be delivered")
    # this driver's channel to T, and A's
    wait_until(lambda: t.info()["channels"]["open"] >= 2, what="A's channel to T to open")
    before = t.info()["channels"]["calls"]
    for i in range(1, 6):
        a.apply([Send(h, "DEFAULT", b"%d" % i)])
        wait_until(lambda: sent_out(a), what=f"message {i} to be delivered")
    delivered = t.info()["channels"]["calls"] - before - 1  # (less this info call)
    assert delivered >= 5  # each delivery a call on the channel, none through Ray
    assert list(drain(t).values()) == [[0, 1, 2, 3, 4, 5]]  # once each, in order


def test_load_balancing_splits_dialogs_evenly_and_keeps_each_on_one_broker(brokers):
    a, db_b, db_c = brokers("A", "DatabaseB", "DatabaseC")
    for b in (a, db_b, db_c):
        host(b)
    a.create_route("RouteB", "Target", bid(db_b), addr(db_b))
    a.create_route("RouteC", "Target", bid(db_c), addr(db_c))
    a.create_route("RouteC2", "Target", bid(db_c), addr(db_c) + "")  # a second path to C
    dialogs = [Begin("Init", "Target", encryption=False) for _ in range(1000)]
    a.apply([*dialogs, *(Send(d.handle, "DEFAULT", [b"a", b"b"]) for d in dialogs)])
    wait_until(lambda: sent_out(a), timeout=60, what="everything acknowledged")
    on_b, on_c = drain(db_b), drain(db_c)
    assert len(on_b) + len(on_c) == 1000
    assert len(on_b) == 500  # round-robin per new dialog; the extra route to C does not skew it
    assert not set(on_b) & set(on_c)  # each dialog went to one broker only
    assert all(s == [0, 1] for s in [*on_b.values(), *on_c.values()])


def test_high_availability_through_two_gateways_survives_one_being_killed(brokers):
    a, t = brokers("A", "T")
    gw_a, gw_b = brokers("GatewayA", "GatewayB", forwarding=True)
    host(a)
    host(t)
    for gw in (gw_a, gw_b):
        gw.create_route("ToTarget", "Target", bid(t), addr(t), table="instance")
    a.create_route("ViaA", "Target", bid(t), addr(gw_a))
    a.create_route("ViaB", "Target", bid(t), addr(gw_b))
    handles = a.apply([Begin("Init", "Target", encryption=False) for _ in range(20)])["handles"]
    for n in range(50):
        if n == 20:
            ray.kill(gw_a.actor, no_restart=True)  # one path goes away mid-stream
        a.apply([Send(h, "DEFAULT", b"m") for h in handles])
    wait_until(lambda: sent_out(a), timeout=60, what="everything acknowledged")
    seen = drain(t)
    assert len(seen) == 20 and all(s == list(range(50)) for s in seen.values())


def test_four_gateways_balance_over_two_targets_and_fail_over(brokers):
    a, db_b, db_c = brokers("A", "DatabaseB", "DatabaseC")
    gws = brokers("Gateway1", "Gateway2", "Gateway3", "Gateway4", forwarding=True)
    for b in (a, db_b, db_c):
        host(b)
    for gw, target in zip(gws, (db_b, db_b, db_c, db_c), strict=True):
        gw.create_route("On", "Target", bid(target), addr(target), table="instance")
        a.create_route(f"Via{gw.name}", "Target", bid(target), addr(gw))
    dialogs = [Begin("Init", "Target", encryption=False) for _ in range(200)]
    a.apply(dialogs)
    a.apply([Send(d.handle, "DEFAULT", b"first") for d in dialogs])
    ray.kill(gws[0].actor, no_restart=True)
    a.apply([Send(d.handle, "DEFAULT", b"second") for d in dialogs])
    wait_until(lambda: sent_out(a), timeout=60, what="everything acknowledged")
    on_b, on_c = drain(db_b), drain(db_c)
    assert len(on_b) + len(on_c) == 200 and not set(on_b) & set(on_c)
    assert len(on_b) == 100  # round-robin over the two broker ids, whatever the paths
    assert all(s == [0, 1] for s in [*on_b.values(), *on_c.values()])


def test_a_forwarding_loop_is_cut_by_the_hop_count(brokers):
    a, t = brokers("A", "T")
    f1, f2 = brokers("F1", "F2", forwarding=True)
    host(a)
    host(t)
    f1.create_route("Loop", "Target", address=addr(f2), table="instance")
    f2.create_route("Loop", "Target", address=addr(f1), table="instance")
    a.create_route("ToF1", "Target", address=addr(f1))
    h = a.begin_dialog("Init", "Target", encryption=False)
    a.send(h, "DEFAULT", b"round and round")

    def hop_limit_seen():
        return any(e["kind"] == "HopLimit" for b in (f1, f2) for e in b.events())

    wait_until(hop_limit_seen, timeout=30, what="a HopLimit event")
    [row] = wait_until(
        lambda: [r for r in a.transmission_queue() if "hop limit" in r["transmission_status"]],
        what="the sender to learn why",
    )  # kept, not lost, not delivered
    assert row["attempts"] >= 1
    assert t.queues()["TargetQueue"]["depth"] == 0


def test_a_delayed_dialog_is_delivered_once_a_route_is_created(brokers):
    a, t = brokers("A", "T")
    host(a)
    host(t, service="Remote")
    h = a.begin_dialog("Init", "Remote", encryption=False)
    a.send(h, "DEFAULT", b"wait for me")
    wait_until(
        lambda: "route" in a.transmission_queue()[0]["transmission_status"], what="a delayed status"
    )
    assert t.queues()["TargetQueue"]["depth"] == 0
    a.create_route("ToRemote", "Remote", address=addr(t))
    [g] = t.receive("TargetQueue", wait=30)
    assert g.messages[0].body == b"wait for me"
    wait_until(lambda: sent_out(a), what="the acknowledgement")


def test_a_transport_route_needs_no_return_route_at_the_target(brokers):
    a, t = brokers("A", "T")
    initiator = f"ray://{a.name}/Init"
    host(a, initiator=initiator)
    host(t)
    a.create_route("ToTarget", "Target", address=addr(t))
    t.create_route("Transport", address="TRANSPORT")
    h = a.begin_dialog(initiator, "Target", encryption=False)
    a.send(h, "DEFAULT", b"ping")
    [g] = t.receive("TargetQueue", wait=10)
    t.commit(g, ops=[Send(g.messages[0].conversation_handle, "DEFAULT", b"pong")])
    [r] = a.receive("InitQueue", wait=10)
    assert r.messages[0].body == b"pong"


def test_bad_routes_are_refused_and_leave_the_table_unchanged(brokers):
    [a] = brokers("A")
    a.create_route("R1", "Target", address="LOCAL")
    before = a.routes()
    with pytest.raises(InvalidArgument):
        a.create_route("Bad", "Target", address="tcp://somewhere:4022")
    with pytest.raises(AlreadyExists):
        a.create_route("R1", "Other", address="LOCAL")
    assert a.routes() == before


def test_a_route_to_a_broker_started_later_warns_and_its_messages_go_when_it_starts(
    make_broker, tmp_path
):
    a = make_broker(name=f"A-{uuid.uuid4().hex[:6]}")
    t_name = f"T-{uuid.uuid4().hex[:6]}"  # not started yet
    host(a)
    [warning] = a.create_route("ToTarget", "Target", address=f"ray://{t_name}")
    assert f"broker {t_name!r} is not running yet" in warning
    assert [r["name"] for r in a.routes()] == ["AutoCreatedLocal", "ToTarget"]
    h = a.begin_dialog("Init", "Target", encryption=False)
    a.apply([Send(h, "DEFAULT", [b"1", b"2"])])
    sent_by = time.time()
    status = f"ray://{t_name}: broker {t_name!r} is not running; its messages wait until it starts"
    wait_until(
        lambda: [r["transmission_status"] for r in a.transmission_queue()] == [status] * 2,
        timeout=30,
        what="the messages to wait, saying the broker is not running",
    )

    started = time.time()
    t = make_broker(name=t_name)
    host(t)
    [g] = t.receive("TargetQueue", wait=30)
    assert [m.body for m in g.messages] == [b"1", b"2"]
    # sent when A committed the send, not when they arrived at T (which did not run then)
    assert all(m.sent_at <= sent_by < started <= m.arrived_at for m in g.messages)
    t.commit(g)
    records = t.audit()["records"]
    assert [r["sent_at"] for r in records] == [m.sent_at for m in g.messages]
    wait_until(lambda: sent_out(a), what="the acknowledgement")
    assert a.create_route("Again", "Target", address=addr(t)) == []  # it runs now: no warning


def test_routes_to_one_service_on_different_brokers_without_ids_warn(brokers):
    a, b, c = brokers("A", "B", "C")
    assert a.create_route("ToB", "Target", address=addr(b)) == []
    [warning] = a.create_route("ToC", "Target", address=addr(c))
    assert "Target" in warning and "broker" in warning
    assert any(e["kind"] == "RouteWarning" for e in a.events())


@pytest.mark.slow
def test_killing_the_target_broker_mid_stream_delivers_everything_once_in_order(brokers):
    a, t = brokers("A", "T")
    host(a)
    host(t)
    a.create_route("ToTarget", "Target", address=addr(t))
    handles = a.apply([Begin("Init", "Target", encryption=False) for _ in range(100)])["handles"]
    rounds = 0

    def stream() -> None:
        nonlocal rounds
        for n in range(100):
            a.apply([Send(h, "DEFAULT", str(n).encode()) for h in handles])
            rounds = n + 1

    sender = threading.Thread(target=stream)
    sender.start()
    wait_until(lambda: rounds >= 30, what="a third of the stream")
    pid = t.info()["pid"]
    ray.kill(t.actor, no_restart=False)  # it restarts and reopens its store
    sender.join(timeout=300)
    assert rounds == 100
    wait_until(lambda: sent_out(a), timeout=120, what="every message acknowledged")
    assert t.info()["pid"] != pid
    seen = drain(t)
    assert len(seen) == 100 and all(s == list(range(100)) for s in seen.values())


def test_messages_for_an_unreachable_broker_wait_and_arrive_when_it_returns(make_broker, tmp_path):
    a = make_broker(name=f"A-{uuid.uuid4().hex[:6]}")
    t_name, t_path = f"T-{uuid.uuid4().hex[:6]}", str(tmp_path / "t.sqlite")
    t = make_broker(t_path, name=t_name)
    host(a)
    host(t)
    a.create_route("ToTarget", "Target", address=f"ray://{t_name}")
    ray.kill(t.actor, no_restart=True)  # gone: not restarting
    h = a.begin_dialog("Init", "Target", encryption=False)
    a.apply([Send(h, "DEFAULT", [b"1", b"2"])])

    def waiting_with_reason():
        rows = a.transmission_queue()
        return len(rows) == 2 and all(
            r["transmission_status"].startswith(f"ray://{t_name}: broker {t_name!r} ")
            and r["attempts"] >= 2
            for r in rows
        )

    wait_until(waiting_with_reason, timeout=30, what="the messages to wait, saying why")
    t = make_broker(t_path, name=t_name)  # the same broker (same store) comes back
    [g] = t.receive("TargetQueue", wait=30)
    assert [m.body for m in g.messages] == [b"1", b"2"]
    wait_until(lambda: sent_out(a), what="the acknowledgement")


def test_a_gateway_that_answers_but_cannot_forward_is_failed_over(brokers):
    a, t = brokers("A", "T")
    gw_a, gw_b = brokers("GatewayA", "GatewayB", forwarding=True)
    host(a)
    host(t)
    gw_a.create_route("ToTarget", "Target", bid(t), addr(t), table="instance")
    gw_b.drop_route("AutoCreatedLocal", table="instance")  # up, but has no way to the target
    a.create_route("ViaA", "Target", bid(t), addr(gw_a))
    a.create_route("ViaB", "Target", bid(t), addr(gw_b))
    handles = a.apply([Begin("Init", "Target", encryption=False) for _ in range(20)])["handles"]
    a.apply([Send(h, "DEFAULT", b"m") for h in handles])  # some dialogs try GatewayB first
    wait_until(lambda: sent_out(a), timeout=30, what="everything acknowledged via GatewayA")
    assert len(drain(t)) == 20
