"""Conversation endpoints: states, the send rules, ending, error bodies and inbound ordering."""

from __future__ import annotations

from dataclasses import replace

import pytest

from actors.errors import ContractViolation, ConversationEnded, InvalidArgument
from actors.model.catalog import DIALOG_TIMER, END_DIALOG, ERROR, Contract
from actors.model.dialogs import (
    SENDABLE,
    EndPlan,
    Endpoint,
    State,
    after_send,
    check_send,
    error_body,
    on_arrival,
    parse_error_body,
    plan_end,
)

CONTRACT = Contract("C", {"Ask": "initiator", "Answer": "target", "Note": "any"})
ENDED = (State.DISCONNECTED_INBOUND, State.DISCONNECTED_OUTBOUND, State.ERROR, State.CLOSED)


def _endpoint(state: State = State.STARTED_OUTBOUND, is_initiator: bool = True) -> Endpoint:
    return Endpoint(
        no=1,
        handle="h-1",
        conversation_id="c-1",
        is_initiator=is_initiator,
        service="Here",
        far_service="There",
        contract="C",
        group_no=1,
        state=state,
    )


# --- states ----------------------------------------------------------------------------------


def test_a_new_endpoint_starts_outbound_with_sequence_numbers_at_zero():
    ep = _endpoint()
    assert ep.state is State.STARTED_OUTBOUND
    assert (ep.send_seq, ep.recv_seq) == (0, 0)


def test_only_started_and_conversing_endpoints_are_open():
    assert {State.STARTED_OUTBOUND, State.CONVERSING} == SENDABLE
    for state in State:
        assert _endpoint(state).open == (state in SENDABLE)


def test_states_are_named_as_in_sys_conversation_endpoints():
    assert {s.value for s in State} == {
        "STARTED_OUTBOUND",
        "CONVERSING",
        "DISCONNECTED_INBOUND",
        "DISCONNECTED_OUTBOUND",
        "ERROR",
        "CLOSED",
    }


# --- check_send / after_send -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("is_initiator", "message_type"),
    [(True, "Ask"), (True, "Note"), (False, "Answer"), (False, "Note")],
)
def test_an_open_endpoint_may_send_what_its_side_of_the_contract_allows(is_initiator, message_type):
    for state in SENDABLE:
        check_send(_endpoint(state, is_initiator), CONTRACT, message_type)


@pytest.mark.parametrize(
    ("is_initiator", "message_type"),
    [(True, "Answer"), (False, "Ask"), (True, "Unlisted"), (False, "Unlisted")],
)
def test_sending_what_the_contract_gives_the_other_side_is_a_contract_violation(
    is_initiator, message_type
):
    ep = _endpoint(State.CONVERSING, is_initiator)
    before = replace(ep)
    with pytest.raises(ContractViolation):
        check_send(ep, CONTRACT, message_type)
    assert ep == before


def test_a_contract_violation_lists_what_the_side_may_send():
    with pytest.raises(ContractViolation, match="the target may send: Answer, Note"):
        check_send(_endpoint(is_initiator=False), CONTRACT, "Ask")


@pytest.mark.parametrize("message_type", [END_DIALOG, ERROR, DIALOG_TIMER])
def test_system_message_types_may_be_sent_by_either_side(message_type):
    check_send(_endpoint(is_initiator=True), CONTRACT, message_type)
    check_send(_endpoint(is_initiator=False), CONTRACT, message_type)


@pytest.mark.parametrize("state", ENDED)
def test_an_ended_endpoint_cannot_send_anything(state):
    ep = _endpoint(state)
    with pytest.raises(ConversationEnded, match="h-1 cannot send"):
        check_send(ep, CONTRACT, "Ask")
    assert ep.state is state


def test_an_endpoint_ended_by_the_far_side_is_told_to_end_this_side_too():
    with pytest.raises(ConversationEnded, match="call end_conversation"):
        check_send(_endpoint(State.DISCONNECTED_INBOUND), CONTRACT, "Ask")


def test_the_first_send_moves_a_started_endpoint_to_conversing():
    ep = _endpoint()
    after_send(ep)
    assert ep.state is State.CONVERSING


@pytest.mark.parametrize("state", [State.CONVERSING, *ENDED])
def test_after_send_leaves_any_other_state_as_it_is(state):
    ep = _endpoint(state)
    after_send(ep)
    assert ep.state is state


# --- on_arrival ------------------------------------------------------------------------------


def test_a_user_message_arriving_at_a_started_endpoint_makes_it_conversing():
    ep = _endpoint()
    on_arrival(ep, "Answer")
    assert ep.state is State.CONVERSING


@pytest.mark.parametrize("state", [State.CONVERSING, State.DISCONNECTED_OUTBOUND])
def test_a_user_message_arriving_does_not_change_a_later_state(state):
    ep = _endpoint(state)
    on_arrival(ep, "Answer")
    assert ep.state is state


@pytest.mark.parametrize(
    "state, arriving, after",
    [
        # EndDialog at an open endpoint: the far side ended; this side may still reply.
        (State.STARTED_OUTBOUND, END_DIALOG, State.DISCONNECTED_INBOUND),
        (State.CONVERSING, END_DIALOG, State.DISCONNECTED_INBOUND),
        # An Error at an open endpoint puts it in error.
        (State.STARTED_OUTBOUND, ERROR, State.ERROR),
        (State.CONVERSING, ERROR, State.ERROR),
        # Either, after this side ended, closes the endpoint.
        (State.DISCONNECTED_OUTBOUND, END_DIALOG, State.CLOSED),
        (State.DISCONNECTED_OUTBOUND, ERROR, State.CLOSED),
    ],
)
def test_an_end_or_error_arriving_moves_the_endpoint_to_its_next_state(state, arriving, after):
    ep = _endpoint(state)
    on_arrival(ep, arriving)
    assert ep.state is after


# --- plan_end --------------------------------------------------------------------------------


@pytest.mark.parametrize("state", [State.STARTED_OUTBOUND, State.CONVERSING])
def test_ending_an_open_endpoint_tells_the_far_side_and_waits_for_its_end(state):
    assert plan_end(_endpoint(state)) == EndPlan(END_DIALOG, b"", State.DISCONNECTED_OUTBOUND)


def test_ending_with_error_sends_the_error_and_closes_this_side_at_once():
    plan = plan_end(_endpoint(State.CONVERSING), 42, "bad order")
    assert plan == EndPlan(ERROR, error_body(42, "bad order"), State.CLOSED)


@pytest.mark.parametrize("state", [State.DISCONNECTED_INBOUND, State.ERROR])
def test_ending_after_the_far_side_ended_or_errored_just_closes(state):
    assert plan_end(_endpoint(state)) == EndPlan(None, b"", State.CLOSED)
    assert plan_end(_endpoint(state), 42, "bad order") == EndPlan(None, b"", State.CLOSED)


def test_ending_when_the_far_endpoint_does_not_exist_just_closes():
    ep = _endpoint(State.CONVERSING)
    assert plan_end(ep, far_exists=False) == EndPlan(None, b"", State.CLOSED)
    assert plan_end(ep, 42, "bad order", far_exists=False) == EndPlan(None, b"", State.CLOSED)


@pytest.mark.parametrize("state", [State.DISCONNECTED_OUTBOUND, State.CLOSED])
def test_ending_an_endpoint_already_ended_on_this_side_is_refused(state):
    ep = _endpoint(state)
    with pytest.raises(ConversationEnded, match="already ended"):
        plan_end(ep)
    assert ep.state is state


@pytest.mark.parametrize("code", [0, -1, 1.5, "42"])
def test_an_error_code_that_is_not_a_positive_int_is_an_invalid_argument(code):
    ep = _endpoint(State.CONVERSING)
    with pytest.raises(InvalidArgument):
        plan_end(ep, code, "bad order")
    assert ep.state is State.CONVERSING


@pytest.mark.parametrize("description", ["", None, 7])
def test_an_error_without_a_non_empty_description_is_an_invalid_argument(description):
    ep = _endpoint(State.CONVERSING)
    with pytest.raises(InvalidArgument):
        plan_end(ep, 42, description)
    assert ep.state is State.CONVERSING


def test_plan_end_does_not_change_the_endpoint():
    ep = _endpoint(State.CONVERSING)
    before = replace(ep)
    plan_end(ep, 42, "bad order")
    assert ep == before


# --- error bodies ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "description"), [(42, "bad order"), (-8489, "lifetime"), (1, 'ünïcödé ✓ "q"')]
)
def test_an_error_body_parses_back_to_its_code_and_description(code, description):
    assert parse_error_body(error_body(code, description)) == (code, description)


def test_an_error_body_is_json_with_code_and_description():
    assert error_body(42, "x") == b'{"code": 42, "description": "x"}'
