"""Segments: a queue's messages stored a run at a time, not a row per message.

Plain Python, no SQL. What one transaction adds to one conversation in one group, with
consecutive message ids, is one segment: one row holding the first and last id and the
messages' bodies, types, sequence numbers and times packed together (msgpack). A store row
costs SQLite about the same whatever it holds, so a send of a hundred messages on one dialog
writes one row instead of a hundred (and their index entries), and the commit that receives
them deletes one.

A segment's messages are received oldest first: `taken_to` is the last id received (the
first id minus one while none is). Received messages of a queue without retention are gone;
with retention (`kept`) they stay, shown as received, until their conversation ends.

Fields that are the same for every message of a segment (the usual case: one type, one send
time, sequence numbers one after another) are packed once.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import msgpack

from actors.packing import packb

# A segment ends at this many messages or bytes of bodies, so that a receive of a few of its
# messages, or the update that marks them received, never handles a large row.
MAX_MESSAGES = 256
MAX_BYTES = 64 << 10

# message rows as the store takes them: (id, group_no, endpoint_no, seq, type, body, status,
# sent_at, arrived_at); a segment row: (first_id, last_id, group_no, endpoint_no, taken_to,
# kept, parts)
MessageRow = Sequence[Any]
SegmentRow = tuple[int, int, int, int, int, int, bytes]


def segments(rows: Sequence[MessageRow]) -> list[SegmentRow]:
    """The message rows of one transaction as segment rows, in the rows' order. A run of
    rows of one group and endpoint with ids one after another is one segment (up to the
    limits); received rows (status 1, a retention queue's) start a segment of their own."""
    out: list[SegmentRow] = []
    run: list[MessageRow] = []
    size = 0
    for r in rows:
        if run:
            last = run[-1]
            if (
                r[0] == last[0] + 1
                and r[1] == last[1]
                and r[2] == last[2]
                and r[6] == last[6]
                and len(run) < MAX_MESSAGES
                and size + len(r[5]) <= MAX_BYTES
            ):
                run.append(r)
                size += len(r[5])
                continue
            out.append(_segment(run))
        run = [r]
        size = len(r[5])
    if run:
        out.append(_segment(run))
    return out


def _segment(run: list[MessageRow]) -> SegmentRow:
    first, last = run[0], run[-1]
    received = bool(first[6])
    return (
        first[0],
        last[0],
        first[1],
        first[2],
        last[0] if received else first[0] - 1,
        int(received),
        pack(run),
    )


def pack(run: Sequence[MessageRow]) -> bytes:
    """[bodies, types, seqs, sent, arrived]; each of the last four one value when the same
    for every message (seqs: the first, when they count up by one)."""
    bodies = [r[5] for r in run]
    types = _one_or_all([r[4] for r in run])
    seqs: Any = [r[3] for r in run]
    if seqs[-1] - seqs[0] == len(seqs) - 1 and all(
        b - a == 1 for a, b in zip(seqs, seqs[1:], strict=False)
    ):
        seqs = seqs[0]
    sent = _one_or_all([r[7] for r in run])
    arrived = _one_or_all([r[8] for r in run])
    return packb([bodies, types, seqs, sent, arrived])


def _one_or_all(values: list[Any]) -> Any:
    v = values[0]
    return v if all(x == v for x in values) else values


def unpack(first_id: int, parts: bytes) -> Iterator[tuple[int, int, str, bytes, float, float]]:
    """The messages of a segment: (id, seq, type, body, sent_at, arrived_at), oldest first."""
    bodies, types, seqs, sent, arrived = msgpack.unpackb(parts, raw=False)
    n = len(bodies)
    types = types if isinstance(types, list) else [types] * n
    seqs = seqs if isinstance(seqs, list) else range(seqs, seqs + n)
    sent = sent if isinstance(sent, list) else [sent] * n
    arrived = arrived if isinstance(arrived, list) else [arrived] * n
    return zip(range(first_id, first_id + n), seqs, types, bodies, sent, arrived, strict=True)


def waiting_rows(
    segment: Sequence[Any], after_id: int = 0
) -> Iterator[tuple[int, int, int, str, bytes, float, float]]:
    """A segment's waiting messages after `after_id`, as receive rows: (id, endpoint_no, seq,
    type, body, sent_at, arrived_at). `segment`: (first_id, endpoint_no, taken_to, parts)."""
    first_id, endpoint_no, taken_to, parts = segment
    start = max(taken_to, after_id)
    for i, seq, mt, body, sent, arrived in unpack(first_id, parts):
        if i > start:
            yield (i, endpoint_no, seq, mt, body, sent, arrived)


def cut(row: Sequence[Any], at: int) -> tuple[SegmentRow, SegmentRow]:
    """A segment row split before message id `at` (first_id < at <= last_id): the two rows
    that replace it, each with what it held of taken_to and kept."""
    first_id, last_id, group_no, endpoint_no, taken_to, kept, parts = row
    msgs = list(unpack(first_id, parts))
    head = [(i, group_no, endpoint_no, s, t, b, 0, se, a) for i, s, t, b, se, a in msgs if i < at]
    tail = [(i, group_no, endpoint_no, s, t, b, 0, se, a) for i, s, t, b, se, a in msgs if i >= at]
    return (
        (first_id, at - 1, group_no, endpoint_no, min(taken_to, at - 1), kept, pack(head)),
        (at, last_id, group_no, endpoint_no, max(taken_to, at - 1), kept, pack(tail)),
    )
