"""The broker actor on a real Ray: catalog, dialogs, receive/commit, waits, timers, restarts."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import pytest
import ray

from actors import (
    Begin,
    Broker,
    BrokerHandle,
    End,
    LocalBroker,
    MessageType,
    Queue,
    Send,
    Service,
    collector,
    connect,
    start_broker,
    stop_broker,
)
from actors.errors import (
    AlreadyExists,
    BodyTooLarge,
    BrokerUnavailable,
    ContractViolation,
    ConversationEnded,
    ConversationNotFound,
    InUse,
    InvalidArgument,
    InvalidDefinition,
    LockNotHeld,
    QueueDisabled,
    StoreError,
    UnknownContract,
    UnknownMessageType,
    UnknownQueue,
    UnknownService,
    ValidationFailed,
)
from tests.polling import wait_until

from .conftest import define_orders, on_both


def order(n: int) -> bytes:
    return json.dumps({"order": n}).encode()


def line(sku: str, qty: int) -> bytes:
    return json.dumps({"sku": sku, "qty": qty}).encode()


def snapshot(b):
    return b.endpoints(), b.queues(), b.queue("FulfilmentQueue"), b.queue("OrdersQueue")


@pytest.fixture(scope="module")
def orders_broker(make_module_broker) -> Broker:
    """One orders broker (bodies up to 1,000 bytes) for the module's refusals: each test checks
    that what it was refused left the broker as it was."""
    b = make_module_broker(max_body_bytes=1000)
    define_orders(b)
    return b


@pytest.mark.parametrize("handle", [Broker, LocalBroker], ids=["ray", "local"])
def test_both_handles_have_every_verb_of_the_handle_protocol_with_the_same_parameters(handle):
    verbs = [n for n, v in vars(BrokerHandle).items() if callable(v) and not n.startswith("_")]
    assert len(verbs) > 25
    for name in verbs:
        want = list(inspect.signature(getattr(BrokerHandle, name)).parameters)
        assert list(inspect.signature(getattr(handle, name)).parameters) == want, name


# --- catalog ---------------------------------------------------------------------------------


def test_definitions_are_created_listed_altered_and_dropped_on_a_running_broker(broker):
    define_orders(broker)
    kinds = {(k, rec["name"]) for k, rec in broker.definitions()}
    assert ("service", "Fulfilment") in kinds and ("message_type", "Line") in kinds
    broker.alter(Queue, "FulfilmentQueue", poison_limit=2)
    assert broker.queues()["FulfilmentQueue"]["poison_limit"] == 2
    broker.create(Queue("Spare"))
    broker.drop("queue", "Spare")
    assert "Spare" not in broker.queues()


@pytest.mark.parametrize(
    ("definition", "error"),
    [
        (MessageType("Bad", "yaml"), InvalidDefinition),
        (MessageType("Schema", "json_schema", schema={"type": 12}), InvalidDefinition),
        (MessageType("Bytes", "json_schema", schema={"default": b"x"}), InvalidDefinition),
        (MessageType("Set", "json_schema", schema={"enum": {1, 2}}), InvalidDefinition),
        (MessageType("EndDialog"), InvalidDefinition),
        (MessageType("has space"), InvalidDefinition),
        (Service("S", "NoSuchQueue"), UnknownQueue),
        (Service("S", "OrdersQueue", ["NoSuchContract"]), UnknownContract),
        (Queue("Q", poison_limit=-1), InvalidDefinition),
        (Queue("OrdersQueue"), AlreadyExists),
    ],
)
def test_a_bad_definition_is_refused_with_a_typed_error_and_changes_nothing(
    orders_broker, definition, error
):
    before = orders_broker.definitions()
    with pytest.raises(error):
        orders_broker.create(definition)
    assert orders_broker.definitions() == before


def test_dropping_a_definition_in_use_is_refused(broker):
    define_orders(broker)
    with pytest.raises(InUse):
        broker.drop("queue", "FulfilmentQueue")
    with pytest.raises(InUse):
        broker.drop("message_type", "Order")


def test_the_catalog_and_broker_id_survive_a_broker_restart(broker):
    define_orders(broker)
    before = broker.info()
    ray.kill(broker.actor, no_restart=False)
    after = wait_until(
        lambda: (lambda i: i if i["pid"] != before["pid"] else None)(broker.info()),
        what="the broker to restart",
    )
    assert after["broker_id"] == before["broker_id"]
    assert {r["name"] for _, r in broker.definitions()} >= {"Fulfilment", "OrderContract"}


def test_connect_finds_a_running_broker_by_name(broker):
    assert connect(broker.name).info()["broker_id"] == broker.info()["broker_id"]


def test_a_stopped_broker_frees_its_name_and_keeps_its_file(make_broker, tmp_path):
    first = str(tmp_path / "first.sqlite")
    b = make_broker(first)
    b.create(Queue("OldQueue"))
    b.stop()
    with pytest.raises(BrokerUnavailable):
        connect(b.name)
    assert os.path.exists(first)  # stopped, not deleted
    again = make_broker(str(tmp_path / "second.sqlite"), name=b.name)
    assert again.info()["path"] == str(tmp_path / "second.sqlite")
    assert "OldQueue" not in {r["name"] for _, r in again.definitions()}


def test_stop_with_delete_store_removes_the_file_and_its_wal(make_broker, tmp_path):
    path = str(tmp_path / "gone.sqlite")
    b = make_broker(path)
    define_orders(b)
    b.send(b.begin_dialog("Orders", "Fulfilment", "OrderContract"), "Order", order(1))
    assert os.path.exists(path)
    b.stop(delete_store=True)
    assert not [f for f in os.listdir(tmp_path) if f.startswith("gone.sqlite")]


def test_stop_broker_stops_a_broker_by_name(make_broker):
    b = make_broker()
    stop_broker(b.name)
    with pytest.raises(BrokerUnavailable):
        connect(b.name)


@pytest.fixture(scope="module")
def attached(make_module_broker, tmp_path_factory) -> tuple[Broker, dict]:
    """A running broker and the settings it was started with, for the attach refusals."""
    started = {"path": str(tmp_path_factory.mktemp("attach") / "b.sqlite"), "lease_s": 7}
    return make_module_broker(**started), started


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        pytest.param({"path": "other.sqlite"}, "path", id="path"),
        pytest.param({"durability": "full"}, "durability", id="durability"),
        pytest.param({"max_body_bytes": 1000}, "max_body_bytes", id="max_body_bytes"),
        pytest.param({"lease_s": None}, "lease_s the default, it runs with 7", id="lease_s"),
        pytest.param({"forward_buffer": 5}, "forward_buffer", id="forward_buffer"),
    ],
)
def test_attaching_with_other_settings_is_refused(attached, changes, named):
    b, started = attached
    asked = {**started, **changes}
    if "path" in changes:
        asked["path"] = str(Path(started["path"]).with_name(changes["path"]))
    with pytest.raises(InvalidArgument, match=named) as refused:
        start_broker(b.name, **asked)
    assert "already runs with other settings" in str(refused.value)
    assert b.info()["limits"] == {"lease_s": 7}  # the running broker is untouched


def test_attaching_with_the_same_settings_returns_the_running_broker(make_broker, tmp_path):
    settings = {"durability": "full", "max_body_bytes": 4096, "lease_s": 5.0, "forward_buffer": 50}
    b = make_broker(str(tmp_path / "same.sqlite"), **settings)
    b.create(Queue("Kept"))
    again = start_broker(b.name, str(tmp_path / "same.sqlite"), **settings)
    settled = ("uptime_s", "channels")  # the rest is the same process, broker id and settings
    assert {k: v for k, v in again.info().items() if k not in settled} == {
        k: v for k, v in b.info().items() if k not in settled
    }
    assert "Kept" in {r["name"] for _, r in again.definitions()}


def test_an_in_memory_broker_warns_that_a_restart_empties_it(make_broker):
    with pytest.warns(RuntimeWarning, match="a restart empties it"):
        b = make_broker(":memory:")
    assert b.info()["path"] == ":memory:"


# --- dialogs ---------------------------------------------------------------------------------


@on_both
def test_a_dialog_carries_messages_both_ways_in_order_and_ends_on_both_sides(broker):
    define_orders(broker)
    h = broker.begin_dialog("Orders", "Fulfilment", "OrderContract")
    broker.apply([Send(h, "Order", order(1)), Send(h, "Line", [line("a", 1), line("b", 2)])])
    [g] = broker.receive("FulfilmentQueue")
    assert [(m.message_type, m.sequence_number) for m in g.messages] == [
        ("Order", 0),
        ("Line", 1),
        ("Line", 2),
    ]
    target = g.messages[0].conversation_handle
    broker.commit(g, ops=[Send(target, "Ack", b"ok"), End(target)])
    [back] = broker.receive("OrdersQueue")
    assert [m.message_type for m in back.messages] == ["Ack", "EndDialog"]
    assert back.messages[0].conversation_handle == h
    broker.commit(back, ops=[End(h)])
    assert {e["state"] for e in broker.endpoints()} == {"CLOSED"}
    with pytest.raises(ConversationEnded):
        broker.send(h, "Order", order(2))


@on_both
def test_end_with_error_delivers_the_error_to_the_far_side(broker):
    define_orders(broker)
    h = broker.begin_dialog("Orders", "Fulfilment", "OrderContract")
    broker.send(h, "Order", order(1))
    [g] = broker.receive("FulfilmentQueue")
    broker.commit(g, ops=[End(g.messages[0].conversation_handle, 50001, "out of stock")])
    [back] = broker.receive("OrdersQueue")
    assert back.messages[0].error == (50001, "out of stock")


@on_both
def test_end_with_cleanup_removes_the_local_endpoint_only(broker):
    define_orders(broker)
    h = broker.begin_dialog("Orders", "Fulfilment", "OrderContract")
    broker.send(h, "Order", order(1))
    broker.end_conversation(h, cleanup=True)
    handles = {e["conversation_handle"] for e in broker.endpoints()}
    assert h not in handles
    assert broker.queues()["FulfilmentQueue"]["depth"] == 1  # the far side was not told


@on_both
def test_one_message_can_be_sent_on_several_dialogs_at_once(broker):
    define_orders(broker)
    hs = broker.apply([Begin("Orders", "Fulfilment", "OrderContract") for _ in range(3)])
    broker.send(hs["handles"], "Order", order(7))
    groups = broker.receive("FulfilmentQueue", max_groups=10)
    assert len(groups) == 3 and all(g.messages[0].body == order(7) for g in groups)


@pytest.mark.parametrize(
    ("bad_send", "error"),
    [
        (lambda h: Send(h, "Ack", b"x"), ContractViolation),  # the target's message
        (lambda h: Send(h, "Order", b"{not json"), ValidationFailed),
        (lambda h: Send(h, "Line", line("a", 0)), ValidationFailed),  # schema: qty >= 1
        (lambda h: Send(h, "Nope", b""), UnknownMessageType),
        (lambda h: Send("no-such-handle", "Order", order(1)), ConversationNotFound),
        (lambda h: Send(h, "Order", b"[" + b"1," * 600 + b"1]"), BodyTooLarge),
    ],
)
def test_a_bad_send_is_refused_and_leaves_every_queue_and_dialog_as_it_was(
    orders_broker, bad_send, error
):
    b = orders_broker
    h = b.begin_dialog("Orders", "Fulfilment", "OrderContract")
    b.send(h, "Order", order(1))
    before = snapshot(b)
    with pytest.raises(error):
        # a good message first in the same batch: it must be undone too
        b.apply([Send(h, "Order", order(2)), bad_send(h)])
    assert snapshot(b) == before


@on_both
def test_unknown_services_and_contracts_are_refused_when_a_dialog_begins(broker):
    define_orders(broker)
    with pytest.raises(UnknownService):
        broker.begin_dialog("NoSuchService", "Fulfilment", "OrderContract")
    with pytest.raises(UnknownContract):
        broker.begin_dialog("Orders", "Fulfilment", "NoSuchContract")
    with pytest.raises(ContractViolation):
        broker.begin_dialog("Orders", "Fulfilment", "DEFAULT")  # Fulfilment doesn't accept it
    assert broker.endpoints() == []


# --- receive, groups, commit, rollback -----------------------------------------------------------


@on_both
def test_receive_takes_one_group_and_other_readers_skip_it_until_commit(broker):
    define_orders(broker)
    h1 = broker.begin_dialog("Orders", "Fulfilment", "OrderContract")
    h2 = broker.begin_dialog("Orders", "Fulfilment", "OrderContract")
    broker.apply([Send(h1, "Order", order(1)), Send(h2, "Order", order(2))])
    [first] = broker.receive("FulfilmentQueue")
    [second] = broker.receive("FulfilmentQueue")
    assert first.group_id != second.group_id
    assert broker.receive("FulfilmentQueue") == []  # both groups locked
    broker.rollback(first)
    [again] = broker.receive("FulfilmentQueue")
    assert again.group_id == first.group_id and again.messages[0].body == order(1)


@on_both
def test_receive_top_n_takes_the_first_messages_and_the_rest_come_next(broker):
    define_orders(broker)
    h = broker.begin_dialog("Orders", "Fulfilment", "OrderContract")
    broker.apply([Send(h, "Line", [line(f"s{i}", 1) for i in range(5)])])
    [g] = broker.receive("FulfilmentQueue", top=2)
    assert [m.sequence_number for m in g.messages] == [0, 1]
    [rest] = broker.receive("FulfilmentQueue", commit=[g])
    assert [m.sequence_number for m in rest.messages] == [2, 3, 4]


@on_both
def test_messages_arriving_while_a_group_is_locked_wait_for_the_next_receive(broker):
    define_orders(broker)
    h = broker.begin_dialog("Orders", "Fulfilment", "OrderContract")
    broker.send(h, "Order", order(1))
    [g] = broker.receive("FulfilmentQueue")
    broker.send(h, "Line", line("late", 1))
    broker.commit(g)
    [nxt] = broker.receive("FulfilmentQueue")
    assert [m.message_type for m in nxt.messages] == ["Line"]


@on_both
def test_multi_group_receive_locks_each_group_and_settles_them_separately(broker):
    define_orders(broker)
    hs = broker.apply([Begin("Orders", "Fulfilment", "OrderContract") for _ in range(4)])
    broker.apply([Send(h, "Order", order(i)) for i, h in enumerate(hs["handles"])])
    groups = broker.receive("FulfilmentQueue", max_groups=4)
    assert len({g.lock_id for g in groups}) == 4
    broker.settle(commit=groups[:2], rollback=groups[2:])
    back = broker.receive("FulfilmentQueue", max_groups=4)
    assert {g.group_id for g in back} == {g.group_id for g in groups[2:]}


@on_both
def test_commit_applies_sends_ends_and_group_state_atomically(broker):
    define_orders(broker)
    h = broker.begin_dialog("Orders", "Fulfilment", "OrderContract")
    broker.send(h, "Order", order(1))
    [g] = broker.receive("FulfilmentQueue")
    t = g.messages[0].conversation_handle
    before = snapshot(broker)
    with pytest.raises(ContractViolation):  # the target may not send Order
        broker.commit(
            g, ops=[Send(t, "Ack", b"1"), Send(t, "Order", order(9))], states={g.group_id: b"seen"}
        )
    assert snapshot(broker) == before  # nothing applied; the lock is still ours
    broker.commit(g, ops=[Send(t, "Ack", b"1")], states={g.group_id: b"seen"})
    broker.send(h, "Line", line("x", 1))
    [nxt] = broker.receive("FulfilmentQueue")
    assert nxt.state == b"seen" and nxt.group_id == g.group_id
    assert [m.message_type for m in broker.receive("OrdersQueue")[0].messages] == ["Ack"]


@on_both
def test_committing_a_lock_you_do_not_hold_is_refused(broker):
    define_orders(broker)
    h = broker.begin_dialog("Orders", "Fulfilment", "OrderContract")
    broker.send(h, "Order", order(1))
    [g] = broker.receive("FulfilmentQueue")
    broker.commit(g)
    with pytest.raises(LockNotHeld):
        broker.commit(g)
    with pytest.raises(LockNotHeld):
        broker.commit("not-a-lock")


@on_both
def test_receive_targets_a_group_or_a_handle(broker):
    define_orders(broker)
    h1, h2 = broker.apply([Begin("Orders", "Fulfilment", "OrderContract") for _ in range(2)])[
        "handles"
    ]
    broker.apply([Send(h1, "Order", order(1)), Send(h2, "Order", order(2))])
    g1, g2 = broker.receive("FulfilmentQueue", max_groups=2)
    broker.rollback([g1, g2])
    groups = {g["conversation_group_id"] for g in broker.groups("FulfilmentQueue")}
    [by_group] = broker.receive("FulfilmentQueue", group_id=g2.group_id)
    assert by_group.group_id == g2.group_id and by_group.group_id in groups
    broker.rollback(by_group)
    [by_handle] = broker.receive("FulfilmentQueue", handle=by_group.messages[0].conversation_handle)
    assert by_handle.group_id == g2.group_id


@on_both
def test_related_dialogs_share_a_group_and_arrive_in_one_receive(broker):
    define_orders(broker)
    header = broker.begin_dialog("Orders", "Fulfilment", "OrderContract")
    lines = broker.begin_dialog(
        "Orders", "Fulfilment", "OrderContract", related_conversation=header
    )
    broker.apply([Send(header, "Order", order(1)), Send(lines, "Line", line("a", 1))])
    targets = broker.receive("FulfilmentQueue", max_groups=5)  # a target group per dialog
    broker.commit(
        targets, ops=[Send(g.messages[0].conversation_handle, "Ack", b"") for g in targets]
    )
    # the replies land on the initiator side, where both dialogs are one group
    [replies] = broker.receive("OrdersQueue", max_groups=5)
    assert {m.conversation_handle for m in replies.messages} == {header, lines}


@on_both
def test_get_conversation_group_then_move_conversation(broker):
    define_orders(broker)
    a, b = broker.apply([Begin("Orders", "Fulfilment", "OrderContract") for _ in range(2)])[
        "handles"
    ]
    broker.apply([Send(a, "Order", order(1)), Send(b, "Order", order(2))])
    gid, lock = broker.get_conversation_group("FulfilmentQueue")
    [g] = broker.receive("FulfilmentQueue", lock=lock)
    assert g.group_id == gid and len(g.messages) == 1
    broker.rollback(g)
    ta = g.messages[0].conversation_handle
    other = next(
        x["conversation_group_id"]
        for x in broker.groups("FulfilmentQueue")
        if x["conversation_group_id"] != gid
    )
    broker.move_conversation(ta, other)
    [both] = broker.receive("FulfilmentQueue")
    assert both.group_id == other and len(both.messages) == 2


@on_both
def test_receive_with_wait_returns_when_a_message_arrives(broker):
    define_orders(broker)
    h = broker.begin_dialog("Orders", "Fulfilment", "OrderContract")
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(broker.receive, "FulfilmentQueue", wait=30.0)
        done, _ = wait([waiting], timeout=0.2)
        assert not done  # still waiting: nothing sent yet
        broker.send(h, "Order", order(1))
        groups = waiting.result(timeout=30)
    assert groups[0].messages[0].body == order(1)


@on_both
def test_receive_with_wait_returns_empty_when_time_runs_out(broker):
    define_orders(broker)
    assert broker.receive("FulfilmentQueue", wait=0.2) == []


@on_both
def test_the_async_client_does_what_the_sync_one_does(broker):
    define_orders(broker)

    async def flow():
        h = await broker.aio.begin_dialog("Orders", "Fulfilment", "OrderContract")
        await broker.aio.send(h, "Order", order(1))
        [g] = await broker.aio.receive("FulfilmentQueue", wait=5)
        await broker.aio.commit(g)
        return g.messages[0].body, await broker.aio.queues()

    body, queues = asyncio.run(flow())
    assert body == order(1) and queues["FulfilmentQueue"]["depth"] == 0


# --- poison, leases, dead holders --------------------------------------------------------------


@on_both
def test_poison_limit_rollbacks_in_a_row_disable_the_queue_until_re_enabled(broker):
    define_orders(broker, poison_limit=3)
    h = broker.begin_dialog("Orders", "Fulfilment", "OrderContract")
    broker.send(h, "Order", order(1))
    for _ in range(3):
        broker.rollback(broker.receive("FulfilmentQueue"))
    with pytest.raises(QueueDisabled):
        broker.receive("FulfilmentQueue")
    events = [e for e in broker.events() if e["kind"] == "QueueDisabled"]
    assert events and events[0]["subject"] == "FulfilmentQueue"
    broker.alter(Queue, "FulfilmentQueue", enabled=True)
    [g] = broker.receive("FulfilmentQueue")
    assert g.messages[0].body == order(1)


def test_a_lock_whose_lease_runs_out_is_released(make_broker):
    b = make_broker()
    define_orders(b)
    h = b.begin_dialog("Orders", "Fulfilment", "OrderContract")
    b.send(h, "Order", order(1))
    [g] = b.receive("FulfilmentQueue", lease=0.3)
    [again] = b.receive("FulfilmentQueue", wait=10)
    assert again.group_id == g.group_id
    with pytest.raises(LockNotHeld):
        b.commit(g)


@ray.remote
class Holder:
    """A reader actor that receives and then never commits."""

    def take(self, b):
        return [g.group_id for g in b.receive("FulfilmentQueue", lease=600)]


def test_a_dead_readers_locks_are_released_and_its_messages_reappear(broker):
    define_orders(broker)
    h = broker.begin_dialog("Orders", "Fulfilment", "OrderContract")
    broker.send(h, "Order", order(1))
    holder = Holder.remote()
    [gid] = ray.get(holder.take.remote(broker))
    assert broker.receive("FulfilmentQueue") == []  # held, lease is long
    ray.kill(holder)
    [g] = broker.receive("FulfilmentQueue", wait=30)
    assert g.group_id == gid and g.messages[0].body == order(1)


# --- timers, lifetime, echo, retention, views -------------------------------------------------


@on_both
def test_a_conversation_timer_delivers_a_dialog_timer_message(broker):
    define_orders(broker)
    h = broker.begin_dialog("Orders", "Fulfilment", "OrderContract")
    broker.begin_conversation_timer(h, 0.2)
    [g] = broker.receive("OrdersQueue", wait=10)
    assert [m.message_type for m in g.messages] == ["DialogTimer"]
    assert g.messages[0].conversation_handle == h


@on_both
def test_a_dialog_whose_lifetime_runs_out_errors_on_both_sides(broker):
    define_orders(broker)
    h = broker.begin_dialog("Orders", "Fulfilment", "OrderContract", lifetime=0.3)
    broker.send(h, "Order", order(1))
    [mine] = broker.receive("OrdersQueue", wait=10)
    assert mine.messages[0].message_type == "Error"
    [theirs] = broker.receive("FulfilmentQueue", wait=10)
    assert [m.message_type for m in theirs.messages][-1] == "Error"
    with pytest.raises(ConversationEnded):
        broker.send(h, "Order", order(2))


@on_both
def test_echo_dialogs_are_answered_by_the_broker(broker):
    broker.create(Queue("EchoQueue"))
    broker.create(Queue("ProbeQueue"))
    broker.create(Service("EchoService", "EchoQueue", ["Echo"]))
    broker.create(Service("Probe", "ProbeQueue"))
    h = broker.begin_dialog("Probe", "EchoService", "Echo")
    broker.send(h, "Echo", b"ping")
    [g] = broker.receive("ProbeQueue")
    assert [(m.message_type, m.body) for m in g.messages] == [("Echo", b"ping")]
    assert broker.queues()["EchoQueue"]["depth"] == 0


@on_both
def test_a_retention_queue_keeps_received_messages_until_the_dialog_ends(broker):
    define_orders(broker, retention=True)
    h = broker.begin_dialog("Orders", "Fulfilment", "OrderContract")
    broker.send(h, "Order", order(1))
    [g] = broker.receive("FulfilmentQueue")
    broker.commit(g)
    assert [r["status"] for r in broker.queue("FulfilmentQueue")] == ["received"]
    broker.end_conversation(g.messages[0].conversation_handle)
    assert broker.queue("FulfilmentQueue") == []


@on_both
def test_the_views_show_endpoints_queues_groups_and_an_empty_transmission_queue(broker):
    define_orders(broker)
    h = broker.begin_dialog("Orders", "Fulfilment", "OrderContract")
    broker.send(h, "Order", order(1))
    eps = {e["conversation_handle"]: e for e in broker.endpoints()}
    assert eps[h]["state"] == "CONVERSING" and eps[h]["send_sequence"] == 1
    assert [r["status"] for r in broker.queue("FulfilmentQueue")] == ["waiting"]
    assert broker.queues()["FulfilmentQueue"]["depth"] == 1
    assert broker.transmission_queue() == []
    [g] = broker.receive("FulfilmentQueue")
    assert [r["status"] for r in broker.queue("FulfilmentQueue")] == ["locked"]
    broker.commit(g)
    [rec] = broker.audit()["records"]
    assert rec["sequence_number"] == 0 and rec["queue"] == "FulfilmentQueue"


def test_a_broker_whose_store_cannot_open_says_so_at_once(ray_session, tmp_path):
    with pytest.raises(StoreError, match="does not exist"):
        start_broker(
            f"bad-{tmp_path.name}", str(tmp_path / "no" / "such" / "dir.sqlite"), retry_s=60
        )


def test_the_broker_calls_its_own_methods_unwrapped_and_ray_still_calls_in(broker):
    # Ray wraps each method of an actor class for tracing; the broker's calls on itself skip
    # those wrappers (a frame each, several per message), while calls from clients still arrive
    def wrapped(actor) -> list[str]:
        return [
            name
            for name in ("_start_apply", "_start_receive", "_take", "info")
            if getattr(getattr(type(actor), name), "__ray_tracing_wrapped__", False)
        ]

    assert ray.get(broker.actor.__ray_call__.remote(wrapped)) == []
    assert broker.info()["name"] == broker.name


def test_the_actors_raw_entry_points_refuse_malformed_calls_with_typed_errors(make_broker):
    """What any Ray client can call on the actor, arguments of the wrong shape: typed errors
    (tests/unit/test_fuzz.py fuzzes them in-process)."""
    b = make_broker()
    with pytest.raises(InvalidArgument, match=r"alter takes \(kind, name, changes, request_id\)"):
        ray.get(b.actor.call.remote(("raw-client", 0, 0), "alter"))
    [(ok, error)] = ray.get(b.actor.calls.remote(("raw-client", 1, 1), [("apply", [])]))
    assert not ok and isinstance(error, InvalidArgument) and "a list of 2" in str(error)
    with pytest.raises(InvalidArgument, match="queue must be a queue's name"):
        ray.get(b.actor.wait_take.remote({"not": "a name"}, 0, []))
    assert b.info()["name"] == b.name  # it still answers


def test_a_waiting_aio_receive_on_an_idle_handle_takes_refuses_and_waits_as_a_receive_does(
    make_broker,
):
    """An idle handle's waiting receive goes straight to the broker's shared wait: what is
    there is taken at once, a disabled or unknown queue is refused at once (not after the
    wait), and a message that comes while it waits is its answer; it leaves nothing behind."""
    b = make_broker()
    define_orders(b)
    h = b.begin_dialog("Orders", "Fulfilment", "OrderContract")
    b.send(h, "Order", order(1))

    async def flow() -> tuple[list, list]:
        [first] = await asyncio.wait_for(b.aio.receive("FulfilmentQueue", wait=30), 10)
        await b.aio.commit(first)
        await b.aio.alter(Queue, "FulfilmentQueue", enabled=False)  # empty, and disabled
        refused = []
        for queue, error in (("FulfilmentQueue", QueueDisabled), ("NoSuchQueue", UnknownQueue)):
            with pytest.raises(error):
                await asyncio.wait_for(b.aio.receive(queue, wait=30), 10)
            refused.append(queue)
        await b.aio.alter(Queue, "FulfilmentQueue", enabled=True)
        later = asyncio.ensure_future(b.aio.receive("FulfilmentQueue", wait=30))
        await asyncio.to_thread(wait_until, waiting, 30, "the receive to wait at the broker")
        await b.aio.send(h, "Order", order(2))
        [g2] = await asyncio.wait_for(later, 10)
        await b.aio.commit(g2)
        return refused, [m.body for m in first.messages + g2.messages]

    def waiting() -> bool:
        return b.queues()["FulfilmentQueue"]["waiting_receives"] > 0

    refused, bodies = asyncio.run(flow())
    assert refused == ["FulfilmentQueue", "NoSuchQueue"]
    assert bodies == [order(1), order(2)]
    queue = b.queues()["FulfilmentQueue"]
    assert queue["depth"] == 0 and queue["waiting_receives"] == 0 and queue["enabled"]


@pytest.mark.parametrize("direct", ["1", "0"], ids=["direct channel", "through Ray"])
def test_a_waiting_aio_receive_cancelled_as_its_loop_ends_gives_back_what_it_takes(
    make_broker, monkeypatch, direct
):
    monkeypatch.setenv("RAYBROKER_DIRECT", direct)
    b = make_broker(lease_s=60.0)
    define_orders(b)
    h = b.begin_dialog("Orders", "Fulfilment", "OrderContract")

    def waiting() -> bool:
        return b.queues()["FulfilmentQueue"]["waiting_receives"] > 0

    async def leave() -> None:
        task = asyncio.create_task(b.aio.receive("FulfilmentQueue", wait=30))
        await asyncio.to_thread(wait_until, waiting, 30, "the receive to wait at the broker")
        task.cancel()

    asyncio.run(leave())  # the loop ends right after the cancel
    b.send(h, "Order", b"{}")  # the broker's waiting take takes it for the receive that left
    # back in the queue long before the 60 s lease would run out, and no rollback counted
    [g] = b.receive("FulfilmentQueue", wait=20)
    assert [m.body for m in g.messages] == [b"{}"]
    b.commit([g])
    assert b.queues()["FulfilmentQueue"]["rollbacks_in_a_row"] == 0


@ray.remote(num_cpus=0)
def _thresholds_once_handed(blob: bytes, keep: bool) -> tuple[tuple[int, ...], str]:
    """In a Ray worker: the collector's thresholds after a pickled handle arrives, the process
    at Python's default before (a worker may have held a handle already), and the process
    left as it was."""
    import gc
    import pickle

    from actors import collector

    before, kept = gc.get_threshold(), os.environ.pop(collector.KEEP_ENV, None)
    try:
        gc.set_threshold(*collector.PYTHON_DEFAULT)
        if keep:
            os.environ[collector.KEEP_ENV] = "1"
        handle = pickle.loads(blob)
        return gc.get_threshold(), handle.name
    finally:
        gc.set_threshold(*before)
        os.environ.pop(collector.KEEP_ENV, None)
        if kept is not None:
            os.environ[collector.KEEP_ENV] = kept


def test_a_handle_sent_to_another_process_raises_its_young_gc_threshold(make_broker):
    b = make_broker()
    blob = ray.cloudpickle.dumps(b)
    busy, name = ray.get(_thresholds_once_handed.remote(blob, keep=False))
    assert (busy, name) == (collector.BUSY_THRESHOLDS, b.name)
    kept, _ = ray.get(_thresholds_once_handed.remote(blob, keep=True))
    assert kept == collector.PYTHON_DEFAULT
