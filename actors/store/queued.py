"""A queue's messages' SQL, over segments (actors.store.segments): what arrives, what a receive
reads, what its commit removes, moves between groups and the views. A part of
`actors.store.database.Store`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from actors.runs import Run
from actors.store import segments
from actors.store.file import Connection, marks, parts
from actors.store.savepoints import HeldWrites

SCHEMA_VERSION = "3"  # meta's `schema`: 3, the transmission queue in runs too (2: a row per
# message; 1: a queue's messages a row each too)
INSERT_SEGMENTS = "INSERT INTO segments VALUES (?, ?, ?, ?, ?, ?, ?)"
# The received messages of a group, [its first waiting id, `last`]: a lock's range. Those of a
# segment are always its oldest waiting ones (a receive takes a group's in id order), so a
# segment is either wholly received, or its first ones are: (taken_to, kept) say which.
# Segments wholly received before (a retention queue's) are never touched again.
REMOVE_WHOLE = "DELETE FROM segments WHERE group_no=? AND last_id<=? AND taken_to<last_id"
REMOVE_HEAD = (
    "UPDATE segments SET taken_to=?, kept=0 "
    "WHERE group_no=? AND first_id<=? AND last_id>? AND taken_to<?"
)
KEEP_RECEIVED = (
    "UPDATE segments SET taken_to=MIN(last_id, ?), kept=1 "
    "WHERE group_no=? AND first_id<=? AND taken_to<last_id AND taken_to<?"
)


class QueuedMessages:
    """The segments table's statements (`Store` is one; `db` is its connection)."""

    db: Connection
    writes: HeldWrites

    def insert_messages(self, runs: Sequence[Sequence[Any]]) -> None:
        """runs: (first_id, group_no, endpoint_no, first_seq, type, bodies, status, sent_at,
        arrived_at), one transaction's, stored as segments (actors.store.segments). Held back
        in a group commit's unit (actors.store.savepoints)."""
        segs = segments.segments(runs)
        if not self.writes.hold(INSERT_SEGMENTS, segs):
            self.db.executemany(INSERT_SEGMENTS, segs)

    def fetch_group(self, group_no: int, limit: int | None, after_id: int = 0) -> list[Run]:
        """A group's waiting messages in queue order (after `after_id`), at most `limit`, as
        received runs (`actors.runs.Run`)."""
        out: list[Run] = []
        left = limit
        for seg in self.db.execute(
            "SELECT first_id, endpoint_no, taken_to, parts FROM segments "
            "WHERE group_no=? AND last_id>? AND taken_to<last_id ORDER BY first_id LIMIT ?",
            (group_no, after_id, -1 if limit is None else limit),
        ).fetchall():
            for run in segments.waiting_runs(seg, after_id):
                if left is not None:
                    if len(run[4]) >= left:
                        out.append((*run[:4], run[4][:left], *run[5:]))
                        return out
                    left -= len(run[4])
                out.append(run)
        return out

    def remove_received(
        self,
        ranges: Sequence[tuple[int, int]],
        retain: bool,
        cut: Sequence[tuple[int, int]] | None = None,
    ) -> None:
        """Delete (or, with retention, mark received) groups' waiting messages: per range
        (group_no, last_id), the group's from its first waiting one to `last_id` (a lock's
        range); one statement per kind for all of them. `cut`: those of `ranges` that may end
        inside a segment (None: any of them), whose segment keeps its messages after
        `last_id`; the others end where a segment ends, and their commit deletes whole
        segments only (the usual case: a receive takes all that waits). Held back in a group
        commit's unit (actors.store.savepoints): these statements commute with inserts (of new
        ids) and with each other."""
        if retain:
            writes = [(KEEP_RECEIVED, [(last, g, last, last) for g, last in ranges])]
        else:
            heads = ranges if cut is None else cut
            writes = [
                (REMOVE_WHOLE, list(ranges)),
                (REMOVE_HEAD, [(last, g, last, last, last) for g, last in heads]),
            ]
        for sql, rows in writes:
            if rows and not self.writes.hold(sql, rows):
                self.db.executemany(sql, rows)

    def settle_received(self, group_nos: Sequence[int]) -> None:
        """A queue's retention changed: each segment of its groups some of whose messages
        were received is cut in two, so that a segment's received messages all follow one
        rule (kept or gone) and the next receive applies the new one to the rest."""
        for chunk in parts(list(group_nos)):
            split = self.db.execute(
                "SELECT first_id, last_id, group_no, endpoint_no, taken_to, kept, parts "
                f"FROM segments WHERE group_no IN ({marks(chunk)}) "
                "AND taken_to>=first_id AND taken_to<last_id",
                chunk,
            ).fetchall()
            for row in split:
                head, tail = segments.cut(row, row[4] + 1)
                self.db.execute("DELETE FROM segments WHERE first_id=?", (row[0],))
                self.db.executemany(INSERT_SEGMENTS, [head, tail] if head[5] else [tail])

    def delete_conversation_messages(self, group_no: int, endpoint_no: int) -> int:
        """Delete every message of one endpoint; returns how many were still waiting."""
        (waiting,) = self.db.execute(
            "SELECT COALESCE(SUM(last_id - taken_to), 0) FROM segments "
            "WHERE group_no=? AND endpoint_no=?",
            (group_no, endpoint_no),
        ).fetchone()
        self.db.execute(
            "DELETE FROM segments WHERE group_no=? AND endpoint_no=?", (group_no, endpoint_no)
        )
        return waiting

    def move_messages(self, endpoint_no: int, old_group: int, new_group: int) -> list[int]:
        """Move an endpoint's messages to another group; the ids of the waiting ones moved."""
        ids = [
            i
            for taken_to, last_id in self.db.execute(
                "SELECT taken_to, last_id FROM segments WHERE group_no=? AND endpoint_no=? "
                "ORDER BY first_id",
                (old_group, endpoint_no),
            ).fetchall()
            for i in range(taken_to + 1, last_id + 1)
        ]
        self.db.execute(
            "UPDATE segments SET group_no=? WHERE group_no=? AND endpoint_no=?",
            (new_group, old_group, endpoint_no),
        )
        return ids

    def waiting_by_group(self) -> list[tuple[int, str, int, int]]:
        """(group_no, queue, count, first id) of every group with waiting messages."""
        return self.db.execute(
            "SELECT s.group_no, g.queue, SUM(s.last_id - s.taken_to), MIN(s.taken_to + 1) "
            "FROM segments s JOIN groups g ON g.no = s.group_no "
            "WHERE s.taken_to<s.last_id GROUP BY s.group_no"
        ).fetchall()

    def queue_rows(self, group_nos: Sequence[int], limit: int) -> list[tuple[Any, ...]]:
        """Messages of the given groups in queue order, for the queue view: MESSAGE_COLUMNS,
        group_no, status (0 waiting, 1 received and kept)."""
        out: list[tuple[Any, ...]] = []
        for chunk in parts(list(group_nos)):
            for first_id, group_no, endpoint_no, taken_to, kept, packed in self.db.execute(
                "SELECT first_id, group_no, endpoint_no, taken_to, kept, parts FROM segments "
                f"WHERE group_no IN ({marks(chunk)}) ORDER BY first_id LIMIT ?",
                (*chunk, limit),
            ).fetchall():
                for i, seq, mt, body, sent, arrived in segments.unpack(first_id, packed):
                    if i > taken_to or kept:
                        status = int(i <= taken_to)
                        out.append((i, endpoint_no, seq, mt, body, sent, arrived, group_no, status))
        out.sort(key=lambda r: r[0])
        return out[:limit]
