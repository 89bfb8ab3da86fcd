"""What travels between brokers: bundles out, acknowledgements back. msgpack lists on the wire;
NamedTuples in memory, so no module keeps a positional layout in a comment."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import msgpack

# Error codes the far broker answers with (negative, as Service Broker's are).
CONVERSATION_NOT_FOUND = -8470
MESSAGE_REFUSED = -8460


class Bundle(NamedTuple):
    """One conversation direction's messages: the dialog's header once, then its messages
    (sequence numbers in order)."""

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
    return msgpack.packb(list(bundles), use_bin_type=True)


def unpack_bundles(blob: bytes) -> list[list[Any]]:
    """Raw bundles (lists); `inbound` checks each before reading it as a `Bundle`."""
    return msgpack.unpackb(blob, raw=False)


def pack_reply(acks: Sequence[Ack], refused: Sequence[str]) -> bytes:
    return msgpack.packb([list(acks), list(refused)], use_bin_type=True)


def unpack_reply(blob: bytes) -> Reply:
    acks, refused = msgpack.unpackb(blob, raw=False)
    return Reply([Ack(*a) for a in acks], list(refused))


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
