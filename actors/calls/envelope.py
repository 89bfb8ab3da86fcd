"""What crosses actor calls: the verbs' operations and received messages, packed with msgpack.

Bodies are bytes and travel as msgpack bin; nothing user-supplied is pickled. A whole batch (many
operations, or many received groups) is one msgpack blob, so one actor call carries it.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, NamedTuple

import msgpack

from actors.calls.ordering import CallKey
from actors.errors import InvalidArgument, InvalidDefinition, shown
from actors.ids import new_uuid
from actors.model import checks
from actors.model.catalog import DEFAULT, ERROR, check_name
from actors.model.dialogs import check_error, parse_error_body
from actors.model.routing import check_broker_id
from actors.packing import packb
from actors.runs import Row, Run, count, rows_of

MAX_HANDLE = 200  # characters in a conversation handle or group id a caller chooses


def _name(what: str, value: object) -> str:
    try:
        return check_name(what, value)
    except InvalidDefinition as exc:  # an argument to a verb, not a catalog definition
        raise InvalidArgument(str(exc)) from None


def _handle(what: str, value: object, *, none: bool = False) -> None:
    """A conversation handle or group id: a non-empty string of at most MAX_HANDLE characters."""
    if value is None and none:
        return
    if not isinstance(value, str) or not 0 < len(value) <= MAX_HANDLE:
        raise InvalidArgument(
            f"{what} must be a non-empty string of at most {MAX_HANDLE} characters, not "
            f"{shown(value)}"
        )


@dataclass(frozen=True)
class Begin:
    """BEGIN DIALOG. The caller picks the handle (a fresh one by default) so that operations in
    the same batch can send on the new dialog, and so a retried batch names the same dialog.

    `conversation_id` names the conversation itself (a fresh one by default): a caller that
    derives it from its own data (the Spark bridge: ingest id and key) can find the dialog's
    messages in the audit. `if_absent`: when the handle is already this very dialog (same services
    and contract), the Begin does nothing, so a re-run begins each dialog once; also when that
    dialog ended and went, for as long as the broker remembers it (`ended_retention_s`): the
    handle then names no endpoint, a `Send ... AT` of what it sent before sends nothing, and
    any other verb on it raises ConversationEnded.

    `encryption` (seed 003's ENCRYPTION): on, no message of the dialog leaves this broker
    unless dialog security is configured for its far service (a RemoteServiceBinding); they wait
    in the transmission queue, saying so, until it is. Off, they are sealed when it is
    configured and go in the clear when not. Within one broker nothing is encrypted.

    `relays`: the handle of a dialog this broker received (its target side), in the group this
    one joins and on the same contract, that this one carries on (a forwarding router's pair).
    A data message arriving on either of the two while their group has nothing waiting and no
    reader holding it is then sent on the other at once, as the group's handler would, without
    going through the queue (recorded in the delivery audit as received and committed there).
    Ends, Errors and anything arriving while the group is busy take the queue as usual."""

    from_service: str
    to_service: str
    contract: str = DEFAULT
    handle: str = field(default_factory=new_uuid)
    to_broker: str | None = None
    related_conversation: str | None = None
    related_group: str | None = None
    lifetime: float | None = None
    conversation_id: str | None = None
    if_absent: bool = False
    encryption: bool = True
    relays: str | None = None

    def __post_init__(self) -> None:
        _name("from_service", self.from_service)
        _name("to_service", self.to_service)
        _name("contract", self.contract)
        _handle("conversation handle", self.handle)
        _handle("related_conversation", self.related_conversation, none=True)
        _handle("related_group", self.related_group, none=True)
        if self.to_broker is not None:
            if not isinstance(self.to_broker, str):
                raise InvalidArgument(
                    f"to_broker must be a broker id (a string), not {type(self.to_broker).__name__}"
                )
            try:  # normalised as a route's broker_instance is, so ids compare equal
                object.__setattr__(self, "to_broker", check_broker_id(self.to_broker))
            except InvalidArgument as exc:
                raise InvalidArgument(f"to_broker: {exc}") from None
        checks.seconds("dialog lifetime", self.lifetime, none=True)
        _handle("conversation_id", self.conversation_id, none=True)
        checks.flag("if_absent", self.if_absent)
        checks.flag("encryption", self.encryption)
        _handle("relays", self.relays, none=True)


@dataclass(frozen=True)
class Send:
    """SEND: every body, in order, on every handle.

    `at`: the sequence number the first body must get on each dialog. Bodies whose numbers the
    dialog has already used are skipped (they were sent by an earlier try of the same batch), so a
    re-sent batch sends only what is new; an `at` beyond the dialog's next number is refused (it
    would leave a gap)."""

    handles: tuple[str, ...]
    message_type: str
    bodies: tuple[bytes, ...]
    at: int | None

    def __init__(
        self,
        handles: str | Sequence[str],
        message_type: str,
        bodies: bytes | Sequence[bytes],
        at: int | None = None,
    ) -> None:
        if isinstance(handles, str):
            handles = (handles,)
        else:  # a list as the wire brings it, at once; anything else once checked
            kind = type(handles)
            handles = tuple(handles if kind is list else checks.items("handles", handles))
        if not handles:
            raise InvalidArgument("send needs at least one conversation handle")
        # one handle (most sends) is checked without a generator
        h = handles[0]
        if not (type(h) is str and 0 < len(h) <= MAX_HANDLE) or (
            len(handles) > 1
            and not all(type(h) is str and 0 < len(h) <= MAX_HANDLE for h in handles)
        ):
            for handle in handles:  # find the bad one, to name it
                _handle("conversation handle", handle)
        message_type = _name("message type", message_type)
        if isinstance(bodies, (bytes, bytearray)):
            bodies = (bodies,)
        elif type(bodies) is not list and (
            isinstance(bodies, str) or not isinstance(bodies, Sequence)  # an ABC check: slower
        ):
            raise InvalidArgument(
                f"a message body must be bytes (or a list of bytes), not {type(bodies).__name__}"
            )
        # every body bytes? One C-level pass (a generator costs a Python step per body)
        if (len(bodies) != 1 or type(bodies[0]) is not bytes) and set(map(type, bodies)) != {bytes}:
            bodies = tuple(map(_as_bytes, bodies))
        if at is not None:
            checks.whole("send at (a sequence number)", at, least=0)
        # frozen: the fields are set once, in one step (four `object.__setattr__` calls cost
        # more than the checks of a send of one handle)
        self.__dict__.update(
            handles=handles, message_type=message_type, bodies=tuple(bodies), at=at
        )


def _as_bytes(body: object) -> bytes:
    if isinstance(body, (bytes, bytearray)):
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
        _handle("conversation handle", self.handle)
        check_error(self.error, self.description)
        checks.flag("cleanup", self.cleanup)
        if self.cleanup and self.error is not None:
            raise InvalidArgument("end a conversation WITH ERROR or WITH CLEANUP, not both")


@dataclass(frozen=True)
class Timer:
    """BEGIN CONVERSATION TIMER: a DialogTimer message arrives on this endpoint after `timeout`
    seconds (0 cancels a pending timer)."""

    handle: str
    timeout: float

    def __post_init__(self) -> None:
        _handle("conversation handle", self.handle)
        checks.seconds("timer timeout", self.timeout, zero=True)


Op = Begin | Send | End | Timer
_TAGS: dict[type, int] = {Begin: 0, Send: 1, End: 2, Timer: 3}
# fields of each op on the wire, its tag included (a Begin of a release before dialog security
# has no `encryption`: 11 fields, read as off; `relays` is sent only when set)
_ARITY = {0: (11, 12, 13), 1: (5,), 2: (5,), 3: (3,)}


def call_bytes(ops: Sequence[Op]) -> int:
    """The bytes of the bodies one call carries (each body once, however many handles)."""
    size = 0
    for op in ops:
        if isinstance(op, Send):
            size += sum(map(len, op.bodies))
    return size


def check_call_size(ops: Sequence[Op], limit: int) -> None:
    """Refuse a call whose bodies sum to more than `limit` (a broker's max_call_bytes)."""
    size = call_bytes(ops)
    if size > limit:
        raise InvalidArgument(
            f"one call carries {size:,} bytes of bodies; the broker's max_call_bytes is "
            f"{limit:,}: split the operations over several calls, or raise the limit"
        )


NO_OPS = packb([])  # the operations of a call that has none


def pack_ops(ops: Sequence[Op]) -> bytes:
    out: list[list[Any]] = []
    for op in checks.items("ops", ops):
        tag = _TAGS.get(type(op))
        if tag is None:
            raise InvalidArgument(f"{op!r} is not an operation; use Begin, Send, End or Timer")
        if tag == 1:
            out.append([1, list(op.handles), op.message_type, list(op.bodies), op.at])
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
                    op.conversation_id,
                    op.if_absent,
                    op.encryption,
                    *(() if op.relays is None else (op.relays,)),
                ]
            )
        elif tag == 2:
            out.append([2, op.handle, op.error, op.description, op.cleanup])
        else:
            out.append([3, op.handle, op.timeout])
    try:
        return packb(out) if out else NO_OPS
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidArgument(
            f"operations could not be encoded ({exc}); bodies must be bytes"
        ) from None


def unpack_ops(blob: bytes) -> list[Op]:
    """The operations of a call, each checked as the client checked it: a blob another client
    (or anything else) sent that is not a list of well-formed operations is InvalidArgument."""
    if type(blob) is bytes and blob == NO_OPS:  # a receive's commit carries none: nothing to decode
        return []
    try:
        recs = msgpack.unpackb(blob, raw=False) if isinstance(blob, bytes) else None
    except Exception as exc:  # msgpack raises several unrelated types
        raise InvalidArgument(f"operations could not be decoded ({type(exc).__name__})") from None
    if not isinstance(recs, list):
        raise InvalidArgument("operations must arrive as a msgpack list of operations")
    ops: list[Op] = []
    for i, rec in enumerate(recs):
        tag = rec[0] if isinstance(rec, list) and rec else None
        if type(tag) is not int or len(rec) not in _ARITY.get(tag, ()):
            raise InvalidArgument(
                f"operation {i} is not an operation: each is [tag, fields...] with tag 0 (Begin), "
                "1 (Send), 2 (End) or 3 (Timer) and that operation's fields"
            )
        if tag == 1:
            ops.append(Send(rec[1], rec[2], rec[3], rec[4]))
        elif tag == 0:
            extra = {"relays": rec[12]} if len(rec) > 12 else {}
            ops.append(Begin(*rec[1:11], encryption=rec[11] if len(rec) > 11 else False, **extra))
        elif tag == 2:
            ops.append(End(*rec[1:]))
        else:
            ops.append(Timer(*rec[1:]))
    return ops


class Message(NamedTuple):
    """One received message (a row of RECEIVE's result). Immutable; a tuple, so a bulk
    receive's thousands are cheap to make."""

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


class _computed_once:  # noqa: N801 (a decorator, named as functools.cached_property is)
    """`functools.cached_property` without its lock: in Python 3.11 its first access takes an
    RLock, about a third of the cost of making a one-message group's `messages` (each group's is
    made once, in the thread that received it)."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn, self.name = fn, fn.__name__
        self.__doc__ = fn.__doc__

    def __get__(self, obj: Any, cls: type | None = None) -> Any:
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)  # the instance's own from now on
        return value


@dataclass
class ReceivedGroup:
    """The messages RECEIVE took from one conversation group, and the lock on that group.

    Commit or roll back through the client with this object (or its `lock_id`)."""

    group_id: str
    lock_id: str
    state: bytes | None
    endpoints: dict[int, EndpointInfo]
    runs: list[Run]  # the messages, by the run: not an object per message until one is asked for

    @_computed_once
    def rows(self) -> list[Row]:
        """The messages as rows, in order."""
        return rows_of(self.runs)

    @_computed_once
    def messages(self) -> list[Message]:
        eps, gid, new = self.endpoints, self.group_id, tuple.__new__
        out = []
        for qo, ep, seq, mt, bodies, sent, arrived in self.runs:
            handle, conv, svc, far, contract = eps[ep]
            for i, body in enumerate(bodies):
                row = (qo + i, handle, conv, gid, mt, body, seq + i if seq >= 0 else -1, svc, far,
                       contract, sent, arrived)  # fmt: skip
                out.append(new(Message, row))
        return out

    def message(self, i: int) -> Message:
        """`messages[i]`, made alone (a handler that walks the runs makes only those it needs)."""
        if not 0 <= i < len(self):
            raise IndexError(f"message {i} of a group of {len(self)}")
        r = bisect_right(self._starts, i) - 1
        qo, ep, seq, mt, bodies, sent, arrived = self.runs[r]
        k = i - self._starts[r]
        handle, conv, svc, far, contract = self.endpoints[ep]
        return Message(qo + k, handle, conv, self.group_id, mt, bodies[k],
                       seq + k if seq >= 0 else -1, svc, far, contract, sent, arrived)  # fmt: skip

    @_computed_once
    def _starts(self) -> list[int]:
        """The index of each run's first message."""
        return [0, *accumulate(len(r[4]) for r in self.runs)][:-1]

    def __len__(self) -> int:
        return count(self.runs)


def pack_received(groups: Sequence[ReceivedGroup]) -> bytes:
    return packb(
        [[g.group_id, g.lock_id, g.state, list(g.endpoints.items()), g.runs] for g in groups]
    )


NOTHING_RECEIVED = pack_received([])  # the answer of a receive that took nothing


def placed(method: str, args: Any, key: CallKey) -> Any:
    """A call's arguments with `key` (its place in its client's order, actors.calls.ordering) as the
    request id of its change when the caller gave none: an apply's, a settle's, a receive's
    settle part's. Arguments of another shape are left for the verb to refuse."""
    if method == "apply":
        if len(args) == 2 and _unnamed(args[1]):
            return args[0], key
    elif method == "settle":
        if len(args) == 5 and _unnamed(args[4]):
            return (*args[:4], key)
    elif method == "receive" and len(args) == 6:
        settle = args[4]
        if isinstance(settle, (list, tuple)) and len(settle) == 5 and _unnamed(settle[4]):
            return (*args[:4], (*settle[:4], key), args[5])
    return args


def _unnamed(request_id: Any) -> bool:
    """Whether a request id from a client is absent (None); one that is neither absent nor a
    non-empty string is refused, a client cannot pass a place in the order as its own."""
    if request_id is None:
        return True
    if type(request_id) is not str or not request_id:
        raise InvalidArgument(f"request_id must be a non-empty string, not {shown(request_id)}")
    return False


def held_lock(receive_args: Any) -> str | None:
    """The lock a receive's arguments (queue, wait, options, ...) name as its caller's already
    (`lock_id`), if any: what such a receive returns stays under that lock, its caller's."""
    options = receive_args[2] if len(receive_args) > 2 else None
    return options.get("lock_id") if isinstance(options, dict) else None


def taken_locks(method: str, args: Any, answer: Any) -> list[str]:
    """The locks a call's answer (as the broker sends it) took for its caller: a receive's, a
    batch's receives', a shared wait's takes', a conversation group's. None when a receive in
    it read under a lock its caller already held: that read moved the caller's lock on, so
    what it returned stays the caller's."""
    if method == "get_conversation_group":
        return [answer[1]] if answer else []
    if method == "receive":
        receives, taken = [args], [answer]
    elif method == "calls":
        receives = [a for m, a in args[0] if m == "receive"]
        taken = [value for ok, value in answer if ok]
    elif method == "wait_take":
        receives, taken = list(args[2]), [value for ok, value in answer if ok]
    else:
        return []
    if any(held_lock(r) is not None for r in receives):
        return []
    return [
        g.lock_id
        for blob in taken
        if isinstance(blob, bytes) and blob != NOTHING_RECEIVED
        for g in unpack_received(blob)
    ]


def answered_locks(method: str, args: Any, outcome: Any) -> list[str]:
    """`taken_locks` of a call's outcome (an asyncio future or task): none unless it finished
    with an answer (cancelled, or raised, it took nothing for its caller)."""
    if not outcome.done() or outcome.cancelled() or outcome.exception() is not None:
        return []
    return taken_locks(method, args, outcome.result())


def unpack_received(blob: bytes) -> list[ReceivedGroup]:
    out = []
    for gid, lock_id, state, eps, runs in msgpack.unpackb(blob, raw=False, strict_map_key=False):
        out.append(ReceivedGroup(gid, lock_id, state, {k: tuple(v) for k, v in eps}, runs))
    return out
