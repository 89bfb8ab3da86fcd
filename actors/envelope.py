"""What crosses actor calls: the verbs' operations and received messages, packed with msgpack.

Bodies are bytes and travel as msgpack bin; nothing user-supplied is pickled. A whole batch (many
operations, or many received groups) is one msgpack blob, so one actor call carries it.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import msgpack

from . import checks
from .catalog import DEFAULT, ERROR
from .dialogs import parse_error_body
from .errors import InvalidArgument


@dataclass(frozen=True)
class Begin:
    """BEGIN DIALOG. The caller picks the handle (a fresh one by default) so that operations in
    the same batch can send on the new dialog, and so a retried batch names the same dialog."""

    from_service: str
    to_service: str
    contract: str = DEFAULT
    handle: str = field(default_factory=lambda: str(uuid.uuid4()))
    to_broker: str | None = None
    related_conversation: str | None = None
    related_group: str | None = None
    lifetime: float | None = None

    def __post_init__(self) -> None:
        checks.seconds("dialog lifetime", self.lifetime, none=True)


@dataclass(frozen=True)
class Send:
    """SEND: every body, in order, on every handle."""

    handles: tuple[str, ...]
    message_type: str
    bodies: tuple[bytes, ...]

    def __init__(
        self, handles: str | Sequence[str], message_type: str, bodies: bytes | Sequence[bytes]
    ) -> None:
        object.__setattr__(
            self, "handles", (handles,) if isinstance(handles, str) else tuple(handles)
        )
        object.__setattr__(self, "message_type", message_type)
        if isinstance(bodies, bytes | bytearray):
            bodies = (bodies,)
        elif isinstance(bodies, str) or not isinstance(bodies, Sequence):
            raise InvalidArgument(
                f"a message body must be bytes (or a list of bytes), not {type(bodies).__name__}"
            )
        if not all(type(body) is bytes for body in bodies):
            bodies = tuple(map(_as_bytes, bodies))
        object.__setattr__(self, "bodies", tuple(bodies))


def _as_bytes(body: object) -> bytes:
    if isinstance(body, bytes | bytearray):
        return bytes(body)
    raise InvalidArgument(f"message bodies must be bytes, not {type(body).__name__}")


@dataclass(frozen=True)
class End:
    """END CONVERSATION [WITH ERROR = code DESCRIPTION = description | WITH CLEANUP]."""

    handle: str
    error: int | None = None
    description: str = ""
    cleanup: bool = False

    def __post_init__(self) -> None:
        checks.whole("error code", self.error, least=1, most=2**31 - 1, none=True)
        checks.flag("cleanup", self.cleanup)


@dataclass(frozen=True)
class Timer:
    """BEGIN CONVERSATION TIMER: a DialogTimer message arrives on this endpoint after `timeout`
    seconds (0 cancels a pending timer)."""

    handle: str
    timeout: float

    def __post_init__(self) -> None:
        checks.seconds("timer timeout", self.timeout, zero=True)


Op = Begin | Send | End | Timer
_TAGS: dict[type, int] = {Begin: 0, Send: 1, End: 2, Timer: 3}


def pack_ops(ops: Sequence[Op]) -> bytes:
    out: list[list[Any]] = []
    for op in checks.items("ops", ops):
        tag = _TAGS.get(type(op))
        if tag is None:
            raise InvalidArgument(f"{op!r} is not an operation; use Begin, Send, End or Timer")
        if tag == 1:
            out.append([1, list(op.handles), op.message_type, list(op.bodies)])
        elif tag == 0:
            out.append(
                [
                    0,
                    op.from_service,
                    op.to_service,
                    op.contract,
                    op.handle,
                    op.to_broker,
                    op.related_conversation,
                    op.related_group,
                    op.lifetime,
                ]
            )
        elif tag == 2:
            out.append([2, op.handle, op.error, op.description, op.cleanup])
        else:
            out.append([3, op.handle, op.timeout])
    try:
        return msgpack.packb(out, use_bin_type=True)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(
            f"operations could not be encoded ({exc}); bodies must be bytes"
        ) from None


def unpack_ops(blob: bytes) -> list[Op]:
    ops: list[Op] = []
    for rec in msgpack.unpackb(blob, raw=False):
        tag = rec[0]
        if tag == 1:
            ops.append(Send(rec[1], rec[2], rec[3]))
        elif tag == 0:
            ops.append(Begin(*rec[1:]))
        elif tag == 2:
            ops.append(End(*rec[1:]))
        else:
            ops.append(Timer(*rec[1:]))
    return ops


@dataclass(frozen=True)
class Message:
    """One received message (a row of RECEIVE's result)."""

    queuing_order: int
    conversation_handle: str
    conversation_id: str
    conversation_group_id: str
    message_type: str
    body: bytes
    sequence_number: int
    service_name: str
    far_service: str
    contract: str
    sent_at: float
    arrived_at: float

    @property
    def error(self) -> tuple[int, str] | None:
        """(code, description) of an Error message, else None."""
        return parse_error_body(self.body) if self.message_type == ERROR else None


# Per endpoint, once per group: (handle, conversation_id, service, far_service, contract).
EndpointInfo = tuple[str, str, str, str, str]
# Per message: (queuing_order, endpoint_no, seq, message_type, body, sent_at, arrived_at).
Row = tuple[int, int, int, str, bytes, float, float]


@dataclass
class ReceivedGroup:
    """The messages RECEIVE took from one conversation group, and the lock on that group.

    Commit or roll back through the client with this object (or its `lock_id`)."""

    group_id: str
    lock_id: str
    state: bytes | None
    endpoints: dict[int, EndpointInfo]
    rows: list[Row]

    @cached_property
    def messages(self) -> list[Message]:
        eps = self.endpoints
        out = []
        for qo, ep, seq, mt, body, sent, arrived in self.rows:
            handle, conv, svc, far, contract = eps[ep]
            out.append(
                Message(
                    qo,
                    handle,
                    conv,
                    self.group_id,
                    mt,
                    body,
                    seq,
                    svc,
                    far,
                    contract,
                    sent,
                    arrived,
                )
            )
        return out

    def __len__(self) -> int:
        return len(self.rows)


def pack_received(groups: Sequence[ReceivedGroup]) -> bytes:
    return msgpack.packb(
        [[g.group_id, g.lock_id, g.state, list(g.endpoints.items()), g.rows] for g in groups],
        use_bin_type=True,
    )


def unpack_received(blob: bytes) -> list[ReceivedGroup]:
    out = []
    for gid, lock_id, state, eps, rows in msgpack.unpackb(blob, raw=False, strict_map_key=False):
        out.append(ReceivedGroup(gid, lock_id, state, {k: tuple(v) for k, v in eps}, rows))
    return out
