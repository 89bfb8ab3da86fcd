"""BrokerCore: a refused call changes nothing. Each test takes a snapshot of every view, makes one
bad call, checks the exact error, and compares the views. No Ray."""

from __future__ import annotations

import json

import pytest

from actors.calls.envelope import Begin, End, Send, Timer
from actors.core import Limits
from actors.errors import (
    BodyTooLarge,
    ContractViolation,
    ConversationNotFound,
    InvalidArgument,
    LockNotHeld,
    UnknownContract,
    UnknownMessageType,
    UnknownService,
    ValidationFailed,
)


@pytest.fixture
def busy(core, open_dialog):
    """A broker with some of everything: two dialogs, waiting and locked messages, a parked dialog,
    a timer and a group state."""
    d1 = open_dialog(core, bodies=[b"a", b"b"])
    d2 = open_dialog(core, bodies=[b"c"])
    core.apply([Send(d1.target, "Reply", b"r"), Timer(d1.init, 60)])
    (locked,) = core.receive("TargetQ", handle=d2.target)
    parked = Begin("Init", "Later", "C")
    core.apply([parked, Send(parked.handle, "Req", b"p")])
    return d1, d2, locked


def refused(core, snapshot, error, call):
    before = snapshot(core)
    with pytest.raises(error):
        call()
    assert snapshot(core) == before


def test_begin_from_an_unknown_service_raises_unknown_service_and_changes_nothing(
    core, busy, snapshot
):
    refused(core, snapshot, UnknownService, lambda: core.apply([Begin("Nobody", "Target", "C")]))


def test_begin_on_an_unknown_contract_raises_unknown_contract_and_changes_nothing(
    core, busy, snapshot
):
    refused(core, snapshot, UnknownContract, lambda: core.apply([Begin("Init", "Target", "Nope")]))


def test_begin_on_a_contract_the_target_does_not_accept_is_a_contract_violation(
    core, busy, snapshot
):
    refused(core, snapshot, ContractViolation, lambda: core.apply([Begin("Init", "Target")]))


def test_send_of_an_unknown_message_type_raises_unknown_message_type_and_changes_nothing(
    core, busy, snapshot
):
    d1, _, _ = busy
    refused(core, snapshot, UnknownMessageType, lambda: core.apply([Send(d1.init, "Nope", b"x")]))


def test_send_of_a_type_the_contract_forbids_this_side_is_a_contract_violation(
    core, busy, snapshot
):
    d1, _, _ = busy
    refused(core, snapshot, ContractViolation, lambda: core.apply([Send(d1.init, "Reply", b"x")]))


def test_a_body_that_is_not_json_fails_validation_and_changes_nothing(core, busy, snapshot):
    d1, _, _ = busy
    refused(core, snapshot, ValidationFailed, lambda: core.apply([Send(d1.init, "Json", b"{oops")]))


def test_a_body_that_does_not_match_the_json_schema_fails_validation_and_changes_nothing(
    core, busy, snapshot
):
    d1, _, _ = busy
    body = json.dumps({"n": "not an integer"}).encode()
    refused(core, snapshot, ValidationFailed, lambda: core.apply([Send(d1.init, "Shaped", body)]))


def test_valid_json_and_schema_bodies_are_accepted(core, open_dialog):
    d = open_dialog(core)

    core.apply([Send(d.init, "Json", b"[1, 2]"), Send(d.init, "Shaped", b'{"n": 3}')])

    assert [r["message_type"] for r in core.queue_view("TargetQ")] == ["Req", "Json", "Shaped"]


def test_a_body_over_max_body_bytes_raises_body_too_large_and_changes_nothing(
    make_core, open_dialog, snapshot
):
    core = make_core(limits=Limits(max_body_bytes=8))
    d = open_dialog(core, bodies=[b"12345678"])  # exactly the limit is fine

    refused(
        core,
        snapshot,
        BodyTooLarge,
        lambda: core.apply([Send(d.init, "Req", [b"small", b"123456789"])]),
    )


def test_a_handle_of_another_broker_raises_conversation_not_found_and_changes_nothing(
    core, busy, make_core, open_dialog, snapshot
):
    foreign = open_dialog(make_core())
    refused(
        core,
        snapshot,
        ConversationNotFound,
        lambda: core.apply([Send(foreign.init, "Req", b"x")]),
    )


def test_committing_a_lock_not_held_raises_lock_not_held_and_changes_nothing(core, busy, snapshot):
    _, _, locked = busy
    refused(
        core,
        snapshot,
        LockNotHeld,
        lambda: core.settle(commit=[locked.lock_id, "not-a-lock"]),
    )
    assert core.settle(commit=[locked.lock_id])["committed"] == 1


def test_rolling_back_a_lock_not_held_raises_lock_not_held_and_changes_nothing(
    core, busy, snapshot
):
    refused(core, snapshot, LockNotHeld, lambda: core.settle(rollback=["not-a-lock"]))


def test_state_for_a_group_whose_lock_is_not_in_the_commit_raises_lock_not_held(
    core, busy, snapshot
):
    d1, _, locked = busy
    other = next(
        e["conversation_group_id"]
        for e in core.endpoints_view()
        if e["conversation_handle"] == d1.target
    )
    refused(
        core,
        snapshot,
        LockNotHeld,
        lambda: core.settle(commit=[locked.lock_id], states={other: b"x"}),
    )


def test_a_bad_op_in_the_middle_of_a_batch_undoes_the_ops_before_it(core, busy, snapshot):
    d1, d2, _ = busy
    new = Begin("Init", "Target", "C", related_group="fresh-group")
    ops = [
        new,
        Send(new.handle, "Req", b"on the new dialog"),
        Send(d1.init, "Req", b"on an old dialog"),
        Timer(d1.init, 5),
        End(d1.target),
        Send(d2.init, "Reply", b"the initiator may not send Reply"),
        Send(d2.init, "Req", b"never reached"),
    ]
    refused(core, snapshot, ContractViolation, lambda: core.apply(ops))
    assert new.handle not in {e["conversation_handle"] for e in core.endpoints_view()}


def test_a_batch_failing_on_its_last_handle_sends_on_none_of_them(core, busy, snapshot):
    d1, d2, _ = busy
    refused(
        core,
        snapshot,
        ConversationNotFound,
        lambda: core.apply([Send([d1.init, d2.init, "missing"], "Req", b"x")]),
    )


def test_a_batch_sending_a_system_message_type_is_invalid_and_changes_nothing(core, busy, snapshot):
    d1, _, _ = busy
    refused(
        core,
        snapshot,
        InvalidArgument,
        lambda: core.apply([Send(d1.init, "Req", b"ok"), Send(d1.init, "EndDialog", b"")]),
    )


def test_creating_a_service_on_an_unknown_contract_changes_nothing(core, busy, snapshot):
    from actors.model.catalog import Service

    refused(
        core, snapshot, UnknownContract, lambda: core.create(Service("Later", "TargetQ", ("X",)))
    )
    assert len(core.transmission_view()) == 1  # the parked dialog still waits
