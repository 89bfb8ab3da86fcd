"""Segments: a queue's messages stored a run at a time, not a row per message.

Plain Python, no SQL. The core hands the store runs: the messages one send put on one
endpoint's queue, ids and sequence numbers one after another, one type, one time
(`actors.core.delivery`). Runs of one transaction that follow each other on one endpoint of one
group are one segment: one row holding the first and last id and the messages' bodies, types,
sequence numbers and times packed together (msgpack). A store row costs SQLite about the same
whatever it holds, so a send of a hundred messages on one dialog writes one row instead of a
hundred (and their index entries), and the commit that receives them deletes one; and no
Python object is made per message on the way in.

A segment's messages are received oldest first: `taken_to` is the last id received (the
first id minus one while none is). Received messages of a queue without retention are gone;
with retention (`kept`) they stay, shown as received, until their conversation ends.

Fields that are the same for every message of a segment (the usual case: one type, one send
time, sequence numbers one after another) are packed once.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Sequence
from itertools import accumulate
from typing import Any

import msgpack

from actors.packing import first_or_all, one_or_all, packb
from actors.runs import Run, runs_of

# A segment ends at this many messages or bytes of bodies, so that a receive of a few of its
# messages, or the update that marks them received, never handles a large row.
MAX_MESSAGES = 256
MAX_BYTES = 64 << 10

# A run: (first_id, group_no, endpoint_no, first_seq, type, bodies, status, sent_at,
# arrived_at); its messages have ids and sequence numbers first_id, first_seq and on (a
# sequence of -1, the broker's own message, stays -1). A segment row: (first_id, last_id,
# group_no, endpoint_no, taken_to, kept, parts).
StoredRun = Sequence[Any]
SegmentRow = tuple[int, int, int, int, int, int, bytes]


def run_of(row: Sequence[Any]) -> tuple[Any, ...]:
    """A message row (id, group_no, endpoint_no, seq, type, body, status, sent_at, arrived_at)
    as a run of one."""
    i, group, endpoint, seq, mt, body, status, sent, arrived = row
    return (i, group, endpoint, seq, mt, [body], status, sent, arrived)


def segments(runs: Sequence[StoredRun]) -> list[SegmentRow]:
    """The runs of one transaction as segment rows, in the runs' order: a run that goes on
    from the one before (same group, endpoint and status, the next id) joins its segment, up
    to the limits; a longer run is cut. Received runs (status 1, a retention queue's) are
    taken and kept."""
    out: list[SegmentRow] = []
    pieces: list[tuple[StoredRun, int, int]] = []  # (run, start, end): what the open segment holds
    n = size = 0
    for run in runs:
        bodies = run[5]
        count = len(bodies)
        if not count:
            continue
        nbytes = sum(map(len, bodies))
        if pieces:
            last, _, end = pieces[-1]
            if not (
                run[0] == last[0] + end
                and run[1] == last[1]
                and run[2] == last[2]
                and run[6] == last[6]
            ):
                out.append(_segment(pieces))
                pieces, n, size = [], 0, 0
        if n + count <= MAX_MESSAGES and size + nbytes <= MAX_BYTES:  # the usual case
            pieces.append((run, 0, count))
            n, size = n + count, size + nbytes
            continue
        ends = list(accumulate(map(len, bodies)))  # longer than the room left: cut it
        start = 0
        while True:
            k = room_for(ends, start, MAX_MESSAGES - n, MAX_BYTES - size) or int(not n)
            if k:  # (a body over the byte limit alone makes a segment of one)
                pieces.append((run, start, start + k))
                n, size = n + k, size + ends[start + k - 1] - (ends[start - 1] if start else 0)
                start += k
            if start == count:
                break
            out.append(_segment(pieces))
            pieces, n, size = [], 0, 0
    if pieces:
        out.append(_segment(pieces))
    return out


def room_for(ends: list[int], start: int, messages: int, nbytes: int) -> int:
    """How many bodies from `start` on fit in `messages` messages and `nbytes` bytes, `ends`
    being the bodies' running byte totals (`accumulate` of their lengths): found by bisection,
    not body by body."""
    before = ends[start - 1] if start else 0
    return bisect_right(ends, before + nbytes, start, min(len(ends), start + messages)) - start


def _segment(pieces: list[tuple[StoredRun, int, int]]) -> SegmentRow:
    first_run, first_start, _ = pieces[0]
    last_run, _, last_end = pieces[-1]
    first_id = first_run[0] + first_start
    last_id = last_run[0] + last_end - 1
    received = bool(first_run[6])
    return (
        first_id,
        last_id,
        first_run[1],
        first_run[2],
        last_id if received else first_id - 1,
        int(received),
        pack(pieces),
    )


def pack(pieces: Sequence[tuple[StoredRun, int, int]]) -> bytes:
    """[bodies, types, seqs, sent, arrived] of the pieces' messages; each of the last four one
    value when the same for every message (seqs: the first, when they count up by one)."""
    if len(pieces) == 1:  # one send's messages, or some of them: no list per field
        run, start, end = pieces[0]
        k = end - start
        bodies = run[5] if start == 0 and end == len(run[5]) else run[5][start:end]
        seqs: Any = run[3] + start if run[3] >= 0 else (-1 if k == 1 else [-1] * k)
        return packb([bodies, run[4], seqs, run[7], run[8]])
    bodies, types, seq_list, sent, arrived = [], [], [], [], []
    for run, start, end in pieces:
        k = end - start
        bodies += run[5][start:end]
        types += [run[4]] * k
        seq_list += [-1] * k if run[3] < 0 else range(run[3] + start, run[3] + end)
        sent += [run[7]] * k
        arrived += [run[8]] * k
    return packb(
        [bodies, one_or_all(types), first_or_all(seq_list), one_or_all(sent), one_or_all(arrived)]
    )


def unpack(first_id: int, parts: bytes) -> Iterator[tuple[int, int, str, bytes, float, float]]:
    """The messages of a segment: (id, seq, type, body, sent_at, arrived_at), oldest first."""
    bodies, types, seqs, sent, arrived = msgpack.unpackb(parts, raw=False)
    n = len(bodies)
    types = types if isinstance(types, list) else [types] * n
    seqs = seqs if isinstance(seqs, list) else range(seqs, seqs + n)
    sent = sent if isinstance(sent, list) else [sent] * n
    arrived = arrived if isinstance(arrived, list) else [arrived] * n
    return zip(range(first_id, first_id + n), seqs, types, bodies, sent, arrived, strict=True)


def waiting_runs(segment: Sequence[Any], after_id: int = 0) -> list[Run]:
    """A segment's waiting messages after `after_id`, as received runs (`actors.runs.Run`): one
    when its messages share their type and times (the usual case), else as many as it takes.
    `segment`: (first_id, endpoint_no, taken_to, parts)."""
    first_id, endpoint_no, taken_to, parts = segment
    bodies, types, seqs, sent, arrived = msgpack.unpackb(parts, raw=False)
    start = max(taken_to, after_id, first_id - 1) + 1 - first_id  # the first waiting one
    if start >= len(bodies):
        return []
    if not any(type(x) is list for x in (types, seqs, sent, arrived)):
        return [
            (first_id + start, endpoint_no, seqs + start if seqs >= 0 else -1, types,
             bodies[start:], sent, arrived)
        ]  # fmt: skip
    return runs_of(
        [
            (i, endpoint_no, seq, mt, body, se, a)
            for i, seq, mt, body, se, a in unpack(first_id, parts)
            if i >= first_id + start
        ]
    )


def cut(row: Sequence[Any], at: int) -> tuple[SegmentRow, SegmentRow]:
    """A segment row split before message id `at` (first_id < at <= last_id): the two rows
    that replace it, each with what it held of taken_to and kept."""
    first_id, last_id, group_no, endpoint_no, taken_to, kept, parts = row
    runs = [
        ((i, group_no, endpoint_no, s, t, [b], 0, se, a), 0, 1)
        for i, s, t, b, se, a in unpack(first_id, parts)
    ]
    head, tail = runs[: at - first_id], runs[at - first_id :]
    return (
        (first_id, at - 1, group_no, endpoint_no, min(taken_to, at - 1), kept, pack(head)),
        (at, last_id, group_no, endpoint_no, max(taken_to, at - 1), kept, pack(tail)),
    )
