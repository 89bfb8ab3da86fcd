"""Data-dependent routing (seed 000) on one in-process broker: the real router handler, run by
the queue's internal activation, forwarding dialogs by what their first message says. No Ray."""

from __future__ import annotations

import json

import msgpack
import pytest

from actors import Activation, Begin, Contract, End, LocalBroker, MessageType, Queue, Send, Service
from actors.ddr import RouterConfig, router_contracts
from actors.ddr.classifiers import field, hash_partition
from actors.ddr.router import ROUTING_FAILED
from actors.errors import InvalidArgument, InvalidDefinition
from actors.model.catalog import END_DIALOG, ERROR, REDIRECT
from tests.polling import wait_until

REGIONS = ("EU", "US", "APAC", "LATAM")
HANDLER = "actors.ddr.router:route_messages"


def router_queue(cfg: RouterConfig) -> Queue:
    act = Activation(HANDLER, max_readers=2, placement="internal", idle_timeout=2.0)
    return Queue("RouterQ", activation=Activation(**{**vars(act), "options": cfg.options()}))


def config(mode: str = "forward", **options) -> RouterConfig:
    return RouterConfig(
        "SalesRouter",
        tuple(f"Sales{r}" for r in REGIONS),
        "actors.ddr.classifiers:field",
        mode,
        {"template": "Sales{value}", **options},
    )


@pytest.fixture
def broker(tmp_path):
    with LocalBroker("ddr", str(tmp_path / "ddr.sqlite")) as b:
        b.create(MessageType("Order", "json"))
        b.create(MessageType("Reply"))
        b.create(Contract("Sales", {"Order": "initiator", "Reply": "target"}))
        b.create(Queue("InitQ"))
        b.create(Service("Init", "InitQ"))
        for r in REGIONS:
            b.create(Queue(f"{r}Q"))
            b.create(Service(f"Sales{r}", f"{r}Q", ["Sales"]))
        yield b


def start_router(b, cfg: RouterConfig | None = None) -> RouterConfig:
    cfg = cfg or config()
    b.create(router_queue(cfg))
    b.create(Service("SalesRouter", "RouterQ", ["Sales"]))
    return cfg


def order(b, region: str, n: int = 1) -> str:
    op = Begin("Init", "SalesRouter", "Sales")
    bodies = [json.dumps({"region": region, "line": i}).encode() for i in range(n)]
    b.apply([op, Send(op.handle, "Order", bodies)])
    return op.handle


def take(b, queue: str, n: int) -> list:
    got: list = []

    def enough():
        for g in b.receive(queue, max_groups=100):
            got.extend(g.messages)
            b.commit(g)
        return len(got) >= n

    wait_until(enough)
    return got


def test_the_first_message_picks_the_target_and_the_dialog_follows_it_both_ways(broker):
    start_router(broker)
    h = order(broker, "EU", 3)

    msgs = take(broker, "EUQ", 3)
    assert [json.loads(m.body)["line"] for m in msgs] == [0, 1, 2]  # in order, once
    target = msgs[0].conversation_handle
    broker.apply([Send(target, "Reply", [b"r1", b"r2"])])

    replies = take(broker, "InitQ", 2)
    assert [(m.conversation_handle, m.body) for m in replies] == [(h, b"r1"), (h, b"r2")]
    (m,) = broker.router("RouterQ", "SalesRouter")["mappings"]
    assert (m["inbound"] != h, m["target_service"]) == (True, "SalesEU")
    assert broker.router("RouterQ", "SalesRouter")["routed"] >= 1


def test_many_orders_reach_their_regions_and_replies_return_in_order(broker):
    start_router(broker)
    handles = {order(broker, REGIONS[i % 4], 2): REGIONS[i % 4] for i in range(40)}
    for r in REGIONS:
        msgs = take(broker, f"{r}Q", 20)
        assert {json.loads(m.body)["region"] for m in msgs} == {r}
        by_dialog: dict[str, list[int]] = {}
        for m in msgs:
            by_dialog.setdefault(m.conversation_handle, []).append(json.loads(m.body)["line"])
        assert all(lines == [0, 1] for lines in by_dialog.values())
        broker.apply([Send(list(by_dialog), "Reply", f"from {r}".encode())])
    replies = take(broker, "InitQ", 40)
    assert sorted((m.conversation_handle, m.body.decode()) for m in replies) == sorted(
        (h, f"from {r}") for h, r in handles.items()
    )


def test_an_end_from_the_initiator_ends_the_outbound_dialog_and_the_mapping_goes(broker):
    start_router(broker)
    h = order(broker, "US")
    (m,) = take(broker, "USQ", 1)
    broker.end_conversation(h)

    (end,) = take(broker, "USQ", 1)
    assert (end.message_type, end.conversation_handle) == (END_DIALOG, m.conversation_handle)
    wait_until(lambda: broker.router("RouterQ", "SalesRouter")["mappings"] == [])


def test_an_end_from_the_target_reaches_the_initiator(broker):
    start_router(broker)
    h = order(broker, "US")
    (m,) = take(broker, "USQ", 1)
    broker.apply([Send(m.conversation_handle, "Reply", b"done"), End(m.conversation_handle)])

    got = take(broker, "InitQ", 2)
    assert [(x.conversation_handle, x.message_type) for x in got] == [
        (h, "Reply"),
        (h, END_DIALOG),
    ]
    wait_until(lambda: broker.router("RouterQ", "SalesRouter")["mappings"] == [])


def test_an_error_from_the_target_is_wrapped_and_passed_to_the_initiator(broker):
    start_router(broker)
    h = order(broker, "APAC")
    (m,) = take(broker, "APACQ", 1)
    broker.end_conversation(m.conversation_handle, error=4711, description="out of stock")

    (err,) = take(broker, "InitQ", 1)
    assert (err.conversation_handle, err.message_type) == (h, ERROR)
    code, text = err.error
    assert code == 4711 and "out of stock" in text and "SalesRouter" in text
    assert broker.router("RouterQ", "SalesRouter")["errors"] >= 1


def test_an_error_from_the_initiator_ends_the_target_with_it(broker):
    start_router(broker)
    h = order(broker, "LATAM")
    (m,) = take(broker, "LATAMQ", 1)
    broker.end_conversation(h, error=99, description="customer cancelled")

    (err,) = take(broker, "LATAMQ", 1)
    assert (err.conversation_handle, err.message_type) == (m.conversation_handle, ERROR)
    assert err.error[0] == 99 and "customer cancelled" in err.error[1]


@pytest.mark.parametrize(
    "body, says",
    [
        (b'{"no_region": 1}', "has no field 'region'"),
        (b'{"region": "MARS"}', "'SalesMARS', which is not one of the router set's targets"),
    ],
)
def test_a_classification_that_fails_ends_that_dialog_with_an_error_and_others_go_on(
    broker, body, says
):
    start_router(broker)
    op = Begin("Init", "SalesRouter", "Sales")
    broker.apply([op, Send(op.handle, "Order", body)])
    good = order(broker, "EU")

    (err,) = take(broker, "InitQ", 1)
    assert (err.conversation_handle, err.message_type) == (op.handle, ERROR)
    code, text = err.error
    assert code == ROUTING_FAILED and "actors.ddr.classifiers:field" in text and says in text
    assert take(broker, "EUQ", 1)[0].message_type == "Order"
    assert good != op.handle


def test_a_classifier_returning_no_string_is_named_in_the_error(broker):
    start_router(broker, config(template=None, field="line"))
    op = Begin("Init", "SalesRouter", "Sales")
    broker.apply([op, Send(op.handle, "Order", b'{"line": 7}')])

    (err,) = take(broker, "InitQ", 1)
    assert "returned 7, not a service name" in err.error[1]


def test_redirect_mode_answers_with_the_service_and_keeps_no_mapping(broker):
    start_router(broker, config(mode="redirect"))
    h = order(broker, "EU")

    redirect, end = take(broker, "InitQ", 2)
    assert (redirect.conversation_handle, redirect.message_type) == (h, REDIRECT)
    assert json.loads(redirect.body) == {"service": "SalesEU"}
    assert end.message_type == END_DIALOG
    assert broker.router("RouterQ", "SalesRouter")["mappings"] == []
    assert broker.queue("EUQ") == []  # nothing was forwarded


def test_the_classifier_can_be_changed_while_the_router_runs(broker):
    start_router(broker)
    order(broker, "EU")
    take(broker, "EUQ", 1)
    broker.alter(Queue, "RouterQ", activation={"options": config(mode="redirect").options()})

    h = order(broker, "EU")

    redirect, _ = take(broker, "InitQ", 2)
    assert (redirect.conversation_handle, redirect.message_type) == (h, REDIRECT)


def test_a_router_config_with_a_classifier_that_does_not_import_is_refused():
    cfg = RouterConfig("R", ("A",), "no.such.module:classify")
    with pytest.raises(InvalidDefinition, match="router classifier"):
        cfg.check_classifier()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"targets": ()},
        {"targets": "SalesEU"},
        {"mode": "broadcast"},
        {"service": "bad name"},
        {"classifier_options": 3},
    ],
)
def test_a_bad_router_config_is_refused(kwargs):
    base = {"service": "R", "targets": ("A",), "classifier": "actors.ddr.classifiers:field"}
    with pytest.raises(InvalidDefinition):
        RouterConfig(**{**base, **kwargs})


def test_a_routing_service_accepts_the_union_of_its_targets_contracts():
    targets = [Service("SalesEU", "EUQ", ("Sales", "Audit")), Service("SalesUS", "USQ", ("Sales",))]
    assert router_contracts("set", targets) == ["Audit", "Sales"]
    assert router_contracts("set", targets, ["Sales", "Audit", "Extra"]) == [
        "Sales",
        "Audit",
        "Extra",
    ]
    with pytest.raises(InvalidDefinition, match=r"lacks \['Audit'\]"):
        router_contracts("set", targets, ["Sales"])


# --- the shipped classifiers -------------------------------------------------------------------


def test_the_field_classifier_reads_json_and_msgpack_bodies():
    assert field(b'{"region": "EU"}', "Order", {}) == "EU"
    assert field(msgpack.packb({"region": "US"}), "Order", {"template": "Sales{value}"}) == (
        "SalesUS"
    )
    assert field(b'{"r": "x"}', "Order", {"field": "r", "map": {"x": "SalesX"}}) == "SalesX"


def test_hash_partition_is_stable_and_spreads_keys():
    parts = ["P0", "P1", "P2", "P3"]
    picks = [
        hash_partition(json.dumps({"key": k}).encode(), "M", {"targets": parts}) for k in range(400)
    ]
    again = [
        hash_partition(json.dumps({"key": k}).encode(), "M", {"targets": parts}) for k in range(400)
    ]
    assert picks == again
    assert {p: picks.count(p) for p in parts} == pytest.approx({p: 100 for p in parts}, abs=30)


def test_runs_of_messages_in_one_group_are_routed_as_their_first_and_ends_follow_them(broker):
    start_router(broker)
    bad, good = Begin("Init", "SalesRouter", "Sales"), Begin("Init", "SalesRouter", "Sales")
    lines = [json.dumps({"region": "EU", "line": i}).encode() for i in range(4)]
    bad_run = Send(bad.handle, "Order", [b'{"region": "Mars"}', *lines])
    # the router reads each dialog's run (and the good one's End) in one group
    broker.apply([bad, bad_run, good, Send(good.handle, "Order", lines), End(good.handle)])

    msgs = take(broker, "EUQ", 5)
    assert [m.message_type for m in msgs] == ["Order"] * 4 + [END_DIALOG]
    assert [json.loads(m.body)["line"] for m in msgs[:4]] == [0, 1, 2, 3]
    (err,) = take(broker, "InitQ", 1)  # the dialog that failed: its Error, nothing forwarded
    assert (err.conversation_handle, err.message_type) == (bad.handle, ERROR)
    assert not broker.receive("EUQ", max_groups=10)


def test_a_new_dialog_is_routed_as_it_arrives_without_a_turn_of_the_routers_handler(broker):
    start_router(broker)
    routed = broker.router("RouterQ", "SalesRouter")["routed"]  # counted per process
    h = order(broker, "EU", 3)

    # forwarded in the transaction that stored its arrival: already at the target, in order,
    # and the router's queue never held it (no reader turn)
    waiting = broker.queue("EUQ")
    assert [(m["sequence_number"], m["status"]) for m in waiting] == [
        (i, "waiting") for i in range(3)
    ]
    router_queue = broker.queues()["RouterQ"]
    assert (router_queue["depth"], router_queue["removed"]) == (0, 0)
    view = broker.router("RouterQ", "SalesRouter")
    (m,) = view["mappings"]
    assert (m["inbound"] != h, m["target_service"]) == (True, "SalesEU")
    assert (view["passed_through"], view["routed"]) == (3, routed + 1)
    # the mapping is the handler's: an end from the initiator still reaches the target
    broker.end_conversation(h)
    got = take(broker, "EUQ", 4)
    assert [json.loads(x.body)["line"] for x in got[:3]] == [0, 1, 2]
    assert got[3].message_type == END_DIALOG
    wait_until(lambda: broker.router("RouterQ", "SalesRouter")["mappings"] == [])


def test_with_its_activation_off_a_router_queue_holds_new_dialogs_for_its_handler(broker):
    start_router(broker)
    broker.alter(Queue, "RouterQ", activation={"enabled": False})
    order(broker, "US", 2)

    assert broker.queues()["RouterQ"]["depth"] == 2 and broker.queue("USQ") == []
    broker.alter(Queue, "RouterQ", activation={"enabled": True})
    assert [json.loads(m.body)["line"] for m in take(broker, "USQ", 2)] == [0, 1]
    assert broker.router("RouterQ", "SalesRouter")["passed_through"] == 0


def test_the_router_view_counts_every_mapping_and_lists_at_most_limit(broker):
    start_router(broker)
    handles = [order(broker, REGIONS[i % 4]) for i in range(12)]

    view = broker.router("RouterQ", "SalesRouter", limit=5)
    assert (view["mappings_total"], len(view["mappings"])) == (12, 5)
    everything = broker.router("RouterQ", "SalesRouter", limit=100)["mappings"]
    assert view["mappings"] == everything[:5] and len(everything) == 12
    assert {m["target_service"] for m in everything} == {f"Sales{r}" for r in REGIONS}
    broker.end_conversation(handles[0])  # the router ends both sides: the mapping goes
    wait_until(lambda: broker.router("RouterQ", "SalesRouter")["mappings_total"] == 11)
    for bad in (0, -1, "5", 2.5):
        with pytest.raises(InvalidArgument, match="limit"):
            broker.router("RouterQ", "SalesRouter", limit=bad)


def test_options_an_alter_made_unusable_fail_the_handler_not_the_senders(broker):
    start_router(broker)
    broker.alter(Queue, "RouterQ", activation={"options": {**config().options(), "colour": "x"}})

    order(broker, "EU")  # the send is taken; the message waits for the handler, which fails

    wait_until(lambda: "QueueDisabled" in {e["kind"] for e in broker.events()})
    assert broker.queues()["RouterQ"]["depth"] == 1 and broker.queue("EUQ") == []
