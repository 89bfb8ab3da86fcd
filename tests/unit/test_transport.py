"""The transport between brokers, without Ray: several in-process `BrokerCore`s on real
:memory: stores and one fake clock, each with the real `Courier` (failover, relaying, the
forward buffer) over in-process peers, as the broker actor has it over Ray."""

from __future__ import annotations

import asyncio
from collections import Counter

import msgpack
import pytest

from actors.calls.envelope import Begin, End, Message, Send
from actors.client.local import LocalBroker
from actors.core import BrokerCore, Limits
from actors.errors import BrokerError, ConversationEnded, UnknownBroker
from actors.model.catalog import END_DIALOG, ERROR, Contract, MessageType, Queue, Service
from actors.model.dialogs import CONTRACT_NOT_ACCEPTED, LIFETIME_EXPIRED, parse_error_body
from actors.model.routing import match
from actors.service.broker import BrokerService
from actors.store.database import Store
from actors.transport import (
    CONVERSATION_NOT_FOUND,
    MESSAGE_REFUSED,
    RETRY_MAX_S,
    RETRY_MIN_S,
    Courier,
    Outbound,
)
from actors.transport.inbound import Receiver
from actors.transport.wire import Bundle, read_bundle
from tests.fakes import FakeClock, InProcessPeers

INIT = Service("Init", "InitQ")
TARGET = Service("Target", "TargetQ", ("C",))
LATER = RETRY_MAX_S + 0.01  # past any backoff


class Network:
    """Named brokers and the calls between them, each broker with its real `Courier` over
    `InProcessPeers`. `down` holds the names of unreachable brokers; `calls` every call that got
    through, as (caller, callee)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.cores: dict[str, BrokerCore] = {}
        self.couriers: dict[str, Courier] = {}
        self.down: set[str] = set()
        self.calls: list[tuple[str, str]] = []

    def add(
        self,
        name: str,
        *services: Service,
        forwarding: bool = False,
        json_validation: bool = False,
        limits: Limits | None = None,
        path: str = ":memory:",
    ) -> BrokerCore:
        core = BrokerCore(Store(path), self.clock, limits or Limits(), name)
        core.create(MessageType("Req"))
        core.create(MessageType("Reply"))
        core.create(MessageType("Json", "json" if json_validation else "none"))
        core.create(Contract("C", {"Req": "initiator", "Reply": "target", "Json": "any"}))
        for svc in services:
            if svc.queue not in core.catalog.queues:
                core.create(Queue(svc.queue))
            core.create(svc)
        if forwarding:
            core.configure(forwarding=True)
        self.cores[name] = core
        self.couriers[name] = core.transport.courier(self.peers(name))
        return core

    def restart(self, name: str, path: str, limits: Limits | None = None) -> BrokerCore:
        """The broker `name`, its store the file `path`, stopped and started again."""
        self.cores[name].store.close()
        core = BrokerCore(Store(path), self.clock, limits or Limits(), name)
        self.cores[name] = core
        self.couriers[name] = core.transport.courier(self.peers(name))
        return core

    def peers(self, caller: str) -> InProcessPeers:
        return InProcessPeers(caller, self)

    def close(self) -> None:
        for core in self.cores.values():
            core.store.close()

    def deliver(self, caller: str, callee: str, blob: bytes) -> bytes:
        """One call from `caller` to `callee`, answered by the callee's courier."""
        return asyncio.run(self.peers(caller).deliver(callee, blob, 1.0))

    def send(self, core: BrokerCore, out: Outbound) -> bool:
        """What the broker actor does with a dispatched batch: its courier sends it."""
        return asyncio.run(self.couriers[core.name].send(out))

    def pump(self, rounds: int = 100) -> int:
        """Dispatch and deliver until nothing moves; returns how many batches were sent."""
        sent = 0
        for _ in range(rounds):
            moved = False
            for core in list(self.cores.values()):
                if core.name in self.down:
                    continue
                for out in core.transport.dispatch():
                    self.send(core, out)
                    sent += 1
                    moved = True
            if not moved:
                return sent
        raise AssertionError("the network did not settle")

    def later(self, seconds: float = LATER) -> int:
        """Let the clock pass (past any backoff) and pump again."""
        self.clock.advance(seconds)
        return self.pump()


@pytest.fixture
def net():
    n = Network(FakeClock())
    yield n
    n.close()


def route(core: BrokerCore, table: str, name: str, service, address, broker=None, **kw):
    record = {"name": name, "service_name": service, "broker_instance": broker, "address": address}
    return core.create_route(table, {**record, **kw})


@pytest.fixture
def pair(net):
    """A hosts Init, B hosts Target; each has a route to the other for the far service."""
    a = net.add("A", INIT)
    b = net.add("B", TARGET)
    route(a, "routes", "ToTarget", "Target", "ray://B")
    route(b, "routes", "ToInit", "Init", "ray://A", a.broker_id)
    return a, b


def begin(core: BrokerCore, *bodies: bytes, to: str = "Target", frm: str = "Init", **kw) -> str:
    """A dialog from `frm` to `to` with `bodies`; encryption off (the brokers have no security
    configured: tests/unit/test_dialog_security.py covers it)."""
    op = Begin(frm, to, "C", **{"encryption": False, **kw})
    core.apply([op, Send(op.handle, "Req", list(bodies))] if bodies else [op])
    return op.handle


def send(core: BrokerCore, handle: str, *bodies: bytes, mt: str = "Req") -> None:
    core.apply([Send(handle, mt, list(bodies))])


def take(core: BrokerCore, queue: str) -> list[Message]:
    """RECEIVE everything waiting on a queue, and commit."""
    out: list[Message] = []
    while groups := core.receive(queue, max_groups=1000):
        for g in groups:
            out += g.messages
        core.settle(commit=[g.lock_id for g in groups])
    return out


def endpoint(core: BrokerCore, *, handle: str | None = None, conv: str | None = None) -> dict:
    (ep,) = [
        e
        for e in core.endpoints_view()
        if e["conversation_handle"] == handle or e["conversation_id"] == conv
    ]
    return ep


def conv_of(core: BrokerCore, handle: str) -> str:
    return endpoint(core, handle=handle)["conversation_id"]


def unpack(reply: bytes) -> tuple[list, list]:
    acks, refused = msgpack.unpackb(reply, raw=False)
    return acks, refused


def past_closed_retention(net: Network, *cores: BrokerCore) -> None:
    """Let the closed retention pass: the brokers purge their closed endpoints."""
    net.clock.advance(Limits().closed_retention_s + 1)
    for core in cores:
        core.tick()


def kinds(core: BrokerCore) -> list[str]:
    return [e["kind"] for e in core.events_view()]


# --- a dialog between two brokers --------------------------------------------------------------


def test_messages_of_a_dialog_arrive_at_the_far_broker_in_order_exactly_once(net, pair):
    a, b = pair
    h = begin(a, b"m0", b"m1")
    send(a, h, b"m2")
    send(a, h, b"m3", b"m4")

    net.pump()
    net.later()  # nothing more goes out: each message arrived once

    got = take(b, "TargetQ")
    assert [(m.sequence_number, m.body) for m in got] == [(i, f"m{i}".encode()) for i in range(5)]
    assert {m.conversation_id for m in got} == {conv_of(a, h)}
    assert {m.far_service for m in got} == {"Init"}
    assert b.depth("TargetQ") == (0, 5)


def test_the_transmission_queue_empties_as_acknowledgements_arrive(net, pair):
    a, b = pair
    h = begin(a, b"m0", b"m1", b"m2")
    assert [r["sequence_number"] for r in a.transmission_view()] == [0, 1, 2]

    (out,) = a.transport.dispatch()
    assert a.transport.dispatch() == []  # the dialog is in flight: not sent twice at once
    reply = net.deliver("A", "B", out.blob())
    assert len(a.transmission_view()) == 3  # not acknowledged yet

    a.transport.acknowledged(out, reply)

    assert a.transmission_view() == []
    assert not a.transport.pending
    assert endpoint(b, conv=conv_of(a, h))["receive_sequence"] == 3


def test_while_a_call_is_in_flight_what_comes_due_for_its_hops_goes_in_the_next_call(net):
    a = net.add("A", INIT, limits=Limits(batch_rows=4))
    b = net.add("B", TARGET)
    route(a, "routes", "ToTarget", "Target", "ray://B")
    begin(a, b"x0")
    (first,) = a.transport.dispatch()
    begin(a, b"y0")
    begin(a, b"z0", b"z1")
    read, rows_read = a.store.due_transmission, []

    def due(*args):
        rows = read(*args)
        rows_read.append(len(rows))
        return rows

    a.store.due_transmission = due
    assert a.transport.dispatch() == []  # three messages wait for the call in flight
    assert a.transport.dispatch() == []  # and are not read again while they wait
    assert rows_read == [2, 0]
    a.transport.acknowledged(first, net.deliver("A", "B", first.blob()))
    (second,) = a.transport.dispatch()  # then go together, in one call
    assert [len(bd.seqs) for bd in second.bundles] == [1, 2]
    begin(a, b"w0", b"w1", b"w2", b"w3")
    (full,) = a.transport.dispatch()  # a full call's worth goes beside the one in flight
    assert [len(bd.seqs) for bd in full.bundles] == [4]
    a.transport.release(second)
    a.transport.release(second)  # once per call: the second release changes nothing
    assert a.transport.dispatch() == []  # `full` is still in flight, and nothing else waits
    a.transport.acknowledged(full, net.deliver("A", "B", full.blob()))
    a.transport.acknowledged(second, net.deliver("A", "B", second.blob()))
    assert a.transmission_view() == []
    assert sorted(m.body for m in take(b, "TargetQ")) == [b"w0", b"w1", b"w2", b"w3", b"x0",
                                                          b"y0", b"z0", b"z1"]  # fmt: skip


def test_a_send_cancelled_in_flight_leaves_its_messages_to_go_in_the_next_call(net, pair):
    a, b = pair
    begin(a, b"m0")
    (out,) = a.transport.dispatch()
    held = asyncio.Event()

    async def never(blob: bytes) -> bytes:
        held.set()
        await asyncio.Event().wait()
        return b""

    net.couriers["B"].deliver = never

    async def cancelled() -> None:
        task = asyncio.create_task(net.couriers["A"].send(out))
        await held.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled())
    begin(a, b"n0")
    (again,) = a.transport.dispatch()  # neither the dialog nor the hop is held by the lost call
    assert sorted(len(bd.seqs) for bd in again.bundles) == [1, 1]


def test_the_first_acknowledgement_pins_the_far_broker_id_on_the_initiator_endpoint(net, pair):
    a, b = pair
    h = begin(a, b"hello")
    assert endpoint(a, handle=h)["far_broker"] is None

    net.pump()

    assert endpoint(a, handle=h)["far_broker"] == b.broker_id
    assert endpoint(b, conv=conv_of(a, h))["far_broker"] == a.broker_id


def test_replies_come_back_over_a_route_to_the_initiator_broker(net, pair):
    a, b = pair
    h = begin(a, b"question")
    net.pump()
    (msg,) = take(b, "TargetQ")

    send(b, msg.conversation_handle, b"answer", mt="Reply")
    assert len(b.transmission_view()) == 1
    net.pump()

    (reply,) = take(a, "InitQ")
    assert (reply.conversation_handle, reply.message_type, reply.body) == (h, "Reply", b"answer")
    assert reply.sequence_number == 0
    assert b.transmission_view() == []
    assert endpoint(a, handle=h)["state"] == "CONVERSING"


def test_replies_come_back_over_a_transport_route_when_the_service_name_carries_the_broker(net):
    init = Service("ray://A/Init", "InitQ")
    a = net.add("A", init)
    b = net.add("B", TARGET)
    route(a, "routes", "ToTarget", "Target", "ray://B")
    route(b, "routes", "ByName", None, "TRANSPORT")
    h = begin(a, b"question", frm=init.name)
    net.pump()
    (msg,) = take(b, "TargetQ")

    send(b, msg.conversation_handle, b"answer", mt="Reply")
    net.pump()

    (reply,) = take(a, "InitQ")
    assert (reply.conversation_handle, reply.body) == (h, b"answer")
    assert b.transmission_view() == []


def test_without_a_route_back_replies_wait_in_the_target_transmission_queue(net):
    a = net.add("A", INIT)
    b = net.add("B", TARGET)
    route(a, "routes", "ToTarget", "Target", "ray://B")
    begin(a, b"question")
    net.pump()
    (msg,) = take(b, "TargetQ")

    send(b, msg.conversation_handle, b"answer", mt="Reply")
    net.pump()

    (row,) = b.transmission_view()
    assert "no usable next hop for service 'Init'" in row["transmission_status"]
    assert take(a, "InitQ") == []
    route(b, "routes", "ToInit", "Init", "ray://A", a.broker_id)
    net.later()
    assert [m.body for m in take(a, "InitQ")] == [b"answer"]


# --- duplicates and gaps -----------------------------------------------------------------------


def test_a_batch_delivered_twice_is_taken_once_and_acknowledged_again(net, pair):
    a, b = pair
    h = begin(a, b"m0", b"m1")
    conv = conv_of(a, h)
    (out,) = a.transport.dispatch()

    first = net.deliver("A", "B", out.blob())
    second = net.deliver("A", "B", out.blob())

    ack = [conv, True, 0, 1, b.broker_id, None, ""]
    assert unpack(first) == ([ack], [])
    assert unpack(second) == ([ack], [])
    assert b.depth("TargetQ") == (2, 0)
    a.transport.acknowledged(out, second)
    assert a.transmission_view() == []
    assert [m.body for m in take(b, "TargetQ")] == [b"m0", b"m1"]


def test_a_resend_overlapping_what_arrived_acknowledges_both_ranges_and_delivers_only_the_new(
    net, pair
):
    a, b = pair
    h = begin(a, b"m0", b"m1")
    conv = conv_of(a, h)
    (out,) = a.transport.dispatch()
    net.deliver("A", "B", out.blob())
    a.transport.failed(out, "the reply was lost")  # so m0, m1 are sent again with m2
    send(a, h, b"m2")

    net.later()

    assert a.transmission_view() == []
    got = take(b, "TargetQ")
    assert [(m.sequence_number, m.body) for m in got] == [(0, b"m0"), (1, b"m1"), (2, b"m2")]
    # what the resend's reply said, replayed by hand:
    bundle = [conv, "Init", "Target", None, a.broker_id, True, "C", None, 16]
    bundle += [[1, 2], ["Req", "Req"], [b"m1", b"m2"], [0.0, 0.0]]
    acks, refused = unpack(net.deliver("A", "B", msgpack.packb([bundle], use_bin_type=True)))
    assert acks == [[conv, True, 1, 2, b.broker_id, None, ""]]
    assert b.depth("TargetQ") == (0, 3)


def test_later_sequence_numbers_first_wait_for_the_resend_then_arrive_in_order(net, pair):
    a, b = pair
    h = begin(a, b"m0")
    net.pump()
    send(a, h, b"m1", b"m2", b"m3")
    (out,) = a.transport.dispatch()
    sent = read_bundle(msgpack.unpackb(out.blob(), raw=False)[0])
    assert sent.seqs == [1, 2, 3]
    gap = list(sent)[:9] + [col[1:] for col in sent[9:13]] + list(sent)[13:]  # m2, m3, not m1

    reply = net.deliver("A", "B", msgpack.packb([gap], use_bin_type=True))

    assert unpack(reply) == ([], [])
    assert endpoint(b, conv=conv_of(a, h))["receive_sequence"] == 1
    a.transport.acknowledged(out, reply)
    rows = a.transmission_view()
    assert [r["sequence_number"] for r in rows] == [1, 2, 3]
    assert {r["transmission_status"] for r in rows} == {"ray://B: sent, not acknowledged yet"}
    assert net.pump() == 0  # retried only when due

    net.later(RETRY_MIN_S)

    assert a.transmission_view() == []
    got = take(b, "TargetQ")
    assert [(m.sequence_number, m.body) for m in got] == [(i, f"m{i}".encode()) for i in range(4)]


def test_a_bundle_past_the_first_message_for_an_unknown_dialog_is_refused_as_not_found(net, pair):
    # A sender's bundle always starts at its oldest unacknowledged message, so a bundle that
    # starts past sequence 0 for a conversation the target does not know means the target's
    # endpoint was there (it acknowledged the earlier messages) and was cleaned up since.
    a, b = pair
    begin(a, b"m0", b"m1")
    (out,) = a.transport.dispatch()
    sent = read_bundle(msgpack.unpackb(out.blob(), raw=False)[0])
    gap = list(sent)[:9] + [col[1:] for col in sent[9:13]] + list(sent)[13:]

    reply = net.deliver("A", "B", msgpack.packb([gap], use_bin_type=True))

    [ack], refused = unpack(reply)
    assert ack[5] == CONVERSATION_NOT_FOUND and refused == []
    assert b.endpoints_view() == []  # no endpoint made up in the middle of a dialog


def test_a_dialog_whose_target_was_cleaned_up_errors_on_the_initiator(net, pair):
    a, b = pair
    h = begin(a, b"m0")
    net.pump()
    [target] = b.endpoints_view()
    b.apply([End(target["conversation_handle"], cleanup=True)])
    a.apply([Send(h, "Req", b"m1")])
    net.pump()
    assert [m.message_type for m in take(a, "InitQ")] == ["Error"]
    assert endpoint(a, handle=h)["state"] == "ERROR"


def test_a_first_batch_resent_after_its_target_ended_with_cleanup_is_not_delivered_again(net, pair):
    # the target took m0, m1 and its acknowledgement was lost; then it ended the dialog WITH
    # CLEANUP (which tells nobody), and the initiator resends from m0
    a, b = pair
    h = begin(a, b"m0", b"m1")
    (out,) = a.transport.dispatch()
    net.deliver("A", "B", out.blob())
    a.transport.failed(out, "the reply was lost")
    assert [m.body for m in take(b, "TargetQ")] == [b"m0", b"m1"]
    [target] = b.endpoints_view()
    b.apply([End(target["conversation_handle"], cleanup=True)])
    send(a, h, b"m2")

    net.later()

    assert take(b, "TargetQ") == [] and b.endpoints_view() == []  # m0, m1 not again
    assert a.transmission_view() == []  # m0, m1 acknowledged; m2 refused
    [err] = take(a, "InitQ")
    assert err.message_type == "Error" and "has ended on B" in parse_error_body(err.body)[1]
    assert endpoint(a, handle=h)["state"] == "ERROR"


def _stale_first_batch(net, pair) -> tuple[bytes, str]:
    """A dialog's first batch as it went out, kept; then the dialog runs to its end on both
    brokers and both sides are purged."""
    a, b = pair
    h = begin(a, b"m0", b"m1")
    conv = conv_of(a, h)
    (out,) = a.transport.dispatch()
    stale = out.blob()
    net.send(a, out)
    assert [m.body for m in take(b, "TargetQ")] == [b"m0", b"m1"]
    b.apply([End(endpoint(b, conv=conv)["conversation_handle"])])
    net.pump()
    a.apply([End(h)])
    net.pump()
    past_closed_retention(net, a, b)
    assert a.endpoints_view() == [] and b.endpoints_view() == []
    return stale, conv


def test_a_stale_copy_of_a_first_batch_arriving_after_the_target_was_purged_is_not_delivered(
    net, pair
):
    # e.g. a copy a forwarder relayed late: the dialog has ended and both sides are gone
    a, b = pair
    stale, conv = _stale_first_batch(net, pair)

    reply = net.deliver("A", "B", stale)

    assert unpack(reply) == ([[conv, True, 0, 1, b.broker_id, None, ""]], [])
    assert take(b, "TargetQ") == [] and b.endpoints_view() == []


def test_a_purged_target_is_forgotten_after_the_ended_retention(net, pair):
    a, b = pair
    stale, conv = _stale_first_batch(net, pair)
    assert b.store.ended_recv_seqs([conv]) == {conv: 2}
    assert a.store.ended_recv_seqs([conv]) == {}  # only a target remembers (it opens on arrival)

    net.clock.advance(Limits().ended_retention_s + Limits().prune_every_s)
    b.tick()

    assert b.store.ended_recv_seqs([conv]) == {}


def test_a_dialog_within_one_broker_leaves_nothing_remembered_when_it_ends(net):
    a = net.add("A", INIT, TARGET)
    h = begin(a, b"m0")
    conv = conv_of(a, h)
    take(a, "TargetQ")
    [t] = [e for e in a.endpoints_view() if e["conversation_handle"] != h]
    a.apply([End(t["conversation_handle"], cleanup=True), End(h, cleanup=True)])

    assert a.endpoints_view() == []
    assert a.store.ended_recv_seqs([conv]) == {}


# --- no route: delayed, not an error -------------------------------------------------------------


def test_a_dialog_with_no_route_is_delayed_with_a_status_and_delivered_once_a_route_exists(net):
    a = net.add("A", INIT)
    b = net.add("B", TARGET)
    route(b, "routes", "ToInit", "Init", "ray://A", a.broker_id)
    h = begin(a, b"m0", b"m1")  # no error: AutoCreatedLocal matches, but Target is not here

    net.pump()

    rows = a.transmission_view()
    assert [r["sequence_number"] for r in rows] == [0, 1]
    for r in rows:
        assert "no usable next hop for service 'Target'" in r["transmission_status"]
        assert "waiting for a route" in r["transmission_status"]
        assert r["attempts"] == 1
    assert take(a, "InitQ") == []  # no Error
    assert endpoint(a, handle=h)["state"] == "CONVERSING"

    route(a, "routes", "ToTarget", "Target", "ray://B")
    net.later()

    assert a.transmission_view() == []
    assert [m.body for m in take(b, "TargetQ")] == [b"m0", b"m1"]


def test_with_no_route_at_all_the_status_says_the_dialog_is_delayed_and_how_to_fix_it(net):
    a = net.add("A", INIT)
    b = net.add("B", TARGET)
    a.drop_route("routes", "AutoCreatedLocal")
    begin(a, b"m0")

    net.pump()
    net.later()

    (row,) = a.transmission_view()
    assert row["transmission_status"].startswith("delayed: no live route matches service")
    assert "Create a route for 'Target'" in row["transmission_status"]
    assert row["attempts"] == 2
    route(a, "routes", "ToTarget", "Target", "ray://B")
    net.later()
    assert [m.body for m in take(b, "TargetQ")] == [b"m0"]


# --- an unreachable broker ---------------------------------------------------------------------


def test_an_unreachable_broker_keeps_messages_queued_with_why_and_growing_backoff(net, pair):
    a, b = pair
    net.down.add("B")
    h = begin(a, b"m0", b"m1")

    for attempts, delay in [(1, 0.05), (2, 0.1), (3, 0.2), (4, 0.4)]:
        net.pump()
        rows = a.transmission_view()
        assert [r["sequence_number"] for r in rows] == [0, 1]
        for r in rows:
            assert r["transmission_status"] == (
                "ray://B: broker 'B' is not running; its messages wait until it starts"
            )
            assert r["attempts"] == attempts
            assert r["next_attempt_at"] == pytest.approx(net.clock.now + delay)
        assert net.pump() == 0  # not due again before its backoff
        net.clock.advance(delay)
    assert endpoint(a, handle=h)["far_broker"] is None


def test_when_an_unreachable_broker_comes_back_everything_arrives_once_in_order(net, pair):
    a, b = pair
    net.down.add("B")
    h = begin(a, b"m0")
    net.pump()
    send(a, h, b"m1")
    net.later(0.05)
    send(a, h, b"m2", b"m3")
    net.later(0.05)
    assert len(a.transmission_view()) == 4

    net.down.discard("B")
    net.later()

    assert a.transmission_view() == []
    got = take(b, "TargetQ")
    assert [(m.sequence_number, m.body) for m in got] == [(i, f"m{i}".encode()) for i in range(4)]
    net.later()
    assert take(b, "TargetQ") == []


def test_the_backoff_stops_growing_at_five_seconds(net, pair):
    a, _ = pair
    net.down.add("B")
    begin(a, b"m0")
    for _ in range(12):
        net.later()
    (row,) = a.transmission_view()
    assert row["attempts"] == 12
    assert row["next_attempt_at"] == pytest.approx(net.clock.now + RETRY_MAX_S)


# --- routes ahead of brokers ---------------------------------------------------------------------


def test_a_route_may_name_a_broker_that_starts_later_and_its_messages_wait_for_it(net):
    a = net.add("A", INIT)
    route(a, "routes", "ToTarget", "Target", "ray://B")  # B is not running yet
    h = begin(a, b"m0", b"m1")

    net.pump()
    net.later(0.05)

    rows = a.transmission_view()
    assert [r["sequence_number"] for r in rows] == [0, 1]
    for r in rows:
        assert r["transmission_status"] == (
            "ray://B: broker 'B' is not running; its messages wait until it starts"
        )
        assert r["attempts"] == 2
    b = net.add("B", TARGET)  # now it starts
    net.later()

    assert a.transmission_view() == []
    assert [m.body for m in take(b, "TargetQ")] == [b"m0", b"m1"]
    assert endpoint(a, handle=h)["far_broker"] == b.broker_id


def _service_routes(net, *calls: tuple[str, tuple]) -> list:
    """Route verbs on a `BrokerService` "A" whose peers are the network's brokers; each call's
    result (or the error it raised)."""

    async def run() -> list:
        svc = BrokerService("A", ":memory:", peers=net.peers("A"))
        out: list = []
        try:
            for verb, args in calls:
                try:
                    out.append(await getattr(svc, verb)(*args))
                except Exception as exc:
                    out.append(exc)
            out.append(svc.core.routes_view("routes"))
        finally:
            await svc.close()
        return out

    return asyncio.run(run())


def test_creating_or_altering_a_route_to_a_broker_not_running_succeeds_with_a_warning(net):
    record = {"name": "ToB", "service_name": "Target", "address": "ray://B"}

    created, altered, routes = _service_routes(
        net,
        ("create_route", ("routes", record, "r1")),
        ("alter_route", ("routes", "ToB", {"mirror_address": "ray://C"}, "r2")),
    )

    assert created == [
        "route 'ToB': broker 'B' is not running yet; messages routed to it wait in the "
        "transmission queue and go when it starts"
    ]
    assert altered == [created[0].replace("broker 'B'", "broker 'C'")]  # only what changed
    [made] = [r for r in routes if r["name"] == "ToB"]
    assert (made["address"], made["mirror_address"]) == ("ray://B", "ray://C")


def test_a_route_that_the_core_refuses_gives_no_warning_and_changes_nothing(net):
    bad = {"name": "ToB", "service_name": "Target", "address": "ray://B", "lifetime": -1}

    [refused, routes] = _service_routes(net, ("create_route", ("routes", bad, "r1")))

    assert isinstance(refused, BrokerError)
    assert [r["name"] for r in routes] == ["AutoCreatedLocal"]


def test_an_in_process_broker_refuses_a_route_to_another_broker():
    with LocalBroker("solo") as solo:
        with pytest.raises(UnknownBroker, match="runs in process without peers"):
            solo.create_route("ToB", "Target", address="ray://B")
        assert solo.create_route("Self", "Target", address="ray://solo") == []
        assert [r["name"] for r in solo.routes()] == ["AutoCreatedLocal", "Self"]


# --- load balancing (seed 002) -----------------------------------------------------------------


@pytest.fixture
def balanced(net):
    """A routes Target to two broker ids, B and C (seed 002's LoadBalancingRoute1/2)."""
    a = net.add("A", INIT)
    b = net.add("B", TARGET)
    c = net.add("C", TARGET)
    route(a, "routes", "LoadBalancingRoute1", "Target", "ray://B", b.broker_id)
    route(a, "routes", "LoadBalancingRoute2", "Target", "ray://C", c.broker_id)
    for far in (b, c):
        route(far, "routes", "ReturnRoute", "Init", "ray://A", a.broker_id)
    return a, b, c


def begin_many(core: BrokerCore, n: int, body: bytes = b"m0") -> list[str]:
    ops: list = []
    for _ in range(n):
        op = Begin("Init", "Target", "C", encryption=False)
        ops += [op, Send(op.handle, "Req", body)]
    core.apply(ops)
    return [op.handle for op in ops[::2]]


def landed(*cores: BrokerCore) -> dict[str, list[str]]:
    """conversation id -> names of the brokers holding a target endpoint for it."""
    out: dict[str, list[str]] = {}
    for core in cores:
        for e in core.endpoints_view():
            if not e["is_initiator"]:
                out.setdefault(e["conversation_id"], []).append(core.name)
    return out


def far_brokers(core: BrokerCore, handles: list[str]) -> list[str | None]:
    eps = {e["conversation_handle"]: e for e in core.endpoints_view()}
    return [eps[h]["far_broker"] for h in handles]


def test_3000_dialogs_begun_in_one_batch_split_exactly_evenly_over_three_brokers(net, balanced):
    a, b, c = balanced
    d = net.add("D", TARGET)
    route(a, "routes", "LoadBalancingRoute3", "Target", "ray://D", d.broker_id)
    route(d, "routes", "ReturnRoute", "Init", "ray://A", a.broker_id)
    handles = begin_many(a, 3000)  # one apply: the round-robin advances within the batch

    net.pump()

    where = landed(b, c, d)
    assert len(where) == 3000 and all(len(names) == 1 for names in where.values())
    assert Counter(names[0] for names in where.values()) == {"B": 1000, "C": 1000, "D": 1000}
    assert a.transmission_view() == []
    ids = {"B": b.broker_id, "C": c.broker_id, "D": d.broker_id}
    convs = {e["conversation_handle"]: e["conversation_id"] for e in a.endpoints_view()}
    assert far_brokers(a, handles) == [ids[where[convs[h]][0]] for h in handles]


def test_every_message_of_a_dialog_goes_to_the_broker_picked_at_begin_across_retries(net, balanced):
    a, b, c = balanced
    handles = begin_many(a, 100)
    ids = sorted([b.broker_id, c.broker_id])
    picked = far_brokers(a, handles)
    assert picked == [ids[i % 2] for i in range(100)]  # pinned at BEGIN, round-robin
    for out in a.transport.dispatch():
        for hop in out.hops:
            net.deliver("A", hop.broker, out.blob())
            break
        a.transport.failed(out, "the replies were lost")  # delivered, nothing acknowledged
    net.down.add("B")  # B's dialogs are retried and wait for B: they never fail over to C
    a.apply([Send(h, "Req", b"m1") for h in handles])
    net.later()
    net.later()

    assert len(take(c, "TargetQ")) == 100  # m0 and m1 of C's 50 dialogs, while B is down
    assert a.depth("InitQ") == (0, 0)  # no dialog was refused anywhere (an Error would be here)
    net.down.discard("B")
    net.later()

    where = landed(b, c)
    names = {b.broker_id: "B", c.broker_id: "C"}
    convs = {e["conversation_handle"]: e["conversation_id"] for e in a.endpoints_view()}
    assert {convs[h]: [names[bi]] for h, bi in zip(handles, picked, strict=True)} == where
    assert len(take(b, "TargetQ")) == 100 and a.transmission_view() == []
    assert a.depth("InitQ") == (0, 0) and far_brokers(a, handles) == picked
    assert {callee for caller, callee in net.calls if caller == "A"} == {"B", "C"}


def test_a_second_route_to_one_broker_id_does_not_skew_the_split(net, balanced):
    a, b, c = balanced
    route(a, "routes", "LoadBalancingRoute3", "Target", "ray://C", c.broker_id)
    begin_many(a, 1000)

    net.pump()

    split = Counter(names[0] for names in landed(b, c).values())
    assert split == {"B": 500, "C": 500}  # turns go over distinct broker ids, not routes


def test_an_explicit_to_broker_is_never_overridden_by_the_round_robin(net, balanced):
    a, b, c = balanced
    handles = [begin(a, b"m0", to_broker=c.broker_id) for _ in range(4)]

    net.pump()

    assert b.endpoints_view() == [] and len(landed(c)) == 4
    assert far_brokers(a, handles) == [c.broker_id] * 4
    assert far_brokers(a, begin_many(a, 2)) == sorted([b.broker_id, c.broker_id])  # no turn taken


@pytest.fixture
def unpinned(net):
    """40 dialogs A began while a route without broker id (step 2) sent Target to a broker that
    never answered: unpinned, as dialogs begun before round-robin are. Then A's routes become
    seed 002's load balancing routes to B and C."""
    a = net.add("A", INIT)
    b = net.add("B", TARGET)
    c = net.add("C", TARGET)
    route(a, "routes", "Old", "Target", "ray://Gone")
    handles = [begin(a, b"m0") for _ in range(40)]
    net.pump()
    assert set(far_brokers(a, handles)) == {None} and len(a.transmission_view()) == 40
    a.drop_route("routes", "Old")
    route(a, "routes", "LoadBalancingRoute1", "Target", "ray://B", b.broker_id)
    route(a, "routes", "LoadBalancingRoute2", "Target", "ray://C", c.broker_id)
    for far in (b, c):
        route(far, "routes", "ReturnRoute", "Init", "ray://A", a.broker_id)
    return a, b, c, handles


def test_a_dialog_begun_unpinned_goes_where_step_3s_hash_picks(net, unpinned):
    a, b, c, handles = unpinned
    routes = a.state.routes["routes"].routes()

    net.later()

    where = landed(b, c)
    names = {b.broker_id: "B", c.broker_id: "C"}
    convs = {e["conversation_handle"]: e["conversation_id"] for e in a.endpoints_view()}
    for h in handles:
        m = match(routes, "Target", None, convs[h], net.clock.now, local_broker_id=a.broker_id)
        assert where[convs[h]] == [names[m.broker_instance]]
    assert set(Counter(n[0] for n in where.values())) == {"B", "C"}


def test_step_3s_hash_pick_skips_a_draining_route(net, unpinned):
    a, b, c, handles = unpinned
    a.alter_route("routes", "LoadBalancingRoute2", {"draining": True})

    net.later()

    assert len(landed(b)) == 40 and c.endpoints_view() == []
    assert set(far_brokers(a, handles)) == {b.broker_id}


def test_a_draining_broker_keeps_its_dialogs_takes_no_new_ones_and_can_then_be_dropped(
    net, balanced
):
    """Removing a replica: mark its routes draining, let its dialogs finish, drop the routes."""
    a, b, c = balanced
    old = begin_many(a, 10)
    net.pump()
    on_c = [h for h, bi in zip(old, far_brokers(a, old), strict=True) if bi == c.broker_id]
    assert len(on_c) == 5
    a.alter_route("routes", "LoadBalancingRoute2", {"draining": True})
    (view,) = [r for r in a.routes_view("routes") if r["name"] == "LoadBalancingRoute2"]
    assert view["draining"] is True

    new = begin_many(a, 10)
    a.apply([Send(h, "Req", b"m1") for h in on_c])  # C still serves the dialogs pinned to it
    net.pump()

    assert set(far_brokers(a, new)) == {b.broker_id}
    assert len(landed(c)) == 5 and len(take(c, "TargetQ")) == 10
    assert len(landed(b)) == 15 and a.transmission_view() == []

    a.apply([End(h) for h in on_c])
    net.pump()
    a.drop_route("routes", "LoadBalancingRoute2")
    begin_many(a, 4)
    net.pump()
    assert len(landed(b)) == 19 and len(landed(c)) == 5


# --- high availability (seed 002) --------------------------------------------------------------


@pytest.fixture
def gateways(net):
    """A reaches B only through GatewayA or GatewayB (seed 002's high availability example)."""
    a = net.add("A", INIT)
    b = net.add("B", TARGET)
    gws = [net.add(n, forwarding=True) for n in ("GatewayA", "GatewayB")]
    for i, gw in enumerate(gws, 1):
        route(a, "routes", f"HighAvailabilityRoute{i}", "Target", f"ray://{gw.name}", b.broker_id)
        route(b, "routes", f"ReturnRoute{i}", "Init", f"ray://{gw.name}", a.broker_id)
        route(gw, "instance", "ForwardingRoute", "Target", "ray://B", b.broker_id)
        route(gw, "instance", "ForwardingReturnRoute", "Init", "ray://A", a.broker_id)
    return a, b


def test_with_one_forwarder_down_messages_and_replies_flow_through_the_other(net, gateways):
    a, b = gateways
    net.down.add("GatewayA")
    h = begin(a, b"m0", b"m1")

    net.pump()

    got = take(b, "TargetQ")
    assert [m.body for m in got] == [b"m0", b"m1"]
    assert ("A", "GatewayB") in net.calls and ("GatewayB", "B") in net.calls
    assert a.transmission_view() == []
    assert endpoint(a, handle=h)["far_broker"] == b.broker_id  # the owner acked, not a gateway

    send(b, got[0].conversation_handle, b"answer", mt="Reply")
    net.pump()
    assert [m.body for m in take(a, "InitQ")] == [b"answer"]
    assert ("B", "GatewayB") in net.calls and ("GatewayB", "A") in net.calls
    assert not any("GatewayA" in call for call in net.calls)

    net.down = {"GatewayB"}
    send(a, h, b"m2")
    net.pump()
    assert [m.body for m in take(b, "TargetQ")] == [b"m2"]
    assert ("GatewayA", "B") in net.calls


def test_a_forwarder_passes_a_bundle_on_with_one_hop_less_and_the_rest_as_it_came(
    net, gateways, monkeypatch
):
    a, b = gateways
    net.down.add("GatewayA")
    blobs: dict[tuple[str, str], bytes] = {}
    real = InProcessPeers.deliver

    async def recorded(peers, broker, blob, timeout):
        blobs[(peers.caller, broker)] = blob
        return await real(peers, broker, blob, timeout)

    monkeypatch.setattr(InProcessPeers, "deliver", recorded)
    begin(a, b"m0", b"m1")
    net.pump()

    [came] = [read_bundle(r) for r in msgpack.unpackb(blobs[("A", "GatewayB")], raw=False)]
    [went] = [read_bundle(r) for r in msgpack.unpackb(blobs[("GatewayB", "B")], raw=False)]
    assert went.hops_left == came.hops_left - 1
    assert went._replace(hops_left=came.hops_left) == came
    assert [m.body for m in take(b, "TargetQ")] == [b"m0", b"m1"]


def test_the_target_drops_the_duplicate_when_both_forwarders_deliver_a_batch(net, gateways):
    a, b = gateways
    h = begin(a, b"m0", b"m1")
    conv = conv_of(a, h)
    (out,) = a.transport.dispatch()
    assert sorted(hop.broker for hop in out.hops) == ["GatewayA", "GatewayB"]

    via_a = net.deliver("A", "GatewayA", out.blob())
    via_b = net.deliver("A", "GatewayB", out.blob())

    ack = [conv, True, 0, 1, b.broker_id, None, ""]
    assert unpack(via_a) == ([ack], []) and unpack(via_b) == ([ack], [])
    a.transport.acknowledged(out, via_b)
    assert a.transmission_view() == []
    assert [m.body for m in take(b, "TargetQ")] == [b"m0", b"m1"]
    assert len(b.endpoints_view()) == 1


def test_with_both_forwarders_down_messages_wait_with_backoff(net, gateways):
    a, _ = gateways
    net.down.update({"GatewayA", "GatewayB"})
    begin(a, b"m0")

    net.pump()
    net.later(0.05)

    (row,) = a.transmission_view()
    assert row["attempts"] == 2
    assert "is not running; its messages wait until it starts" in row["transmission_status"]


# --- forwarding --------------------------------------------------------------------------------


@pytest.fixture
def via_forwarder(net):
    """A reaches B through F (forwarding off until a test turns it on)."""
    a = net.add("A", INIT)
    b = net.add("B", TARGET)
    f = net.add("F")
    route(a, "routes", "ToTarget", "Target", "ray://F")
    route(b, "routes", "ToInit", "Init", "ray://F", a.broker_id)
    route(f, "instance", "FwdTarget", "Target", "ray://B")
    route(f, "instance", "FwdInit", "Init", "ray://A", a.broker_id)
    return a, b, f


def test_a_broker_with_forwarding_off_refuses_to_relay_and_nothing_is_acknowledged(
    net, via_forwarder
):
    a, b, f = via_forwarder
    h = begin(a, b"m0")
    (out,) = a.transport.dispatch()

    reply = net.deliver("A", "F", out.blob())

    acks, refused = unpack(reply)
    assert acks == []
    assert refused == [
        "F has no way to 'Target': routed by step 2, service without broker instance: "
        "FwdTarget (forwarding is off)"
    ]
    a.transport.acknowledged(out, reply)
    (row,) = a.transmission_view()
    assert row["transmission_status"] == f"ray://F: {refused[0]}"
    assert b.endpoints_view() == [] and f.endpoints_view() == []
    assert endpoint(a, handle=h)["far_broker"] is None


def test_a_forwarder_relays_both_ways_once_forwarding_is_on_and_acks_come_from_the_owner(
    net, via_forwarder
):
    a, b, f = via_forwarder
    h = begin(a, b"m0")
    net.pump()
    assert a.transmission_view() != []

    f.configure(forwarding=True)
    net.later()

    (msg,) = take(b, "TargetQ")
    assert endpoint(a, handle=h)["far_broker"] == b.broker_id
    assert f.endpoints_view() == []
    send(b, msg.conversation_handle, b"answer", mt="Reply")
    net.pump()
    assert [m.body for m in take(a, "InitQ")] == [b"answer"]
    assert a.transmission_view() == [] and b.transmission_view() == []


def test_a_send_and_end_with_cleanup_in_one_call_leave_nothing_waiting_to_go(net, tmp_path):
    """END WITH CLEANUP drops what its endpoint has not got out yet, what the same call sent
    too. A row left behind (as a broker before this fix could leave) is not inherited by a new
    dialog after a restart: the sender drops it, and the new dialog's messages go."""
    path = str(tmp_path / "a.sqlite")
    a = net.add("A", INIT, path=path)
    b = net.add("B", TARGET)
    route(a, "routes", "ToTarget", "Target", "ray://B")
    h = begin(a, b"m0")
    net.pump()
    assert [m.body for m in take(b, "TargetQ")] == [b"m0"]
    gone = a.state.endpoint(h).no

    a.apply([Send(h, "Req", [b"m1"]), End(h, cleanup=True)])
    assert a.endpoints_view() == [] and a.transmission_view() == []

    with a.store.tx():  # the row an older broker left: m1, its endpoint gone
        a.store.insert_transmission([(gone, 1, "Req", [b"m1"], "Target", None, "", 0.0)])
    a = net.restart("A", path)
    begin(a, b"n0")
    net.later()
    assert [m.body for m in take(b, "TargetQ")] == [b"n0"]
    assert a.transmission_view() == []


def test_a_service_created_here_while_a_first_batch_is_on_its_way_does_not_double_it(net):
    """A dialog's first message is on its way to B (a wildcard route beside AutoCreatedLocal)
    when its service is created here: it is not delivered here too (B's answer decides)."""
    a = net.add("A", INIT)
    b = net.add("B", TARGET)
    route(a, "routes", "Anywhere", None, "ray://B")
    begin(a, b"m0")
    (out,) = a.transport.dispatch()  # m0 on its way to B
    a.create(Queue("TargetQ"))
    a.create(Service("Target", "TargetQ", ("C",)))
    net.send(a, out)
    assert [m.body for m in take(a, "TargetQ")] + [m.body for m in take(b, "TargetQ")] == [b"m0"]
    assert a.transmission_view() == []


def test_a_service_altered_while_a_first_batch_is_on_its_way_does_not_double_it(net):
    """The route turns LOCAL while m0 is on its way to B: dispatch leaves the dialog alone until
    B answers, and so does ALTER SERVICE, which delivers what waited for the service here."""
    a = net.add("A", INIT, TARGET)
    b = net.add("B", TARGET)
    route(a, "routes", "ToTarget", "Target", "ray://B")
    begin(a, b"m0")
    (out,) = a.transport.dispatch()
    a.alter_route("routes", "ToTarget", {"address": "LOCAL"})
    assert a.transport.dispatch() == []
    a.alter("service", "Target", {"contracts": ("C", "DEFAULT")})
    net.send(a, out)
    assert [m.body for m in take(a, "TargetQ")] + [m.body for m in take(b, "TargetQ")] == [b"m0"]


def test_a_route_back_to_its_own_broker_through_a_forwarder_loses_and_reorders_nothing(net):
    """A hosts both services but routes Target through the forwarder F, which routes it back:
    the target endpoint appears on A while later messages still wait in A's transmission queue.
    Those sent after that wait behind them, rather than going straight to the new endpoint (and
    being taken for resends when the waiting ones arrive)."""
    a = net.add("A", INIT, TARGET)
    f = net.add("F", forwarding=True)
    route(a, "routes", "ToTarget", "Target", "ray://F")
    route(f, "instance", "FwdTarget", "Target", "ray://A")
    route(f, "instance", "FwdInit", "Init", "ray://A", a.broker_id)
    h = begin(a, b"m0")
    (first,) = a.transport.dispatch()
    send(a, h, b"m1")  # waits behind m0
    net.send(a, first)  # m0 to F, which relays it to A: the target endpoint is now on A
    for out in f.transport.dispatch():
        net.send(f, out)
    assert sorted(e["is_initiator"] for e in a.endpoints_view()) == [False, True]
    send(a, h, b"m2")  # m1 still waits: so does m2
    net.later()
    assert [m.body for m in take(a, "TargetQ")] == [b"m0", b"m1", b"m2"]
    assert a.transmission_view() == []
    send(a, h, b"m3")  # nothing waits any more: straight to the endpoint here
    assert a.transmission_view() == []
    assert [m.body for m in take(a, "TargetQ")] == [b"m3"]


def test_an_unreachable_broker_behind_a_forwarder_is_retried_with_backoff(net, via_forwarder):
    a, b, f = via_forwarder
    f.configure(forwarding=True)
    net.down.add("B")
    begin(a, b"m0")

    for attempts, delay in [(1, 0.05), (2, 0.1), (3, 0.2)]:
        net.pump()
        (row,) = a.transmission_view()
        assert row["transmission_status"] == (
            "ray://F: F could not forward to ray://B: broker 'B' is not running; its messages "
            "wait until it starts"
        )
        assert row["attempts"] == attempts
        assert row["next_attempt_at"] == pytest.approx(net.clock.now + delay)
        net.clock.advance(delay)

    net.down.clear()
    net.pump()
    assert [m.body for m in take(b, "TargetQ")] == [b"m0"]
    assert a.transmission_view() == []


def test_a_routing_loop_between_two_forwarders_is_cut_by_the_hop_count(net):
    a = net.add("A", INIT)
    b = net.add("B", TARGET)
    f1 = net.add("F1", forwarding=True)
    f2 = net.add("F2", forwarding=True)
    route(a, "routes", "ToTarget", "Target", "ray://F1")
    route(f1, "instance", "Loop", "Target", "ray://F2")
    route(f2, "instance", "Loop", "Target", "ray://F1")
    h = begin(a, b"m0")

    net.pump()

    assert "HopLimit" in kinds(f1) + kinds(f2)
    (row,) = a.transmission_view()
    assert "hop limit reached" in row["transmission_status"]
    assert b.endpoints_view() == [] and f1.endpoints_view() == [] and f2.endpoints_view() == []
    assert endpoint(a, handle=h)["far_broker"] is None

    f2.alter_route("instance", "Loop", {"address": "ray://B"})  # the loop is fixed
    net.later()
    net.later()
    assert [m.body for m in take(b, "TargetQ")] == [b"m0"]  # once
    assert a.transmission_view() == []


def test_a_broker_not_forwarding_drops_a_bundle_addressed_to_another_broker_id(net):
    a = net.add("A", INIT)
    b = net.add("B", TARGET)
    c = net.add("C", TARGET)
    route(a, "routes", "Misrouted", "Target", "ray://B", c.broker_id)  # C's id, B's address
    h = begin(a, b"m0", to_broker=c.broker_id)
    (out,) = a.transport.dispatch()

    reply = net.deliver("A", "B", out.blob())

    acks, refused = unpack(reply)
    assert acks == []
    assert refused == [f"B is broker {b.broker_id}, not {c.broker_id}; dropped"]
    assert b.endpoints_view() == [] and b.depth("TargetQ") == (0, 0)
    a.transport.acknowledged(out, reply)
    assert endpoint(a, handle=h)["far_broker"] == c.broker_id  # as begun; nothing pinned it
    (row,) = a.transmission_view()
    assert row["transmission_status"] == f"ray://B: {refused[0]}"
    assert c.endpoints_view() == []


def test_after_the_pin_a_route_to_another_instance_of_the_service_gets_its_messages_dropped(net):
    a = net.add("A", INIT)
    b = net.add("B", TARGET)
    c = net.add("C", TARGET)
    route(a, "routes", "ToTarget", "Target", "ray://B")
    h = begin(a, b"m0")
    net.pump()
    a.drop_route("routes", "ToTarget")
    route(a, "routes", "ToTarget", "Target", "ray://C")

    send(a, h, b"m1")
    net.pump()

    assert c.endpoints_view() == [] and c.depth("TargetQ") == (0, 0)
    (row,) = a.transmission_view()
    assert f"not {b.broker_id}; dropped" in row["transmission_status"]
    assert [m.body for m in take(b, "TargetQ")] == [b"m0"]


# --- validation and contracts on arrival -------------------------------------------------------


def test_a_message_failing_validation_on_arrival_ends_the_dialog_with_an_error_on_both_sides(net):
    a = net.add("A", INIT)  # A does not validate Json: the body leaves unchecked
    b = net.add("B", TARGET, json_validation=True)
    route(a, "routes", "ToTarget", "Target", "ray://B")
    route(b, "routes", "ToInit", "Init", "ray://A", a.broker_id)
    h = begin(a, b"fine")
    net.pump()
    send(a, h, b"{not json", mt="Json")

    net.pump()

    assert a.transmission_view() == []
    (err,) = take(a, "InitQ")
    assert err.message_type == ERROR and err.conversation_handle == h
    code, description = parse_error_body(err.body)
    assert code == MESSAGE_REFUSED and description
    assert endpoint(a, handle=h)["state"] == "ERROR"
    target = endpoint(b, conv=conv_of(a, h))
    assert target["state"] == "ERROR"
    got = take(b, "TargetQ")
    assert [m.message_type for m in got] == ["Req", ERROR]
    assert parse_error_body(got[1].body)[0] == MESSAGE_REFUSED
    with pytest.raises(ConversationEnded):
        send(a, h, b"more")


def test_the_target_not_accepting_the_contract_sends_the_initiator_an_error(net):
    a = net.add("A", INIT)
    b = net.add("B", Service("Target", "TargetQ", ("DEFAULT",)))
    route(a, "routes", "ToTarget", "Target", "ray://B")
    h = begin(a, b"m0")

    net.pump()

    (err,) = take(a, "InitQ")
    assert err.message_type == ERROR
    code, description = parse_error_body(err.body)
    assert code == CONTRACT_NOT_ACCEPTED
    assert "does not accept contract 'C'" in description
    assert endpoint(a, handle=h)["state"] == "ERROR"
    assert b.endpoints_view() == [] and a.transmission_view() == []


# --- ending dialogs across brokers -------------------------------------------------------------


def _conversing(net, pair) -> tuple[BrokerCore, BrokerCore, str, str]:
    a, b = pair
    h = begin(a, b"m0")
    net.pump()
    (msg,) = take(b, "TargetQ")
    return a, b, h, msg.conversation_handle


def test_end_dialog_sent_behind_a_message_arrives_and_both_sides_end_closed(net, pair):
    a, b, h, t = _conversing(net, pair)

    a.apply([Send(h, "Req", b"last"), End(h)])
    assert endpoint(a, handle=h)["state"] == "DISCONNECTED_OUTBOUND"
    net.pump()

    assert [m.message_type for m in take(b, "TargetQ")] == ["Req", END_DIALOG]
    assert endpoint(b, handle=t)["state"] == "DISCONNECTED_INBOUND"
    assert endpoint(a, handle=h)["state"] == "CLOSED"  # its EndDialog was acknowledged
    b.apply([End(t)])
    net.pump()
    assert endpoint(b, handle=t)["state"] == "CLOSED"
    assert a.transmission_view() == [] and b.transmission_view() == []


def test_when_both_sides_end_at_once_each_closes_on_the_far_end_dialog(net, pair):
    a, b, h, t = _conversing(net, pair)

    a.apply([Send(h, "Req", b"x"), End(h)])
    b.apply([Send(t, "Reply", b"y"), End(t)])
    assert endpoint(a, handle=h)["state"] == "DISCONNECTED_OUTBOUND"
    assert endpoint(b, handle=t)["state"] == "DISCONNECTED_OUTBOUND"
    net.pump()

    assert endpoint(a, handle=h)["state"] == "CLOSED"
    assert endpoint(b, handle=t)["state"] == "CLOSED"
    assert a.transmission_view() == [] and b.transmission_view() == []


def test_ending_an_idle_dialog_sends_end_dialog_and_the_initiator_closes_when_it_is_acked(
    net, pair
):
    a, b, h, t = _conversing(net, pair)

    a.apply([End(h)])
    assert endpoint(a, handle=h)["state"] == "DISCONNECTED_OUTBOUND"
    net.pump()

    assert [m.message_type for m in take(b, "TargetQ")] == [END_DIALOG]
    assert endpoint(b, handle=t)["state"] == "DISCONNECTED_INBOUND"
    assert endpoint(a, handle=h)["state"] == "CLOSED"
    b.apply([End(t)])
    assert endpoint(b, handle=t)["state"] == "CLOSED"


def test_the_target_ending_first_closes_both_once_the_initiator_ends(net, pair):
    a, b, h, t = _conversing(net, pair)

    b.apply([End(t)])
    net.pump()
    assert [m.message_type for m in take(a, "InitQ")] == [END_DIALOG]
    assert endpoint(a, handle=h)["state"] == "DISCONNECTED_INBOUND"
    assert endpoint(b, handle=t)["state"] == "CLOSED"

    a.apply([End(h)])
    net.pump()
    assert endpoint(a, handle=h)["state"] == "CLOSED"
    assert a.transmission_view() == []


def test_ending_an_idle_dialog_with_an_error_sends_the_far_side_an_error(net, pair):
    a, b, h, t = _conversing(net, pair)

    a.apply([End(h, error=50001, description="gave up")])
    net.pump()

    (err,) = take(b, "TargetQ")
    assert err.message_type == ERROR and parse_error_body(err.body) == (50001, "gave up")
    assert endpoint(b, handle=t)["state"] == "ERROR"


def test_ended_dialogs_are_purged_on_both_brokers_after_the_closed_retention(net, pair):
    a, b, h, t = _conversing(net, pair)
    a.apply([Send(h, "Req", b"last"), End(h)])
    net.pump()
    b.apply([End(t)])
    net.pump()

    past_closed_retention(net, a, b)

    assert a.endpoints_view() == [] and b.endpoints_view() == []


def test_endpoints_closed_by_crossing_end_dialogs_are_purged_after_the_closed_retention(net, pair):
    a, b, h, t = _conversing(net, pair)
    a.apply([Send(h, "Req", b"x"), End(h)])
    b.apply([Send(t, "Reply", b"y"), End(t)])
    net.pump()
    assert endpoint(a, handle=h)["state"] == endpoint(b, handle=t)["state"] == "CLOSED"

    past_closed_retention(net, a, b)

    assert a.endpoints_view() == [] and b.endpoints_view() == []


# --- lifetime ----------------------------------------------------------------------------------


def test_lifetime_expiry_removes_the_dialogs_waiting_transmission_rows(net, pair):
    a, b = pair
    net.down.add("B")
    h = begin(a, b"m0", b"m1", lifetime=10)
    other = begin(a, b"keep")
    net.pump()
    assert len(a.transmission_view()) == 3

    net.clock.advance(11)
    a.tick()

    rows = a.transmission_view()
    assert [r["conversation_handle"] for r in rows] == [other]
    (err,) = take(a, "InitQ")
    assert err.conversation_handle == h and parse_error_body(err.body)[0] == LIFETIME_EXPIRED
    assert endpoint(a, handle=h)["state"] == "ERROR"
    net.down.clear()
    net.later()
    assert [m.body for m in take(b, "TargetQ")] == [b"keep"]


# --- the multiple target endpoints hazard (seed 002) --------------------------------------------


def test_routes_to_different_brokers_for_one_service_without_broker_ids_warn_and_record_an_event(
    net,
):
    a = net.add("A", INIT)
    assert route(a, "routes", "ToB", "Target", "ray://B") == []

    warnings = route(a, "routes", "ToC", "Target", "ray://C")

    (warning,) = warnings
    assert "multiple target endpoints" in warning and "broker_instance" in warning
    events = [e for e in a.events_view() if e["kind"] == "RouteWarning"]
    assert [(e["subject"], e["detail"]) for e in events] == [("ToC", warning)]


def test_routes_to_different_brokers_with_broker_ids_do_not_warn(net, balanced):
    a, _, _ = balanced
    assert "RouteWarning" not in kinds(a)


def test_a_second_target_endpoint_cannot_reply_into_a_dialog_pinned_to_the_first(net):
    a = net.add("A", INIT)
    b = net.add("B", TARGET)
    c = net.add("C", TARGET)
    route(a, "routes", "ToB", "Target", "ray://B")
    route(a, "routes", "ToC", "Target", "ray://C")  # the hazard
    for far in (b, c):
        route(far, "routes", "ToInit", "Init", "ray://A", a.broker_id)
    h = begin(a, b"m0")
    (out,) = a.transport.dispatch()
    from_b = net.deliver("A", "B", out.blob())
    net.deliver("A", "C", out.blob())  # the transport sent it both ways
    a.transport.acknowledged(out, from_b)  # pinned to B
    assert endpoint(a, handle=h)["far_broker"] == b.broker_id
    (at_c,) = take(c, "TargetQ")
    send(c, at_c.conversation_handle, b"from C", mt="Reply")
    net.pump()  # C's reply reaches A

    (at_b,) = take(b, "TargetQ")
    send(b, at_b.conversation_handle, b"from B", mt="Reply")
    net.pump()

    assert [m.body for m in take(a, "InitQ")] == [b"from B"]


def test_one_dialog_that_cannot_be_taken_does_not_hold_back_the_others(net, pair, monkeypatch):
    a, b = pair
    bad = begin(a, b"poisoned")
    good = begin(a, b"fine")
    bad_conv = conv_of(a, bad)
    take_one = Receiver._take

    def failing(self, batch, bundle, ended):  # fault injection: this dialog's arrival breaks
        if bundle[0] == bad_conv:
            raise RuntimeError("injected fault")
        return take_one(self, batch, bundle, ended)

    monkeypatch.setattr(Receiver, "_take", failing)
    net.pump()

    assert [m.body for m in take(b, "TargetQ")] == [b"fine"]
    assert endpoint(a, handle=good)["far_broker"] == b.broker_id
    [row] = a.transmission_view()  # the other one waits, with the reason, and is not lost
    assert row["conversation_handle"] == bad and "injected fault" in row["transmission_status"]


def test_a_closed_endpoint_is_kept_while_its_error_still_waits_to_go_out(net, pair):
    a, b = pair
    h = begin(a, b"m0")
    net.pump()
    net.down.add("B")
    a.apply([End(h, error=50001, description="cancelled")])  # closes A at once
    net.later()
    net.clock.advance(Limits().closed_retention_s + 1)
    a.tick()
    assert endpoint(a, handle=h)["state"] == "CLOSED"  # not purged: its Error is still queued
    net.down.discard("B")
    net.later(RETRY_MAX_S)
    [err] = [m for m in take(b, "TargetQ") if m.message_type == "Error"]
    assert err.error == (50001, "cancelled")


def _forwarding_pair(net, buffer: int):
    # A's calls of two messages are full: a second goes while the first is in flight
    a = net.add("A", INIT, limits=Limits(batch_rows=2))
    b = net.add("B", TARGET)
    f = net.add("F", forwarding=True, limits=Limits(forward_buffer=buffer))
    route(a, "routes", "ToTarget", "Target", "ray://F")
    route(f, "instance", "FwdTarget", "Target", "ray://B")
    return a, b, f


def test_a_forwarder_holds_at_most_its_buffer_and_refuses_more_until_it_drains(net):
    a, b, _ = _forwarding_pair(net, buffer=3)
    begin(a, b"a0", b"a1")
    (first,) = a.transport.dispatch()
    begin(a, b"b0", b"b1")
    (second,) = a.transport.dispatch()  # the first dialog is in flight: only the second
    gate = asyncio.Event()
    b_deliver = net.couriers["B"].deliver

    async def held_at_b(blob: bytes) -> bytes:
        await gate.wait()
        return await b_deliver(blob)

    net.couriers["B"].deliver = held_at_b

    async def both() -> tuple[bytes, bytes]:
        relaying = asyncio.create_task(net.peers("A").deliver("F", first.blob(), 1.0))
        while net.couriers["F"].relaying == 0:  # the first relay is held in F's buffer
            await asyncio.sleep(0)
        refused_reply = await net.peers("A").deliver("F", second.blob(), 1.0)
        gate.set()
        return await relaying, refused_reply

    first_reply, second_reply = asyncio.run(both())

    assert unpack(second_reply) == ([], ["F: forwarding buffer full"])
    assert net.couriers["F"].relaying == 0
    a.transport.acknowledged(first, first_reply)
    a.transport.acknowledged(second, second_reply)
    (row,) = {r["transmission_status"] for r in a.transmission_view()}
    assert row == "ray://F: F: forwarding buffer full"
    net.couriers["B"].deliver = b_deliver
    net.later()
    assert sorted(m.body for m in take(b, "TargetQ")) == [b"a0", b"a1", b"b0", b"b1"]
    assert a.transmission_view() == []


def test_a_batch_larger_than_an_idle_forwarders_buffer_still_passes(net):
    a, b, _ = _forwarding_pair(net, buffer=1)
    begin(a, b"m0", b"m1", b"m2")
    net.pump()
    assert [m.body for m in take(b, "TargetQ")] == [b"m0", b"m1", b"m2"]
    assert a.transmission_view() == []


def test_an_ingest_rerun_after_both_ends_went_sends_nothing_to_the_far_broker_again(net, pair):
    """A dialog begun if absent from A to B, sent AT, ended at both ends and purged at both: a
    re-run of its Begin and Send on A begins nothing and sends B nothing."""
    a, b = pair
    op = Begin(
        "Init",
        "Target",
        "C",
        handle="ingest/k",
        conversation_id="conv-k",
        if_absent=True,
        encryption=False,
    )
    rerun = [op, Send(op.handle, "Req", [b"r0", b"r1"], at=0)]
    a.apply(rerun)
    net.pump()
    got = take(b, "TargetQ")
    b.apply([End(got[0].conversation_handle)])
    net.pump()
    take(a, "InitQ")  # the EndDialog
    a.apply([End(op.handle)])
    net.pump()
    past_closed_retention(net, a, b)
    assert a.endpoints_view() == [] and b.endpoints_view() == []

    assert a.apply(rerun) == {"handles": [op.handle], "sent": 0}
    net.pump()
    assert a.transmission_view() == [] and take(b, "TargetQ") == []
    assert [m.body for m in got] == [b"r0", b"r1"]


def _outbound(*bundles: tuple[int, list[int], list[tuple[int, int, int]]]) -> Outbound:
    """A batch of (endpoint, sequence numbers, rows (id, first, last)) bundles, as dispatch
    builds it."""
    out = Outbound([])
    for ep_no, seqs, rows in bundles:
        n = len(seqs)
        out.bundles.append(
            Bundle(
                "c",
                "A",
                "B",
                None,
                "b1",
                True,
                "DEFAULT",
                None,
                8,
                seqs,
                ["DEFAULT"] * n,
                [b""] * n,
                [0.0] * n,
            )  # fmt: skip
        )
        out.rows += [i for i, _, _ in rows]
        out.spans += [(ep_no, first, last) for _, first, last in rows]
        out.endpoints.append(ep_no)
    return out


def test_an_answer_leaves_unacknowledged_exactly_the_rows_no_range_covers():
    out = _outbound(
        (1, [0, 1, 2], [(10, 0, 1), (11, 2, 2)]), (2, [5, 6], [(20, 5, 6)]), (3, [7], [(30, 7, 7)])
    )
    assert out.unacknowledged({1: [(0, 2)], 2: [(5, 6)], 3: [(7, 7)]}) == []
    # a range short of the bundle, one row answered by two ranges, one not answered at all
    assert out.unacknowledged({1: [(0, 1)], 2: [(6, 6), (5, 5)]}) == [11, 30]
    assert out.unacknowledged({1: [(1, 2)], 3: [(8, 9)]}) == [10, 20, 30]
    assert out.unacknowledged({1: [(0, 0), (2, 2)]}) == [10, 20, 30]
