"""Conversation endpoints: their state machine, sequencing and the rules for sending and ending.

Plain Python, no Ray, no store. `BrokerCore` keeps endpoints in memory and persists them; every
decision about what a dialog may do next is made here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from operator import itemgetter
from typing import Any

from actors.errors import ContractViolation, ConversationEnded, InvalidArgument
from actors.model import checks
from actors.model.catalog import END_DIALOG, ERROR, Contract, may_send

# An Error's description, at most: SQL Server's END CONVERSATION takes DESCRIPTION as
# nvarchar(3000), and an Error body travels to the far side and is stored there.
MAX_ERROR_DESCRIPTION = 3000


class State(StrEnum):
    """Endpoint states, named as in sys.conversation_endpoints."""

    STARTED_OUTBOUND = "STARTED_OUTBOUND"  # begun, nothing sent yet
    CONVERSING = "CONVERSING"
    DISCONNECTED_INBOUND = "DISCONNECTED_INBOUND"  # the far side ended; end this side too
    DISCONNECTED_OUTBOUND = "DISCONNECTED_OUTBOUND"  # this side ended; waiting for the far side
    ERROR = "ERROR"  # an Error arrived (or the lifetime ran out); end this side
    CLOSED = "CLOSED"


# Each state as a module constant: a member read through its class (`State.CLOSED`) goes
# through the enum metaclass's __getattr__ hook, about four times a global's cost, and the hot
# path reads them for every message.
STARTED_OUTBOUND = State.STARTED_OUTBOUND
CONVERSING = State.CONVERSING
DISCONNECTED_INBOUND = State.DISCONNECTED_INBOUND
DISCONNECTED_OUTBOUND = State.DISCONNECTED_OUTBOUND
IN_ERROR = State.ERROR
CLOSED = State.CLOSED

SENDABLE = frozenset({STARTED_OUTBOUND, CONVERSING})

# What the store keeps of an endpoint that changes after BEGIN, but its sequence numbers (see
# `Store.update_endpoints`), as a tuple made in C from the endpoint's fields (its instance dict,
# or a snapshot of it: `Changes.touch`): compared for every endpoint a commit touches. Nine
# attribute reads would cost about twice as much. The state as itself (a str): its `.value`
# costs an enum descriptor call.
settings_of = itemgetter(
    "group_no",
    "state",
    "expires_at",
    "timer_at",
    "far_broker",
    "closed_at",
    "user_sent",
    "onward",
    "no",
)


# When something falls due for an endpoint, from its fields: its timer, its lifetime, its purge
due_of = itemgetter("timer_at", "expires_at", "closed_at")


def endpoint_settings(ep: Endpoint) -> tuple[Any, ...]:
    """The endpoint's fields that `Store.update_endpoints` writes, as one tuple."""
    return settings_of(ep.__dict__)


@dataclass
class Endpoint:
    """One side of a dialog on this broker."""

    no: int  # the store's key; messages refer to it
    handle: str
    conversation_id: str
    is_initiator: bool
    service: str
    far_service: str
    contract: str
    group_no: int
    state: State = STARTED_OUTBOUND
    send_seq: int = 0  # the sequence number of the next message this side sends
    recv_seq: int = 0  # the sequence number expected next from the far side
    expires_at: float | None = None  # dialog lifetime
    timer_at: float | None = None  # conversation timer
    far_broker: str | None = None
    closed_at: float | None = None
    # set when this side ends with an EndDialog or an Error to the far side, which takes the next
    # sequence number: how many of the dialog's messages its user sent (None: send_seq says)
    user_sent: int | None = None
    # begun with ENCRYPTION ON: its messages leave this broker only sealed (seed 003); a dialog
    # with a session key (actors.core.keyring) is sealed whatever this says
    encryption: bool = False
    # begun with `if_absent`: remembered after it goes, so a re-run of that Begin and its
    # Send ... AT find it ended rather than begin it again (kept in the store's `rerunnable`)
    rerunnable: bool = False
    # the endpoint this one relays (`Begin.relays`): a data message arriving here while its
    # group is idle is sent on that one at arrival (`Delivery.pass_through`)
    onward: int | None = None

    @property
    def open(self) -> bool:
        return self.state in SENDABLE

    def identity(self) -> tuple[str, str, str, str]:
        """What a Begin names of its dialog: conversation id, service, far service, contract."""
        return self.conversation_id, self.service, self.far_service, self.contract

    def sent_by_user(self) -> int:
        """How many messages this side's user sent (its EndDialog or Error not counted)."""
        return self.send_seq if self.user_sent is None else self.user_sent

    def due_times(self) -> tuple[float | None, float | None, float | None]:
        """When something falls due for this endpoint: its timer, its lifetime, its purge."""
        return due_of(self.__dict__)

    def row(self) -> tuple[object, ...]:
        """The endpoint as a row of the store's endpoints table (see store.ENDPOINT_COLUMNS)."""
        return (
            self.no,
            self.handle,
            self.conversation_id,
            int(self.is_initiator),
            self.service,
            self.far_service,
            self.contract,
            self.group_no,
            self.state.value,
            self.send_seq,
            self.recv_seq,
            self.expires_at,
            self.timer_at,
            self.far_broker,
            self.closed_at,
            self.user_sent,
            int(self.encryption),
            self.onward,
        )


def check_send(ep: Endpoint, contract: Contract, message_type: str) -> None:
    """Raise unless this endpoint may send `message_type` now."""
    if ep.state not in SENDABLE:
        raise ConversationEnded(_ended_why(ep))
    if not may_send(contract, message_type, ep.is_initiator):
        side = "initiator" if ep.is_initiator else "target"
        allowed = sorted(mt for mt in contract.messages if may_send(contract, mt, ep.is_initiator))
        raise ContractViolation(
            f"contract {contract.name!r} does not let the {side} send {message_type!r} on "
            f"conversation {ep.handle}; the {side} may send: {', '.join(allowed) or 'nothing'}"
        )


def _ended_why(ep: Endpoint) -> str:
    why = {
        DISCONNECTED_INBOUND: "the far side ended it; call end_conversation on this handle",
        DISCONNECTED_OUTBOUND: "this side ended it",
        IN_ERROR: "it is in error; call end_conversation on this handle",
        CLOSED: "it is closed",
    }[ep.state]
    return f"conversation {ep.handle} cannot send: {why}"


def after_send(ep: Endpoint) -> None:
    if ep.state is STARTED_OUTBOUND:
        ep.state = CONVERSING


def on_arrival(ep: Endpoint, message_type: str) -> None:
    """State change when a message reaches this endpoint from the far side."""
    if message_type == END_DIALOG:
        ep.state = CLOSED if ep.state is DISCONNECTED_OUTBOUND else DISCONNECTED_INBOUND
    elif message_type == ERROR:
        ep.state = CLOSED if ep.state is DISCONNECTED_OUTBOUND else IN_ERROR
    elif ep.state is STARTED_OUTBOUND:
        ep.state = CONVERSING


@dataclass(frozen=True)
class EndPlan:
    """What ending one endpoint does: the message (if any) to send to the far side, and the state
    this endpoint is left in."""

    notify: str | None  # END_DIALOG, ERROR or None
    body: bytes
    new_state: State


def plan_end(
    ep: Endpoint, error: int | None = None, description: str = "", far_exists: bool = True
) -> EndPlan:
    """END CONVERSATION [WITH ERROR]. Raises if the endpoint is already ended on this side."""
    if ep.state in (DISCONNECTED_OUTBOUND, CLOSED):
        raise ConversationEnded(f"conversation {ep.handle} was already ended on this side")
    check_error(error, description)
    far_gone = ep.state in (DISCONNECTED_INBOUND, IN_ERROR) or not far_exists
    if far_gone:
        # The far side has ended (or never existed): nobody to tell, the endpoint closes.
        return EndPlan(None, b"", CLOSED)
    if error is not None:
        # WITH ERROR closes this side at once; the far side gets the Error.
        return EndPlan(ERROR, error_body(error, description), CLOSED)
    return EndPlan(END_DIALOG, b"", DISCONNECTED_OUTBOUND)


def check_error(error: object, description: object) -> None:
    """END CONVERSATION WITH ERROR's arguments: a code from 1 to 2**31-1 (None: no error), and a
    description, a string of at most MAX_ERROR_DESCRIPTION characters (non-empty with a code)."""
    checks.whole("error code", error, least=1, most=2**31 - 1, none=True)
    if not isinstance(description, str):
        raise InvalidArgument(
            f"error description must be a string, not {type(description).__name__}"
        )
    if len(description) > MAX_ERROR_DESCRIPTION:
        raise InvalidArgument(
            f"error description is {len(description):,} characters; at most "
            f"{MAX_ERROR_DESCRIPTION:,} are allowed (as in SQL Server): shorten it"
        )
    if error is not None and not description:
        raise InvalidArgument("an error needs a non-empty description")


def error_body(code: int, description: str) -> bytes:
    # cut, for the broker's own descriptions (which may quote a refused body's fault)
    return json.dumps({"code": code, "description": description[:MAX_ERROR_DESCRIPTION]}).encode()


def parse_error_body(body: bytes) -> tuple[int, str]:
    """(code, description) of an Error body; InvalidArgument if it is not one (a far broker may
    send anything): JSON with an int code in 32-bit range and a description string."""
    try:
        doc = json.loads(body)
        code, description = doc["code"], doc["description"]
    except (ValueError, TypeError, KeyError, RecursionError):
        code = description = None
    if (
        not isinstance(code, int)
        or isinstance(code, bool)
        or not -(2**31) <= code < 2**31
        or not isinstance(description, str)
        or len(description) > MAX_ERROR_DESCRIPTION
    ):
        raise InvalidArgument(
            "an Error body must be JSON with an int code and a description string of at most "
            f"{MAX_ERROR_DESCRIPTION:,} characters"
        )
    return code, description


# Error codes the broker itself raises (negative, as Service Broker's are).
LIFETIME_EXPIRED = -8489
CONVERSATION_CLEANED_UP = -8470
CONTRACT_NOT_ACCEPTED = -8408
