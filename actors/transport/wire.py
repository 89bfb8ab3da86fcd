"""What travels between brokers: bundles out, acknowledgements back. msgpack lists on the wire;
NamedTuples in memory, so no module keeps a positional layout in a comment."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import msgpack

from actors.errors import BrokerError, InvalidArgument
from actors.model.catalog import check_name
from actors.packing import first_or_all, made, one_or_all, packb

# Error codes the far broker answers with (negative, as Service Broker's are).
CONVERSATION_NOT_FOUND = -8470
MESSAGE_REFUSED = -8460
# dialog security refused the dialog: its key offer, signer, grant or certificates (seed 003)
SECURITY_REFUSED = -8494


class Bundle(NamedTuple):
    """One conversation direction's messages: the dialog's header once, then its messages
    (sequence numbers in order). `security`: None, bodies in the clear; or [offer, sealed]:
    the bodies sealed together with the dialog's session key (`bodies` then holds empty
    placeholders), `offer` its key offer (with message 0) or None (actors.security.sessions).
    A bundle from a broker without dialog security has one field less."""

    conversation_id: str
    from_service: str
    to_service: str
    to_broker: str | None
    from_broker: str
    from_initiator: bool
    contract: str
    expires_at: float | None
    hops_left: int
    seqs: list[int]
    types: list[str]
    bodies: list[bytes]
    sent_ats: list[float]
    security: list[bytes | None] | None = None  # [offer or None, sealed bodies]


class Ack(NamedTuple):
    """The owning broker's answer for a range of sequence numbers: taken (code None), or refused
    with an error code and description."""

    conversation_id: str
    from_initiator: bool
    first_seq: int
    last_seq: int
    owner: str
    code: int | None
    description: str


class Reply(NamedTuple):
    """A far broker's whole answer to one call."""

    acks: list[Ack]
    refused: list[str]  # why some bundles were not taken

    @property
    def refuses_all(self) -> bool:
        """Nothing acknowledged and a reason given: a hop that cannot help (try the next)."""
        return not self.acks and bool(self.refused)


def pack_bundles(bundles: Sequence[Bundle]) -> bytes:
    return packb([_compact(b) for b in bundles])


def _compact(b: Bundle) -> Bundle:
    """A bundle as it travels: its sequence numbers as the first when they have no gap, and its
    messages' type and sent time as one value when they all share it (the usual case), so
    neither broker packs, reads or checks them message by message."""
    seqs, types, sent_ats = first_or_all(b.seqs), one_or_all(b.types), one_or_all(b.sent_ats)
    return made(Bundle, (*b[:9], seqs, types, b.bodies, sent_ats, b.security))


MAX_ID = 128  # characters of a conversation or broker id (ours are 36)
MAX_SEQ = 2**63 - 1  # SQLite's INTEGER


def unpack_bundles(blob: Any) -> list[Any] | str:
    """The raw bundles of a call (read each with `read_bundle`), or why the call cannot be read
    at all. Anything may arrive here: another broker, an older version or a hostile peer."""
    if not isinstance(blob, (bytes, bytearray)):
        return f"a call must carry bytes, not {type(blob).__name__}"
    try:
        raws = msgpack.unpackb(blob, raw=False)
    except Exception:  # msgpack raises several unrelated types for bad input
        return f"{len(blob)} bytes that are not a packed list of bundles"
    if not isinstance(raws, list):
        return f"a call must be a list of bundles, not {_kind(raws)}"
    return raws


def read_bundle(raw: Any) -> Bundle | str:
    """A raw bundle as a `Bundle`, or why it is malformed (then nothing of it is taken)."""
    fields = Bundle._fields
    if not isinstance(raw, list) or len(raw) not in (len(fields) - 1, len(fields)):
        return f"a bundle must be a list of {len(fields)} fields, not {_kind(raw)}"
    b = Bundle(*raw)
    try:
        sec = b.security
        if sec is not None and not (
            isinstance(sec, list)
            and len(sec) == 2
            and (sec[0] is None or isinstance(sec[0], bytes))
            and isinstance(sec[1], bytes)
        ):
            raise InvalidArgument(f"security must be null or [offer, sealed], not {_kind(sec)}")
        _text("conversation_id", b.conversation_id, MAX_ID)
        _text("from_broker", b.from_broker, MAX_ID)
        if b.to_broker is not None:
            _text("to_broker", b.to_broker, MAX_ID)
        for what in ("from_service", "to_service", "contract"):
            _text(what, getattr(b, what), MAX_ID)
            check_name(what.replace("_", " "), getattr(b, what))
        if type(b.from_initiator) is not bool:
            raise InvalidArgument(
                f"from_initiator must be true or false, not {_kind(b.from_initiator)}"
            )
        if b.expires_at is not None:
            _number("expires_at", b.expires_at)
        if type(b.hops_left) is not int:
            raise InvalidArgument(f"hops_left must be an integer, not {_kind(b.hops_left)}")
        bodies = b.bodies
        if not isinstance(bodies, list) or not bodies:
            raise InvalidArgument(f"bodies must be a list of at least one, not {_kind(bodies)}")
        if set(map(type, bodies)) != {bytes}:
            odd = next(body for body in bodies if type(body) is not bytes)
            raise InvalidArgument(f"a body must be bytes, not {_kind(odd)}")
        n = len(bodies)
        seqs, types, sent_ats = _seqs(b.seqs, n), _types(b.types, n), _sent_ats(b.sent_ats, n)
        b = made(Bundle, (*b[:9], seqs, types, bodies, sent_ats, b.security))
    except BrokerError as exc:  # a field's check, or the catalog's name rule
        return str(exc)
    return b


def _seqs(seqs: Any, n: int) -> list[int]:
    """A bundle's sequence numbers: its first (they have no gap) or all of them, increasing."""
    if type(seqs) is int:
        if not 0 <= seqs <= MAX_SEQ - n + 1:
            raise InvalidArgument(f"seqs must run from 0 to {MAX_SEQ:,}, not from {seqs!r}")
        return list(range(seqs, seqs + n))
    _column("seqs", seqs, n)
    last = -1
    for s in seqs:
        if type(s) is not int or not last < s <= MAX_SEQ:
            raise InvalidArgument(f"seqs must be increasing integers from 0, not {seqs[:8]!r}")
        last = s
    return seqs


def _types(types: Any, n: int) -> list[str]:
    """A bundle's message types: one for all its messages, or one each."""
    if isinstance(types, str):
        _type_name(types)
        return [types] * n
    _column("types", types, n)
    if set(map(type, types)) != {str}:
        raise InvalidArgument(f"a message type must be a string, not {_kind(types[:8])}")
    for mt in set(types):
        _type_name(mt)
    return types


def _sent_ats(sent: Any, n: int) -> list[float]:
    """A bundle's sent times: one for all its messages, or one each."""
    if type(sent) in (int, float):
        _number("sent_ats", sent)
        return [sent] * n
    _column("sent_ats", sent, n)
    if not set(map(type, sent)) <= {int, float} or not all(map(math.isfinite, sent)):
        raise InvalidArgument(f"sent_ats must be finite numbers, not {_kind(sent[:8])}")
    return sent


def _column(what: str, values: Any, n: int) -> None:
    if not isinstance(values, list) or len(values) != n:
        raise InvalidArgument(f"{what} must be a list as long as bodies ({n}), not {_kind(values)}")


def _type_name(mt: Any) -> None:
    _text("a message type", mt, MAX_ID)
    check_name("message type", mt)


def _text(what: str, value: Any, most: int) -> None:
    if not isinstance(value, str) or not 0 < len(value) <= most:
        raise InvalidArgument(
            f"{what} must be a string of 1 to {most} characters, not {_kind(value)}"
        )


def _number(what: str, value: Any) -> None:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise InvalidArgument(f"{what} must be a finite number, not {_kind(value)}")


def _kind(value: Any) -> str:
    """A short, safe description of a wrong value (a hostile one may be huge)."""
    text = repr(value)
    return text if len(text) <= 40 else f"a {type(value).__name__} ({text[:30]}...)"


def pack_reply(acks: Sequence[Ack], refused: Sequence[str]) -> bytes:
    return packb([list(acks), list(refused)])


def unpack_reply(blob: Any) -> Reply:
    """A far broker's answer. A malformed answer, or malformed acknowledgements in it, count as
    refusals (the messages are retried), never as an exception in the sender."""
    try:
        acks, refused = msgpack.unpackb(blob, raw=False)
        refused = [str(r) for r in refused]
    except Exception:
        return Reply([], ["the far broker gave an answer that cannot be read"])
    good: list[Ack] = []
    for a in acks if isinstance(acks, list) else [acks]:
        ack = _read_ack(a)
        if ack is None:
            refused.append("the far broker gave a malformed acknowledgement")
        else:
            good.append(ack)
    return Reply(good, refused)


def _read_ack(raw: Any) -> Ack | None:
    if not isinstance(raw, list) or len(raw) != len(Ack._fields):
        return None
    a = Ack(*raw)
    ok = (
        isinstance(a.conversation_id, str)
        and type(a.from_initiator) is bool
        and type(a.first_seq) is int
        and type(a.last_seq) is int
        and isinstance(a.owner, str)
        and (a.code is None or type(a.code) is int)
        and isinstance(a.description, str)
    )
    return a if ok else None


def merge_replies(replies: Sequence[bytes]) -> bytes:
    acks: list[Ack] = []
    refused: list[str] = []
    for blob in replies:
        r = unpack_reply(blob)
        acks += r.acks
        refused += r.refused
    return pack_reply(acks, refused)


def refuses_all(reply: bytes) -> bool:
    return unpack_reply(reply).refuses_all
