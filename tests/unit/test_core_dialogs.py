"""BrokerCore: dialogs on one broker: begin, send, end, errors, timers, lifetimes, Echo, the
transmission queue and retried requests. No Ray."""

from __future__ import annotations

import pytest

from actors.calls.envelope import Begin, End, Send, Timer
from actors.errors import ConversationEnded, ConversationNotFound
from actors.model.catalog import Service
from actors.model.dialogs import LIFETIME_EXPIRED


def receive_all(core, queue):
    """Receive and commit everything waiting on `queue`; the messages, in receive order."""
    out = []
    while got := core.receive(queue, max_groups=100):
        core.settle(commit=[g.lock_id for g in got])
        out += [m for g in got for m in g.messages]
    return out


def state_of(core, handle):
    return next(e["state"] for e in core.endpoints_view() if e["conversation_handle"] == handle)


# --- begin, send, receive ----------------------------------------------------------------------


def test_begin_send_receive_commit_delivers_the_message_to_the_target_service(core):
    begin = Begin("Init", "Target", "C")
    result = core.apply([begin, Send(begin.handle, "Req", b"hello")])

    (got,) = core.receive("TargetQ")
    core.settle(commit=[got.lock_id])

    assert result == {"handles": [begin.handle], "sent": 1}
    (m,) = got.messages
    assert (m.message_type, m.body, m.service_name, m.far_service, m.contract) == (
        "Req",
        b"hello",
        "Target",
        "Init",
        "C",
    )
    assert m.conversation_handle != begin.handle  # the target has its own handle
    assert core.queue_view("TargetQ") == []


def test_messages_of_one_dialog_arrive_in_order_with_sequence_numbers_from_zero(core):
    begin = Begin("Init", "Target", "C")
    core.apply([begin])
    for body in (b"a", b"b", b"c"):
        core.apply([Send(begin.handle, "Req", body)])

    msgs = receive_all(core, "TargetQ")

    assert [(m.sequence_number, m.body) for m in msgs] == [(0, b"a"), (1, b"b"), (2, b"c")]


def test_one_send_to_several_handles_delivers_the_message_on_each_dialog(core):
    b1, b2 = Begin("Init", "Target", "C"), Begin("Init", "Retain", "C")
    core.apply([b1, b2])

    result = core.apply([Send([b1.handle, b2.handle], "Req", b"both")])

    assert result["sent"] == 2
    assert [m.body for m in receive_all(core, "TargetQ")] == [b"both"]
    assert [m.body for m in receive_all(core, "RetainQ")] == [b"both"]


def test_a_send_with_a_batch_of_bodies_delivers_each_body_in_order(core):
    begin = Begin("Init", "Target", "C")

    result = core.apply([begin, Send(begin.handle, "Req", [b"1", b"2", b"3", b"4"])])

    assert result["sent"] == 4
    msgs = receive_all(core, "TargetQ")
    assert [(m.sequence_number, m.body) for m in msgs] == [
        (0, b"1"),
        (1, b"2"),
        (2, b"3"),
        (3, b"4"),
    ]


def test_replies_from_the_target_reach_the_initiator_queue_in_order(core, open_dialog):
    d = open_dialog(core)

    core.apply([Send(d.target, "Reply", [b"r0", b"r1"])])

    msgs = receive_all(core, "InitQ")
    assert [(m.conversation_handle, m.sequence_number, m.body) for m in msgs] == [
        (d.init, 0, b"r0"),
        (d.init, 1, b"r1"),
    ]


# --- ending ------------------------------------------------------------------------------------


def test_ending_a_dialog_sends_end_dialog_and_the_far_side_can_then_only_end(core, open_dialog):
    d = open_dialog(core)
    receive_all(core, "TargetQ")

    core.apply([End(d.init)])

    assert [m.message_type for m in receive_all(core, "TargetQ")] == ["EndDialog"]
    assert state_of(core, d.target) == "DISCONNECTED_INBOUND"
    with pytest.raises(ConversationEnded):
        core.apply([Send(d.target, "Reply", b"too late")])
    core.apply([End(d.target)])
    assert state_of(core, d.target) == "CLOSED"
    assert state_of(core, d.init) == "CLOSED"


def test_ending_with_an_error_delivers_its_code_and_description_to_the_far_side(core, open_dialog):
    d = open_dialog(core)
    receive_all(core, "TargetQ")

    core.apply([End(d.init, error=50001, description="order rejected")])

    (m,) = receive_all(core, "TargetQ")
    assert m.message_type == "Error"
    assert m.error == (50001, "order rejected")
    assert state_of(core, d.target) == "ERROR"
    assert state_of(core, d.init) == "CLOSED"


def test_end_with_cleanup_removes_the_local_endpoint_and_messages_without_telling_the_far_side(
    core, open_dialog
):
    d = open_dialog(core)
    core.apply([Send(d.target, "Reply", [b"r0", b"r1"])])

    core.apply([End(d.init, cleanup=True)])

    handles = {e["conversation_handle"] for e in core.endpoints_view()}
    assert d.init not in handles
    assert core.queue_view("InitQ") == []
    assert [m.message_type for m in receive_all(core, "TargetQ")] == ["Req"]  # no EndDialog
    assert state_of(core, d.target) == "CONVERSING"


def test_what_a_call_delivers_to_an_endpoint_it_then_ends_goes_with_the_endpoint(core, open_dialog):
    """END CONVERSATION removes what waits on its endpoint, including what the same call put
    there just before. With cleanup the endpoint is gone: a message left for it failed every
    receive of its queue (the endpoint it names no longer exists)."""
    cleaned = open_dialog(core)
    core.apply([Send(cleaned.target, "Reply", [b"r0"]), End(cleaned.init, cleanup=True)])
    assert core.queue_view("InitQ") == []
    assert core.receive("InitQ") == []

    ended = open_dialog(core)
    core.apply([Send(ended.target, "Reply", [b"r1"]), End(ended.init)])
    assert core.queue_view("InitQ") == []
    assert state_of(core, ended.init) == "DISCONNECTED_OUTBOUND"
    # the targets' queue is untouched: both Reqs, and the EndDialog of the one that ended
    got = [(m.conversation_handle, m.message_type) for m in receive_all(core, "TargetQ")]
    assert got == [(cleaned.target, "Req"), (ended.target, "Req"), (ended.target, "EndDialog")]


def test_sending_on_a_handle_this_side_has_ended_raises_conversation_ended(core, open_dialog):
    d = open_dialog(core)
    core.apply([End(d.init)])

    with pytest.raises(ConversationEnded):
        core.apply([Send(d.init, "Req", b"more")])


def test_ending_an_already_ended_handle_raises_conversation_ended(core, open_dialog):
    d = open_dialog(core)
    core.apply([End(d.init)])

    with pytest.raises(ConversationEnded):
        core.apply([End(d.init)])


def test_an_unknown_handle_raises_conversation_not_found(core):
    with pytest.raises(ConversationNotFound):
        core.apply([Send("no-such-handle", "Req", b"x")])
    with pytest.raises(ConversationNotFound):
        core.apply([End("no-such-handle")])


def test_ending_a_conversation_removes_its_waiting_messages_from_this_sides_queue(
    core, open_dialog
):
    d1 = open_dialog(core)
    d2 = open_dialog(core, related_conversation=d1.init)  # same group on InitQ
    core.apply([Send(d1.target, "Reply", [b"1a", b"1b"]), Send(d2.target, "Reply", b"2a")])

    core.apply([End(d1.init)])

    rows = core.queue_view("InitQ")
    assert [(r["conversation_handle"], r["message_type"]) for r in rows] == [(d2.init, "Reply")]
    assert core.queues_view()["InitQ"]["depth"] == 1
    assert [m.body for m in receive_all(core, "InitQ")] == [b"2a"]


# --- timers and lifetimes ---------------------------------------------------------------------


def test_a_conversation_timer_delivers_a_dialog_timer_message_when_it_falls_due(
    core, core_clock, open_dialog
):
    d = open_dialog(core)
    core.apply([Timer(d.init, 10)])

    core_clock.advance(9)
    core.tick()
    assert core.queue_view("InitQ") == []
    core_clock.advance(1)
    core.tick()

    (m,) = receive_all(core, "InitQ")
    assert (m.message_type, m.conversation_handle, m.body) == ("DialogTimer", d.init, b"")


def test_a_timer_of_zero_cancels_the_pending_timer(core, core_clock, open_dialog):
    d = open_dialog(core)
    core.apply([Timer(d.init, 10)])

    core.apply([Timer(d.init, 0)])
    core_clock.advance(60)
    core.tick()

    assert core.queue_view("InitQ") == []
    assert state_of(core, d.init) == "CONVERSING"


def test_lifetime_expiry_puts_an_error_on_both_local_endpoints(core, core_clock, open_dialog):
    d = open_dialog(core, lifetime=30)

    core_clock.advance(30)
    core.tick()

    for queue, handle in (("InitQ", d.init), ("TargetQ", d.target)):
        errors = [m for m in receive_all(core, queue) if m.message_type == "Error"]
        assert [(m.conversation_handle, m.error[0]) for m in errors] == [(handle, LIFETIME_EXPIRED)]
        assert state_of(core, handle) == "ERROR"


# --- Echo --------------------------------------------------------------------------------------


def test_an_echo_dialog_gets_each_body_back_on_the_initiator_queue(core):
    begin = Begin("Init", "EchoSvc", "Echo")

    core.apply([begin, Send(begin.handle, "Echo", [b"ping", b"pong"])])

    msgs = receive_all(core, "InitQ")
    assert [(m.conversation_handle, m.message_type, m.body) for m in msgs] == [
        (begin.handle, "Echo", b"ping"),
        (begin.handle, "Echo", b"pong"),
    ]
    assert core.queue_view("TargetQ") == []  # the broker answered; nothing was queued


def test_ending_an_echo_dialog_closes_the_initiator_endpoint_too(core, core_clock):
    begin = Begin("Init", "EchoSvc", "Echo")
    core.apply([begin, Send(begin.handle, "Echo", b"ping")])
    receive_all(core, "InitQ")

    core.apply([End(begin.handle)])
    core_clock.advance(3600)
    core.tick()

    assert begin.handle not in {
        e["conversation_handle"] for e in core.endpoints_view() if e["state"] != "CLOSED"
    }


# --- the transmission queue --------------------------------------------------------------------


def test_a_dialog_to_a_service_that_does_not_exist_waits_in_the_transmission_queue(core):
    begin = Begin("Init", "Later", "C")

    core.apply([begin, Send(begin.handle, "Req", [b"a", b"b"])])

    rows = core.transmission_view()
    assert [(r["conversation_handle"], r["sequence_number"]) for r in rows] == [
        (begin.handle, 0),
        (begin.handle, 1),
    ]
    assert all(r["to_service"] == "Later" for r in rows)
    assert all("'Later' is not on this broker" in r["transmission_status"] for r in rows)


def test_waiting_messages_are_delivered_in_order_when_the_service_is_created(core):
    begin = Begin("Init", "Later", "C")
    core.apply([begin, Send(begin.handle, "Req", [b"a", b"b"])])
    core.apply([Send(begin.handle, "Req", b"c")])

    core.create(Service("Later", "TargetQ", ("C",)))

    assert core.transmission_view() == []
    msgs = receive_all(core, "TargetQ")
    assert [(m.service_name, m.sequence_number, m.body) for m in msgs] == [
        ("Later", 0, b"a"),
        ("Later", 1, b"b"),
        ("Later", 2, b"c"),
    ]
    core.apply([Send(begin.handle, "Req", b"d")])  # now delivered directly
    assert [(m.sequence_number, m.body) for m in receive_all(core, "TargetQ")] == [(3, b"d")]


def test_a_waiting_dialog_is_not_delivered_to_a_new_service_that_refuses_its_contract(core):
    begin = Begin("Init", "Later", "C")
    core.apply([begin, Send(begin.handle, "Req", b"a")])

    core.create(Service("Later", "TargetQ"))  # accepts no contract as a target

    assert core.queue_view("TargetQ") == []
    assert core.transmission_view() == []
    [ep] = [e for e in core.endpoints_view() if e["conversation_handle"] == begin.handle]
    assert ep["state"] == "ERROR"  # the initiator is told, with an Error message


# --- retried requests ------------------------------------------------------------------------


def test_applying_the_same_request_id_twice_sends_once_and_answers_the_same(core, open_dialog):
    d = open_dialog(core)
    receive_all(core, "TargetQ")
    ops = [Send(d.init, "Req", [b"x", b"y"])]

    first = core.apply(ops, request_id="req-1")
    second = core.apply(ops, request_id="req-1")

    assert first == second == {"handles": [], "sent": 2}
    assert [m.body for m in receive_all(core, "TargetQ")] == [b"x", b"y"]


def test_a_retried_begin_with_a_request_id_begins_one_dialog(core):
    ops = [Begin("Init", "Target", "C", handle="h-1"), Send("h-1", "Req", b"x")]

    core.apply(ops, request_id="req-begin")
    core.apply(ops, request_id="req-begin")

    assert [e["conversation_handle"] for e in core.endpoints_view() if e["is_initiator"]] == ["h-1"]
    assert len(receive_all(core, "TargetQ")) == 1


def test_settling_the_same_request_id_twice_commits_once(core, open_dialog):
    d = open_dialog(core)
    (got,) = core.receive("TargetQ")
    ops = [Send(d.target, "Reply", b"once")]

    first = core.settle(commit=[got.lock_id], ops=ops, request_id="settle-1")
    second = core.settle(commit=[got.lock_id], ops=ops, request_id="settle-1")

    assert first == second
    assert [m.body for m in receive_all(core, "InitQ")] == [b"once"]


def test_sending_after_the_local_target_was_cleaned_up_errors_the_initiator_at_once(
    core, open_dialog
):
    d = open_dialog(core)
    receive_all(core, "TargetQ")
    core.apply([End(d.target, cleanup=True)])

    core.apply([Send(d.init, "Req", b"anyone there?")])

    [err] = receive_all(core, "InitQ")
    assert err.message_type == "Error" and err.error[0] < 0
    assert state_of(core, d.init) == "ERROR"
    assert core.queue_view("TargetQ") == [] and core.transmission_view() == []
