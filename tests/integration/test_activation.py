"""Activated queues on a real Ray: reader pools grow with the queue, shrink when idle, never hold
one conversation group twice, survive a killed reader, and stop on poison."""

from __future__ import annotations

import json

import pytest
import ray

from actors import Begin, Broker, Queue, Send, Service
from actors.errors import InvalidDefinition
from actors.model.catalog import Activation
from tests.polling import wait_until

from .activation_handlers import RECORDER, RECORDER_NAMESPACE, Recorder
from .conftest import TEST_CODE

COUNT = "actors.activation.handlers:count_in_order"
SLOW_COUNT = "actors.activation.handlers:slow_count"
HANDLERS = "tests.integration.activation_handlers"


def define(broker, activation: Activation | None, poison_limit: int = 5) -> None:
    broker.create(Queue("InitiatorQueue"))
    broker.create(Queue("WorkQueue", poison_limit=poison_limit, activation=activation))
    broker.create(Service("Initiator", "InitiatorQueue"))
    broker.create(Service("Work", "WorkQueue", ["DEFAULT"]))


def send_stream(broker, dialogs: int, per_dialog: int, batch_per_dialog: int = 10) -> list[str]:
    handles = broker.apply([Begin("Initiator", "Work") for _ in range(dialogs)])["handles"]
    for first in range(0, per_dialog, batch_per_dialog):
        n = min(batch_per_dialog, per_dialog - first)
        broker.apply([Send(h, "DEFAULT", [b"m"] * n) for h in handles])
    return handles


def counted(broker) -> list[dict]:
    return [json.loads(g["state"]) for g in broker.groups("WorkQueue") if g["state"]]


def all_counted(broker, total: int):
    states = counted(broker)
    return states if sum(s["count"] for s in states) >= total else None


def readers(broker) -> int:
    return broker.queues()["WorkQueue"]["readers"]


@pytest.mark.slow
def test_readers_grow_from_zero_to_max_under_load_and_back_to_zero_when_idle(broker):
    define(broker, Activation(SLOW_COUNT, max_readers=3, idle_timeout=1.0, max_groups=1))
    assert readers(broker) == 0
    send_stream(broker, dialogs=300, per_dialog=2, batch_per_dialog=2)
    seen: list[int] = []

    def at_max():
        seen.append(readers(broker))
        return seen[-1] == 3

    wait_until(at_max, timeout=60, what="three readers")
    states = wait_until(lambda: all_counted(broker, 600), timeout=120, what="all messages")
    wait_until(lambda: readers(broker) == 0, timeout=30, what="the readers to leave")
    assert max(seen) == 3  # never more than max_readers
    assert seen[0] <= 1 < 3  # it started with one and grew
    assert all(s["bad"] == 0 for s in states) and sum(s["count"] for s in states) == 600


@pytest.mark.slow
def test_order_entry_groups_are_never_processed_out_of_order_or_by_two_readers(broker):
    recorder = Recorder.options(name=RECORDER, namespace=RECORDER_NAMESPACE).remote()
    broker.create(Queue("EchoQueue"))
    broker.create(Service("Warehouse", "EchoQueue", ["Echo"]))  # answers every Echo itself
    broker.create(
        Queue(
            "OrdersQueue",
            activation=Activation(
                "tests.integration.activation_handlers:order_entry",
                max_readers=4,
                max_groups=2,
                idle_timeout=1.0,
            ),
        )
    )
    broker.create(Service("OrderEntry", "OrdersQueue"))
    orders = 300
    header_ops, line_ops, groups = [], [], {}
    for n in range(orders):
        gid = f"00000000-0000-4000-8000-{n:012d}"
        dialogs = [Begin("OrderEntry", "Warehouse", "Echo", related_group=gid) for _ in range(3)]
        header_ops += [*dialogs, Send(dialogs[0].handle, "Echo", f"header:{n}".encode())]
        line_ops += [
            Send(d.handle, "Echo", f"line:{n}:{i}".encode()) for i, d in enumerate(dialogs[1:])
        ]
        groups[gid] = n
    broker.apply(header_ops)
    broker.apply(line_ops)

    def done():
        states = {
            g["conversation_group_id"]: json.loads(g["state"])
            for g in broker.groups("OrdersQueue")
            if g["state"]
        }
        complete = [s for s in states.values() if s["header"] and s["lines"] == 2]
        return states if len(complete) == orders else None

    states = wait_until(done, timeout=120, what="every order processed")
    assert set(states) == set(groups)
    assert all(s["bad"] == 0 for s in states.values())  # no line before its header
    calls = ray.get(recorder.all.remote())
    by_group: dict[str, list] = {}
    for gid, pid, start, end in calls:
        by_group.setdefault(gid, []).append((start, end, pid))
    assert len({pid for _, pid, _, _ in calls}) > 1  # several readers really ran
    for spans in by_group.values():
        spans.sort()
        for (_, end, _), (start, _, _) in zip(spans, spans[1:], strict=False):
            assert start >= end  # one group, one reader at a time
    ray.kill(recorder)


@pytest.mark.slow
def test_a_killed_reader_loses_and_doubles_nothing_over_ten_thousand_messages(make_broker):
    broker = make_broker(lease_s=10.0)
    define(broker, Activation(SLOW_COUNT, max_readers=2, idle_timeout=2.0, max_groups=4))
    send_stream(broker, dialogs=100, per_dialog=100, batch_per_dialog=25)
    [victim, *_] = wait_until(
        lambda: ray.get(broker.actor.reader_actors.remote("WorkQueue")), what="a running reader"
    )
    wait_until(lambda: sum(s["count"] for s in counted(broker)) > 500, what="some progress")
    ray.kill(victim)
    states = wait_until(lambda: all_counted(broker, 10_000), timeout=180, what="all messages")
    assert len(states) == 100
    assert all(s["count"] == 100 and s["bad"] == 0 for s in states)  # once each, in order
    assert broker.queues()["WorkQueue"]["depth"] == 0


def test_a_killed_reader_holding_eight_groups_is_one_failed_turn_under_the_default_activation(
    broker,
):
    define(broker, Activation("tests.integration.activation_handlers:hang"))  # defaults
    assert Activation("x").max_groups == 8 and Queue("Q").poison_limit == 5
    send_stream(broker, dialogs=20, per_dialog=1)
    wait_until(lambda: broker.queues()["WorkQueue"]["locked_groups"] == 8, what="8 groups held")
    (victim,) = ray.get(broker.actor.reader_actors.remote("WorkQueue"))

    ray.kill(victim)

    wait_until(lambda: broker.queues()["WorkQueue"]["rollbacks_in_a_row"] == 1, what="the rollback")
    q = broker.queues()["WorkQueue"]
    assert q["enabled"] is True and q["depth"] == 20  # one failed turn, not eight; nothing lost
    broker.alter(Queue, "WorkQueue", activation={"enabled": False})


def test_a_failing_handler_hits_the_poison_limit_and_disables_the_queue(broker):
    define(
        broker,
        Activation("tests.integration.activation_handlers:always_fail", idle_timeout=1.0),
        poison_limit=3,
    )
    send_stream(broker, dialogs=1, per_dialog=1)
    wait_until(lambda: not broker.queues()["WorkQueue"]["enabled"], what="the queue disabled")
    assert [e["subject"] for e in broker.events() if e["kind"] == "QueueDisabled"] == ["WorkQueue"]
    wait_until(lambda: readers(broker) == 0, what="the readers to stop")
    assert broker.queues()["WorkQueue"]["depth"] == 1  # the message is kept, not lost


def test_internal_activation_processes_messages_inside_the_broker(broker):
    define(broker, Activation(COUNT, max_readers=2, placement="internal", idle_timeout=0.5))
    send_stream(broker, dialogs=20, per_dialog=50)
    states = wait_until(lambda: all_counted(broker, 1000), what="all messages")
    assert all(s["count"] == 50 and s["bad"] == 0 for s in states)
    assert ray.get(broker.actor.reader_actors.remote("WorkQueue")) == []  # no reader actors
    wait_until(lambda: readers(broker) == 0, what="the internal readers to leave")


def test_activation_can_be_turned_off_and_on_on_a_running_queue(broker):
    define(broker, Activation(COUNT, idle_timeout=30.0, enabled=False))
    send_stream(broker, dialogs=5, per_dialog=10)
    assert readers(broker) == 0 and broker.queues()["WorkQueue"]["depth"] == 50
    broker.alter(Queue, "WorkQueue", activation={"enabled": True})
    wait_until(lambda: all_counted(broker, 50), what="the messages processed")
    broker.alter(Queue, "WorkQueue", activation={"enabled": False})
    wait_until(lambda: readers(broker) == 0, what="the reader retired despite idle_timeout=30")


def test_external_readers_work_beside_activated_ones(broker):
    define(broker, Activation(SLOW_COUNT, max_readers=2, idle_timeout=1.0, max_groups=1))
    send_stream(broker, dialogs=60, per_dialog=5, batch_per_dialog=5)
    wait_until(lambda: counted(broker), what="the activated readers to start")
    by_driver = 0
    while True:  # the driver reads too, counting into the same group states
        groups = broker.receive("WorkQueue", max_groups=2, wait=0.5)
        if not groups:
            break
        states = {}
        for g in groups:
            s = json.loads(g.state) if g.state else {"count": 0, "last": {}, "bad": 0}
            s["count"] += len(g)
            states[g.group_id] = json.dumps(s).encode()
            by_driver += len(g)
        broker.commit(groups, states=states)
    states = wait_until(lambda: all_counted(broker, 300), what="all messages")
    assert sum(s["count"] for s in states) == 300  # once each, whoever read it
    assert 0 < by_driver < 300


def test_a_hung_handler_is_bounded_by_its_lease_and_its_group_comes_back(broker):
    define(
        broker,
        Activation("tests.integration.activation_handlers:hang", lease=1.0, idle_timeout=30.0),
    )
    [h] = send_stream(broker, dialogs=1, per_dialog=1)
    wait_until(
        lambda: readers(broker) == 1 and broker.queues()["WorkQueue"]["locked_groups"],
        what="the handler to take the group",
    )
    broker.alter(Queue, "WorkQueue", activation={"enabled": False})  # no second hung reader
    [g] = broker.receive("WorkQueue", wait=30)  # after the lease runs out
    assert g.messages[0].body == b"m"
    broker.commit(g)


@pytest.fixture(scope="module")
def unactivated(make_module_broker) -> Broker:
    """A broker whose WorkQueue has no activation, for the module's refused activations: each
    test checks that the broker's definitions are as they were."""
    b = make_module_broker(limits={"code_modules": list(TEST_CODE)})
    define(b, None)
    return b


@pytest.mark.parametrize(
    "activation",
    [
        Activation("no_such_module:handler"),
        Activation("actors.activation.handlers:no_such_function"),
        Activation(COUNT, max_readers=0),
        Activation(COUNT, placement="everywhere"),
        Activation(COUNT, idle_timeout=0),
    ],
)
def test_a_bad_activation_is_refused_when_the_queue_is_configured(unactivated, activation):
    before = unactivated.definitions()
    with pytest.raises(InvalidDefinition):
        unactivated.create(Queue("Other", activation=activation))
    with pytest.raises(InvalidDefinition):
        unactivated.alter(Queue, "WorkQueue", activation=activation)
    assert unactivated.definitions() == before


def test_a_handler_outside_the_brokers_code_modules_is_refused_and_nothing_changes(make_broker):
    """Any client can send a definition: a broker runs only code from modules its operator
    allowed (its limit code_modules, beside the package's own)."""
    plain = make_broker()
    for handler in ("tests.integration.activation_handlers:hang", "os:system"):
        with pytest.raises(InvalidDefinition, match="which this broker does not allow"):
            plain.create(Queue("WorkQueue", activation=Activation(handler)))
    assert "WorkQueue" not in plain.queues()
    allowed = make_broker(limits={"code_modules": ["tests.integration"]})
    allowed.create(Queue("WorkQueue", activation=Activation(SLOW_COUNT)))
    allowed.alter(Queue, "WorkQueue", activation=Activation(f"{HANDLERS}:hang"))
    with pytest.raises(InvalidDefinition, match="which this broker does not allow"):
        allowed.alter(Queue, "WorkQueue", activation=Activation("subprocess:run"))
    [queue] = [r for kind, r in allowed.definitions() if kind == "queue"]
    assert queue["activation"]["handler"] == f"{HANDLERS}:hang"
