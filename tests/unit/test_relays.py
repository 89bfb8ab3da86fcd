"""Relayed dialogs (`Begin.relays`) on one in-process broker, no Ray: a dialog that relays another
sends the other's data messages on at arrival while their group is idle, exactly as a handler in
that group would, and lets everything else take the queue."""

from __future__ import annotations

import pytest

from actors import Begin, Contract, End, LocalBroker, MessageType, Queue, Send, Service, Timer
from actors.errors import InvalidArgument
from actors.model.catalog import DIALOG_TIMER, END_DIALOG
from tests.polling import wait_until


def _define(b: LocalBroker) -> None:
    b.create(MessageType("Order"))
    b.create(MessageType("Reply"))
    b.create(Contract("Sales", {"Order": "initiator", "Reply": "target"}))
    b.create(Contract("Other", {"Order": "initiator"}))
    for name in ("Front", "Relay", "Back"):
        b.create(Queue(f"{name}Q"))
        b.create(Service(name, f"{name}Q", ["Sales", "Other"]))


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "relay.sqlite")


@pytest.fixture
def broker(path):
    with LocalBroker("relay", path) as b:
        _define(b)
        yield b


def _one_group(b: LocalBroker, queue: str):
    groups: list = []
    wait_until(lambda: groups.extend(b.receive(queue, max_groups=1)) or groups)
    return groups[0]


def _open(b: LocalBroker, relays: bool = True) -> tuple[str, str, str]:
    """Front begins a dialog to Relay; Relay's handler (this test) begins one to Back in the
    same group, relaying it, and sends the first message on: (front, inbound, outbound)."""
    first = Begin("Front", "Relay", "Sales")
    b.apply([first, Send(first.handle, "Order", [b"o0"])])
    g = _one_group(b, "RelayQ")
    (m,) = g.messages
    out = Begin(
        "Relay",
        "Back",
        "Sales",
        related_group=g.group_id,
        relays=m.conversation_handle if relays else None,
    )
    b.commit(g, ops=[out, Send(out.handle, "Order", [m.body])])
    return first.handle, m.conversation_handle, out.handle


def _depth(b: LocalBroker, queue: str) -> int:
    return b.queues()[queue]["depth"]


def _bodies(b: LocalBroker, queue: str) -> list[bytes]:
    out: list[bytes] = []
    for g in b.receive(queue, max_groups=100):
        out += [m.body for m in g.messages]
        b.commit(g)
    return out


def test_data_messages_pass_straight_across_both_ways_and_are_audited_as_committed(broker):
    front, inbound, _ = _open(broker)
    broker.apply([Send(front, "Order", [b"o1", b"o2", b"o3"])])

    assert _depth(broker, "RelayQ") == 0  # nothing waited for a reader
    assert _bodies(broker, "BackQ") == [b"o0", b"o1", b"o2", b"o3"]
    assert broker.router("RelayQ", "Relay")["passed_through"] == 3

    target = next(e["conversation_handle"] for e in broker.endpoints() if e["service"] == "Back")
    broker.apply([Send(target, "Reply", [b"r1", b"r2"])])
    assert _depth(broker, "RelayQ") == 0
    got = broker.receive("FrontQ")
    assert [(m.conversation_handle, m.body) for g in got for m in g.messages] == [
        (front, b"r1"),
        (front, b"r2"),
    ]
    assert broker.router("RelayQ", "Relay")["passed_through"] == 5

    relay = [r for r in broker.audit()["records"] if r["queue"] == "RelayQ"]
    assert {r["status"] for r in relay} == {"committed"}
    # o0 through its reader; o1-o3 and both replies at arrival; each once
    ordered = [(r["from_initiator"], r["sequence_number"]) for r in relay]
    assert ordered == [(True, 0), (True, 1), (True, 2), (True, 3), (False, 0), (False, 1)]


def test_a_dialog_begun_without_relays_keeps_its_messages_in_the_queue(broker):
    front, _, _ = _open(broker, relays=False)
    broker.apply([Send(front, "Order", [b"o1", b"o2"])])
    assert _depth(broker, "RelayQ") == 2
    assert broker.router("RelayQ", "Relay")["passed_through"] == 0


def test_while_the_group_is_held_or_has_messages_waiting_arrivals_queue_and_order_holds(broker):
    front, inbound, outbound = _open(broker)
    broker.apply([Timer(inbound, 0.05)])  # a DialogTimer: the group's reader is busy with it
    held = _one_group(broker, "RelayQ")
    assert [m.message_type for m in held.messages] == [DIALOG_TIMER]
    broker.apply([Send(front, "Order", [b"o1", b"o2"])])
    assert _depth(broker, "RelayQ") == 3  # the held timer and the two that arrived
    broker.commit(held)
    broker.apply([Send(front, "Order", [b"o3"])])  # the group still has o1, o2 waiting
    assert _depth(broker, "RelayQ") == 3
    g = _one_group(broker, "RelayQ")
    bodies = [m.body for m in g.messages]
    assert bodies == [b"o1", b"o2", b"o3"]
    broker.commit(g, ops=[Send(outbound, "Order", bodies)])  # the handler forwards them
    broker.apply([Send(front, "Order", [b"o4"])])  # idle again: straight across
    assert _depth(broker, "RelayQ") == 0
    assert _bodies(broker, "BackQ") == [b"o0", b"o1", b"o2", b"o3", b"o4"]
    assert broker.router("RelayQ", "Relay")["passed_through"] == 1


def test_an_arrival_queued_earlier_in_the_same_transaction_keeps_the_next_in_the_queue(broker):
    _, _, outbound = _open(broker)
    g = broker.groups("RelayQ")[0]["conversation_group_id"]
    other = Begin("Relay", "Back", "Sales", related_group=g)  # in the group, relaying nothing
    broker.apply([other, Send(other.handle, "Order", [b"z0"])])
    targets = {}
    for grp in broker.receive("BackQ", max_groups=10):
        targets.update({m.body: m.conversation_handle for m in grp.messages})
        broker.commit(grp)
    # one transaction: a reply on the other dialog is queued, then one on the relayed dialog
    broker.apply([Send(targets[b"z0"], "Reply", [b"z"]), Send(targets[b"o0"], "Reply", [b"r"])])
    assert _depth(broker, "RelayQ") == 2  # both wait: the second may not pass the first
    assert broker.router("RelayQ", "Relay")["passed_through"] == 0


def test_an_end_takes_the_queue_and_nothing_passes_after_the_relay_ends(broker):
    front, inbound, outbound = _open(broker)
    broker.apply([End(front)])
    g = _one_group(broker, "RelayQ")
    assert [m.message_type for m in g.messages] == [END_DIALOG]
    broker.commit(g, ops=[End(outbound), End(inbound)])
    assert broker.router("RelayQ", "Relay")["passed_through"] == 0


def test_a_disabled_queue_holds_arrivals_for_its_readers(broker):
    front, _, _ = _open(broker)
    broker.alter(Queue, "RelayQ", enabled=False)
    broker.apply([Send(front, "Order", [b"o1"])])
    assert _depth(broker, "RelayQ") == 1


def test_relaying_survives_a_restart(path):
    with LocalBroker("relay", path) as b:
        _define(b)
        front, _, _ = _open(b)
    with LocalBroker("relay", path) as b:
        b.apply([Send(front, "Order", [b"o1"])])
        assert _depth(b, "RelayQ") == 0
        assert _bodies(b, "BackQ") == [b"o0", b"o1"]


@pytest.mark.parametrize(
    "case, why",
    [
        ("initiator", "is the initiator side of its dialog"),
        ("group", "is in another conversation group"),
        ("contract", "is on contract 'Sales', not 'Other'"),
        ("twice", "already relays another dialog"),
        ("unknown", "conversation"),
    ],
)
def test_a_begin_that_cannot_relay_is_refused_and_changes_nothing(broker, case, why):
    front, inbound, _ = _open(broker, relays=case != "twice")
    g = broker.groups("RelayQ")[0]["conversation_group_id"]
    op = {
        "initiator": Begin("Front", "Back", "Sales", relays=front),
        "group": Begin("Relay", "Back", "Sales", relays=inbound),
        "contract": Begin("Relay", "Back", "Other", related_group=g, relays=inbound),
        "twice": Begin("Relay", "Back", "Sales", related_group=g, relays=inbound),
        "unknown": Begin("Relay", "Back", "Sales", related_group=g, relays="no-such-handle"),
    }[case]
    if case == "twice":  # a first relay of that dialog, then a second one
        broker.apply([Begin("Relay", "Back", "Sales", related_group=g, relays=inbound)])
    before = broker.endpoints()
    with pytest.raises(Exception, match=why) as err:
        broker.apply([op, Send(op.handle, "Order", [b"x"])])
    assert isinstance(err.value, InvalidArgument) or case == "unknown"
    assert broker.endpoints() == before
