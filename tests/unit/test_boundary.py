"""The boundary between brokers: whatever another broker (an older version, a broken or hostile
peer) sends is answered, never raised out of `deliver`. A malformed bundle is refused alone, with
a reason, and its good neighbours are taken; a message that can never be taken ends its dialog
with an Error on both sides instead of wedging it in retries; every drop is recorded as an event
on the broker that dropped it. No Ray: real `BrokerCore`s with their real couriers over
in-process peers (`tests.unit.test_transport.Network`)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import msgpack
import pytest

from actors.core import Limits
from actors.errors import PeerUnreachable
from actors.model.catalog import ERROR, Service
from actors.model.dialogs import parse_error_body
from actors.transport import MESSAGE_REFUSED
from actors.transport.wire import Bundle, unpack_reply
from tests.fakes import FakeClock
from tests.unit.test_transport import (
    INIT,
    TARGET,
    Network,
    begin,
    conv_of,
    endpoint,
    route,
    send,
    take,
)


@pytest.fixture
def net():
    n = Network(FakeClock())
    yield n
    n.close()


@pytest.fixture
def pair(net):
    a = net.add("A", INIT)
    b = net.add("B", TARGET, json_validation=True)
    route(a, "routes", "ToTarget", "Target", "ray://B")
    route(b, "routes", "ToInit", "Init", "ray://A", a.broker_id)
    return a, b


def call(net: Network, callee: str, blob: Any) -> tuple[list, list[str]]:
    """One call from another broker, as its courier answers it: (acks, refusals)."""
    reply = asyncio.run(net.couriers[callee].deliver(blob))
    answer = unpack_reply(reply)
    return answer.acks, answer.refused


def bundle(core, conv: str, *bodies: bytes, seq: int = 0, **fields: Any) -> list:
    """A well-formed bundle from a broker "far" starting dialog `conv` at `core`'s Target."""
    n = len(bodies) or 1
    b = Bundle(
        conv,
        "Init",
        "Target",
        None,
        "far-broker-id",
        True,
        "C",
        None,
        8,
        list(range(seq, seq + n)),
        ["Req"] * n,
        list(bodies) or [b"m0"],
        [0.0] * n,
    )
    return list(b._replace(**fields))


def pack(*bundles: Any) -> bytes:
    return msgpack.packb(list(bundles), use_bin_type=True)


def events(core, kind: str) -> list[dict]:
    return [e for e in core.events_view() if e["kind"] == kind]


# --- calls that cannot be read -----------------------------------------------------------------


@pytest.mark.parametrize(
    "blob, why",
    [
        (b"\xc1 not msgpack", "not a packed list of bundles"),
        (msgpack.packb({"a": 1}), "must be a list of bundles"),
        (msgpack.packb(7), "must be a list of bundles"),
        ("a string, not bytes", "must carry bytes"),
        (None, "must carry bytes"),
    ],
)
def test_a_call_that_cannot_be_read_gets_a_clean_refusal_and_an_event(net, pair, blob, why):
    _, b = pair

    acks, refused = call(net, "B", blob)

    assert acks == []
    [reason] = refused
    assert reason.startswith("B could not read the call: ") and why in reason
    [event] = events(b, "Dropped")
    assert "from an unknown broker dropped at B" in event["detail"] and why in event["detail"]
    assert b.endpoints_view() == []


# --- one malformed bundle among good ones ------------------------------------------------------

MALFORMED = {
    "a body that is not bytes": ({"bodies": ["text"]}, "a body must be bytes"),
    "a body that is None": ({"bodies": [None]}, "a body must be bytes"),
    "more bodies than sequence numbers": (
        {"bodies": [b"a", b"b"]},
        "seqs must be a list as long as bodies (2)",
    ),
    "fewer types than sequence numbers": (
        {"seqs": [0, 1], "bodies": [b"a", b"b"], "sent_ats": [0.0, 0.0]},
        "types must be a list as long as bodies (2)",
    ),
    "no messages": (
        {"seqs": [], "types": [], "bodies": [], "sent_ats": []},
        "bodies must be a list of at least one",
    ),
    "a conversation id that is a number": ({"conversation_id": 42}, "conversation_id must be"),
    "a conversation id that is empty": ({"conversation_id": ""}, "conversation_id must be"),
    "a huge conversation id": ({"conversation_id": "c" * 10_000}, "conversation_id must be"),
    "a sender that is a list": ({"from_broker": ["x"]}, "from_broker must be"),
    "a to_broker that is a number": ({"to_broker": 5}, "to_broker must be"),
    "a service name with a space": ({"to_service": "Target "}, "to service name"),
    "a contract that is bytes": ({"contract": b"C"}, "contract must be"),
    "from_initiator as 1": ({"from_initiator": 1}, "from_initiator must be true or false"),
    "an expiry that is NaN": ({"expires_at": math.nan}, "expires_at must be a finite number"),
    "an expiry that is text": ({"expires_at": "soon"}, "expires_at must be a finite number"),
    "a hop count that is text": ({"hops_left": "8"}, "hops_left must be an integer"),
    "a hop count that is a bool": ({"hops_left": True}, "hops_left must be an integer"),
    "sequence numbers out of order": (
        {"seqs": [1, 0], "types": ["Req"] * 2, "bodies": [b"a", b"b"], "sent_ats": [0.0] * 2},
        "seqs must be increasing integers",
    ),
    "a negative sequence number": ({"seqs": [-1]}, "seqs must be increasing integers"),
    "a sequence number past SQLite's integers": (
        {"seqs": [2**64 - 1]},
        "seqs must be increasing integers",
    ),
    "a bool sequence number": ({"seqs": [True]}, "seqs must be increasing integers"),
    "a message type that is a number": ({"types": [7]}, "a message type must be"),
    "a send time that is text": ({"sent_ats": ["now"]}, "sent_ats must be finite numbers"),
    "a send time that is NaN": ({"sent_ats": [math.nan]}, "sent_ats must be finite numbers"),
    "a column that is not a list": ({"bodies": b"m0"}, "bodies must be a list of at least one"),
    # the compact columns a sender packs: the first sequence number, one type, one time
    "a negative first sequence number": ({"seqs": -1}, "seqs must run from 0"),
    "a run past SQLite's integers": (
        {"seqs": 2**63 - 1, "types": "Req", "bodies": [b"a", b"b"], "sent_ats": 0.0},
        "seqs must run from 0",
    ),
    "one message type with a space": ({"types": "Req uest"}, "message type name"),
    "one message type that is empty": ({"types": ""}, "a message type must be"),
    "one send time that is NaN": ({"sent_ats": math.nan}, "sent_ats must be a finite number"),
    "one send time that is a bool": ({"sent_ats": True}, "sent_ats must be a list as long"),
}


@pytest.mark.parametrize("fields, why", list(MALFORMED.values()), ids=list(MALFORMED))
def test_a_malformed_bundle_is_refused_alone_and_its_good_neighbours_are_taken(
    net, pair, fields, why
):
    _, b = pair
    bad = bundle(b, "bad-conv", **fields)
    before = bundle(b, "good-before", b"{}")
    after = bundle(b, "good-after", b"{}")

    acks, refused = call(net, "B", pack(before, bad, after))

    assert {(a.conversation_id, a.code, a.first_seq, a.last_seq) for a in acks} == {
        ("good-before", None, 0, 0),
        ("good-after", None, 0, 0),
    }
    [reason] = refused
    assert reason.startswith("B refused a malformed bundle: ") and why in reason
    assert len(reason) < 400  # a huge field is not echoed back whole
    assert sorted(m.conversation_id for m in take(b, "TargetQ")) == ["good-after", "good-before"]
    assert {e["conversation_id"] for e in b.endpoints_view()} == {"good-before", "good-after"}
    [event] = events(b, "Dropped")
    assert "dropped at B" in event["detail"] and why in event["detail"]


@pytest.mark.parametrize(
    "raw",
    [["too", "short"], "a string", 7, None, {"conversation_id": "c"}, []],
    ids=["too few fields", "text", "a number", "nil", "a map", "an empty list"],
)
def test_a_bundle_that_is_not_a_list_of_its_fields_is_refused_alone(net, pair, raw):
    _, b = pair

    acks, refused = call(net, "B", pack(raw, bundle(b, "good", b"{}")))

    assert [(a.conversation_id, a.code) for a in acks] == [("good", None)]
    [reason] = refused
    assert "a bundle must be a list of 14 fields" in reason
    assert [m.conversation_id for m in take(b, "TargetQ")] == ["good"]


def test_several_malformed_bundles_from_one_call_make_one_event_per_reason(net, pair):
    _, b = pair
    bad = [bundle(b, f"bad-{i}", b"x", b"y", bodies=["x", "y"]) for i in range(20)]

    acks, refused = call(net, "B", pack(*bad))

    assert acks == [] and len(refused) == 20
    [event] = events(b, "Dropped")
    assert event["subject"] == "Target"
    assert event["detail"].startswith(
        "40 message(s) in 20 bundle(s) from broker far-broker-id dropped at B (first: "
        "conversation bad-0): a malformed bundle: a body must be bytes"
    )


# --- messages the receiving broker will never take end their dialog ------------------------------


def assert_errored_on_both_sides(a, b, h: str, *, says: str) -> list:
    """The dialog ended with one Error on each side, saying why; nothing of it waits. Returns
    every message that was waiting at the target (all are taken)."""
    assert [r for r in a.transmission_view() if r["conversation_handle"] == h] == []
    errors = [m for m in take(a, "InitQ") if m.conversation_handle == h]
    assert [m.message_type for m in errors] == [ERROR]
    code, description = parse_error_body(errors[0].body)
    assert code == MESSAGE_REFUSED and says in description
    assert endpoint(a, handle=h)["state"] == "ERROR"
    conv = conv_of(a, h)
    assert endpoint(b, conv=conv)["state"] == "ERROR"
    got = take(b, "TargetQ")
    at_b = [m for m in got if m.conversation_id == conv]
    assert [m.message_type for m in at_b if m.message_type == ERROR] == [ERROR]
    assert parse_error_body(at_b[-1].body) == (MESSAGE_REFUSED, description)
    return got


def test_a_body_over_the_receiving_brokers_limit_ends_the_dialog_and_others_go_on(net):
    a = net.add("A", INIT)  # A allows 4 MiB: the body leaves
    b = net.add("B", TARGET, limits=Limits(max_body_bytes=100))
    route(a, "routes", "ToTarget", "Target", "ray://B")
    big = begin(a, b"small first", b"x" * 101, b"after it")
    other = begin(a, b"y" * 100)  # exactly at the limit, in the same call

    net.pump()
    net.later()

    got = assert_errored_on_both_sides(a, b, big, says="larger than B's max_body_bytes (100)")
    mine = [m for m in got if m.conversation_id == conv_of(a, big)]
    assert [(m.message_type, m.sequence_number) for m in mine] == [("Req", 0), (ERROR, -1)]
    assert mine[0].body == b"small first"  # before the refused one: taken
    assert [m.body for m in got if m.conversation_id == conv_of(a, other)] == [b"y" * 100]
    assert a.transmission_view() == []


def test_a_message_failing_validation_does_not_wedge_its_dialog_or_hold_back_others(net, pair):
    a, b = pair
    bad = begin(a, b"{}")
    net.pump()
    send(a, bad, b"{not json", mt="Json")
    send(a, bad, b"{}", mt="Json")  # behind the bad one, in the same dialog
    good = begin(a, b"{}")

    net.pump()
    net.later()  # nothing is retried

    got = assert_errored_on_both_sides(a, b, bad, says="not well-formed JSON")
    assert [m.message_type for m in got if m.conversation_id == conv_of(a, bad)] == ["Req", ERROR]
    assert [m.body for m in got if m.conversation_id == conv_of(a, good)] == [b"{}"]
    assert a.transmission_view() == []


def test_a_resent_refused_message_is_refused_again_without_a_second_error(net, pair):
    a, b = pair
    h = begin(a)
    send(a, h, b"{not json", mt="Json")
    (out,) = a.transport.dispatch()

    net.deliver("A", "B", out.blob())  # its answer is lost: A sends it again
    reply = net.deliver("A", "B", out.blob())
    a.transport.acknowledged(out, reply)

    assert_errored_on_both_sides(a, b, h, says="not well-formed JSON")


def test_a_body_no_validator_can_judge_is_refused_and_ends_the_dialog(net, pair):
    a, b = pair
    h = begin(a)
    send(a, h, b"[" * 100_000, mt="Json")  # nested too deep for a JSON parser

    net.pump()
    net.later()

    assert a.transmission_view() == []
    assert endpoint(a, handle=h)["state"] == "ERROR"
    assert endpoint(b, conv=conv_of(a, h))["state"] == "ERROR"


@pytest.mark.parametrize(
    "mt, body, says",
    [
        ("DialogTimer", b"", "a broker's own"),
        ("EndDialog", b"with a body", "carries no body"),
        ("Error", b"not json", "an 'Error' body must be JSON"),
        ("Error", b'{"code": "x", "description": "d"}', "an 'Error' body must be JSON"),
    ],
)
def test_a_system_message_no_broker_sends_so_is_refused_and_ends_the_dialog(
    net, pair, mt, body, says
):
    a, b = pair
    h = begin(a, b"{}")
    net.pump()
    conv = conv_of(a, h)
    take(b, "TargetQ")

    acks, _ = call(
        net, "B", pack(bundle(b, conv, body, seq=1, types=[mt], from_broker=a.broker_id))
    )

    [nack] = acks
    assert nack.code == MESSAGE_REFUSED and says in nack.description
    assert endpoint(b, conv=conv)["state"] == "ERROR"
    [err] = take(b, "TargetQ")
    assert err.message_type == ERROR and says in parse_error_body(err.body)[1]


# --- a broker that drops arriving messages says so ---------------------------------------------


def test_a_broker_with_forwarding_off_records_why_it_dropped_a_bundle(net):
    a = net.add("A", INIT)
    f = net.add("F")
    b = net.add("B", TARGET)
    route(a, "routes", "ToTarget", "Target", "ray://F")
    route(f, "instance", "FwdTarget", "Target", "ray://B")
    begin(a, b"m0", b"m1")
    begin(a, b"m2")

    net.pump()

    [event] = events(f, "Dropped")
    assert event["subject"] == "Target"
    assert event["detail"].startswith(
        f"3 message(s) in 2 bundle(s) from broker {a.broker_id} dropped at F"
    )
    assert event["detail"].endswith(
        "F has no way to 'Target': routed by step 2, service without "
        "broker instance: FwdTarget (forwarding is off)"
    )
    assert events(b, "Dropped") == []


def test_a_broker_with_no_route_records_why_it_dropped_a_bundle(net):
    a = net.add("A", INIT)
    f = net.add("F", forwarding=True)
    f.drop_route("instance", "AutoCreatedLocal")
    route(a, "routes", "ToTarget", "Target", "ray://F")
    begin(a, b"m0")

    net.pump()

    [event] = events(f, "Dropped")
    assert "F has no way to 'Target'" in event["detail"]
    assert "forwarding is off" not in event["detail"]


def test_a_broker_with_another_broker_id_records_why_it_dropped_a_bundle(net):
    a = net.add("A", INIT)
    b = net.add("B", TARGET)
    c = net.add("C", TARGET)
    route(a, "routes", "Misrouted", "Target", "ray://B", c.broker_id)
    begin(a, b"m0", to_broker=c.broker_id)

    net.pump()

    [event] = events(b, "Dropped")
    assert event["detail"].endswith(f"B is broker {b.broker_id}, not {c.broker_id}; dropped")


def test_a_hop_limit_drop_is_one_event_per_call_however_many_dialogs(net):
    a = net.add("A", INIT)
    f = net.add("F", forwarding=True)
    route(f, "instance", "Onward", "Target", "ray://B")
    spent = [bundle(f, f"conv-{i}", hops_left=0, from_broker=a.broker_id) for i in range(5)]

    acks, refused = call(net, "F", pack(*spent))

    assert acks == [] and refused == ["hop limit reached at F"] * 5
    [event] = events(f, "HopLimit")
    assert event["detail"].startswith(
        f"5 message(s) in 5 bundle(s) from broker {a.broker_id} dropped at F (first: "
        "conversation conv-0): dropped after 16 hops"
    )


def test_a_forwarder_that_cannot_reach_the_next_hop_records_the_drop(net):
    a = net.add("A", INIT)
    f = net.add("F", forwarding=True)
    net.add("B", TARGET)
    route(a, "routes", "ToTarget", "Target", "ray://F")
    route(f, "instance", "FwdTarget", "Target", "ray://B")
    net.down.add("B")
    begin(a, b"m0")

    net.pump()

    [event] = events(f, "Dropped")
    assert event["detail"].endswith(
        "F could not forward to ray://B: broker 'B' is not running; its messages wait until "
        "it starts"
    )
    assert f.endpoints_view() == []


# --- answers the sender cannot read ------------------------------------------------------------


@pytest.mark.parametrize(
    "reply, why",
    [
        (b"\xc1", "the far broker gave an answer that cannot be read"),
        (msgpack.packb([[["c", "not a bool", 0, 0, "o", None, ""]], []]), "malformed ack"),
        (msgpack.packb([[[]], []]), "malformed acknowledgement"),
        (msgpack.packb("text"), "cannot be read"),
    ],
)
def test_an_answer_the_sender_cannot_read_keeps_its_messages_queued_with_a_reason(
    net, pair, reply, why
):
    a, b = pair
    begin(a, b"{}")
    (out,) = a.transport.dispatch()

    a.transport.acknowledged(out, reply)

    (row,) = a.transmission_view()
    assert row["transmission_status"].startswith("ray://B: ") and why in row["transmission_status"]
    assert row["attempts"] == 1
    net.later()
    assert a.transmission_view() == [] and len(take(b, "TargetQ")) == 1


# --- status texts speak of brokers ---------------------------------------------------------------


def test_the_reasons_a_broker_cannot_be_called_name_the_broker_and_no_python_internals():
    texts = [
        PeerUnreachable.not_running("B").reason,
        PeerUnreachable.no_answer("B", 30.0).reason,
        PeerUnreachable.stopped("B").reason,
        PeerUnreachable.failed("B").reason,
        PeerUnreachable.failed("B", "queue 'Q' is disabled").reason,
    ]
    assert texts == [
        "broker 'B' is not running; its messages wait until it starts",
        "broker 'B' did not answer within 30 s (busy, or too slow: see the send_timeout_s limit)",
        "broker 'B' stopped or is restarting",
        "the call to broker 'B' failed; see the brokers' logs",
        "the call to broker 'B' failed: queue 'Q' is disabled",
    ]
    for text in texts:
        assert "Error" not in text and "(" not in text.split("(busy")[0]


# --- a service whose target changes its mind is no malformed input --------------------------------


def test_a_target_service_that_does_not_exist_behind_a_local_route_is_not_taken(net):
    a = net.add("A", INIT)
    b = net.add("B", Service("Other", "OtherQ", ("C",)))
    route(a, "routes", "ToTarget", "Target", "ray://B")
    begin(a, b"m0")

    net.pump()

    (row,) = a.transmission_view()
    assert "B has no way to 'Target'" in row["transmission_status"]
    assert b.endpoints_view() == []
    [event] = events(b, "Dropped")
    assert event["subject"] == "Target"


def test_the_status_names_the_next_hop_that_answered_not_the_first_one_tried(net):
    a = net.add("A", INIT)
    b = net.add("B", TARGET)
    for gw in ("GatewayA", "GatewayB"):  # forwarding off: each answers refusing the batch
        net.add(gw)
        route(a, "routes", f"Via{gw}", "Target", f"ray://{gw}", b.broker_id)
    handles = [begin(a, b"m0") for _ in range(8)]  # hop orders differ by conversation

    net.pump()

    for h in handles:
        [row] = [r for r in a.transmission_view() if r["conversation_handle"] == h]
        status = row["transmission_status"]
        hop = status.split(":", 2)[1].removeprefix("//")
        assert status.startswith(f"ray://{hop}: {hop} has no way to 'Target'"), status
