"""The transmission queue's SQL: messages waiting to leave this broker (or for their target
service to appear here), in order per endpoint, with their attempts and backoff. A part of
`actors.store.database.Store`, kept apart because the rest of the store's tables do not need it.

The queue is kept a run at a time, as a queue's messages are (`actors.store.segments`): what
one transaction sends on one endpoint, its sequence numbers one after another, is one row
holding the bodies and types packed together. A router forwards every message it receives, so
a row per message would be written, read back and deleted for each; a row per run is written
once per dialog per transaction. Status, attempts and backoff belong to the row: the messages
of a row are sent, refused and retried together. An acknowledgement that covers part of a row
(rare: the far side took a prefix) rewrites the row with the rest.
"""

from __future__ import annotations

import json
from collections.abc import Container, Iterable, Iterator, Sequence
from itertools import accumulate
from typing import Any, NamedTuple

import msgpack

from actors.packing import one_or_all, packb
from actors.store.file import Connection, marks, parts
from actors.store.segments import room_for

TRANSMISSION_SCHEMA = """
CREATE TABLE IF NOT EXISTS transmission_runs (
    id INTEGER PRIMARY KEY, endpoint_no INTEGER NOT NULL, first_seq INTEGER NOT NULL,
    last_seq INTEGER NOT NULL, parts BLOB NOT NULL, to_service TEXT NOT NULL, to_broker TEXT,
    status TEXT NOT NULL, enqueued_at REAL NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt REAL NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS transmission_runs_endpoint ON transmission_runs (endpoint_no, first_seq);
CREATE INDEX IF NOT EXISTS transmission_runs_due ON transmission_runs (next_attempt);
"""
_INSERT = (
    "INSERT INTO transmission_runs (endpoint_no, first_seq, last_seq, parts, to_service, "
    "to_broker, status, enqueued_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_COLUMNS = "id, endpoint_no, first_seq, parts, to_service, to_broker, attempts, enqueued_at"

# A row ends at this many messages or bytes of bodies. Its messages are sent, acknowledged and
# retried together (an acknowledgement of part of it, rare, rewrites the rest), so it can be
# larger than a queue's segment, of which a receive may read a few messages: a call's worth
# (`Limits.batch_rows`), so that a sender's batch of a thousand is written, read back, sent and
# deleted as one row, not four.
ROW_MESSAGES = 4096
ROW_BYTES = 1 << 20

# Rows a dispatch pass first looks up by their due time. While a far broker is down its
# dialogs' rows back off; a pass scanning the queue in row order for the few due among them
# read every row (300,000 backing off: 50-70 ms a pass, passes every 50 ms). Fewer due rows
# than this are read by that index and sorted; more are found densely in row order.
DUE_PROBE = 4096

# A run, as the core hands them over: (endpoint_no, first_seq, type, bodies, to_service,
# to_broker, status, enqueued_at); its messages have sequence numbers first_seq and on.
Run = Sequence[Any]


class Waiting(NamedTuple):
    """A row of the transmission queue: one endpoint's messages, sequence numbers
    `first_seq` and on, sent and retried together."""

    id: int
    endpoint_no: int
    first_seq: int
    types: list[str]
    bodies: list[bytes]
    to_service: str
    to_broker: str | None
    attempts: int
    enqueued_at: float

    @property
    def last_seq(self) -> int:
        return self.first_seq + len(self.bodies) - 1

    @property
    def seqs(self) -> range:
        return range(self.first_seq, self.first_seq + len(self.bodies))


def pack_parts(types: Sequence[str], bodies: Sequence[bytes]) -> bytes:
    """[bodies, type] of a row's messages (types: one when they are all the same)."""
    return packb([bodies, one_or_all(list(types))])


def unpack_parts(parts: bytes) -> tuple[list[str], list[bytes]]:
    bodies, types = msgpack.unpackb(parts, raw=False)
    return (types if isinstance(types, list) else [types] * len(bodies)), bodies


def _waiting(row: Sequence[Any]) -> Waiting:
    i, ep, first, parts, to_service, to_broker, attempts, at = row
    types, bodies = unpack_parts(parts)
    return Waiting(i, ep, first, types, bodies, to_service, to_broker, attempts, at)


def rows_of(
    runs: Iterable[Run], most: int = ROW_MESSAGES, most_bytes: int = ROW_BYTES
) -> list[tuple[Any, ...]]:
    """One transaction's runs as transmission rows: the runs of one endpoint that go on from
    each other (the next sequence number, the same target, status and time) share a row, up to
    `most` messages and `most_bytes` of bodies, in the order each endpoint first appears."""
    open_rows: dict[int, list[Any]] = {}  # endpoint -> its last row: [head, types, bodies, size]
    out: list[list[Any]] = []
    for run in runs:
        ep, first, mt, bodies = run[0], run[1], run[2], run[3]
        row = open_rows.get(ep)
        goes_on = row is not None and row[0][1] + len(row[2]) == first and row[0][4:] == run[4:]
        size = sum(map(len, bodies))
        if goes_on and len(row[2]) + len(bodies) <= most and row[3] + size <= most_bytes:
            row[1] += [mt] * len(bodies)  # the usual cases: it fits whole
            row[2] += bodies
            row[3] += size
            continue
        if not goes_on and len(bodies) <= most and size <= most_bytes:
            if bodies:
                head = (ep, first, *run[2:])
                row = open_rows[ep] = [head, [mt] * len(bodies), list(bodies), size]
                out.append(row)
            continue
        ends = list(accumulate(map(len, bodies)))  # cut where the limits say
        start = 0
        while start < len(bodies):
            if not goes_on:
                row = open_rows[ep] = [(ep, first + start, *run[2:]), [], [], 0]
                out.append(row)
            k = room_for(ends, start, most - len(row[2]), most_bytes - row[3])
            k = k or int(not row[2])  # a body over the byte limit alone makes a row of one
            row[1] += [mt] * k
            row[2] += bodies[start : start + k]
            row[3] += ends[start + k - 1] - (ends[start - 1] if start else 0) if k else 0
            start += k
            goes_on = False  # full: the rest starts a new row
    return [
        (h[0], h[1], h[1] + len(bodies) - 1, pack_parts(types, bodies), *h[4:])
        for h, types, bodies, _ in out
    ]


class TransmissionRows:
    """The transmission table's statements (`Store` is one; `db` is its connection)."""

    db: Connection

    def insert_transmission(self, runs: Iterable[Run]) -> None:
        """runs: (endpoint_no, first_seq, type, bodies, to_service, to_broker, status,
        enqueued_at)."""
        self.db.executemany(_INSERT, rows_of(runs))

    def waiting_endpoints(self, to_service: str) -> list[int]:
        """The endpoints with messages waiting to go to `to_service`, oldest first."""
        rows = self.db.execute(
            "SELECT endpoint_no FROM transmission_runs WHERE to_service=? ORDER BY id",
            (to_service,),
        )
        return list(dict.fromkeys(r[0] for r in rows))

    def parked_endpoints(self) -> list[int]:
        """Every endpoint with messages in the transmission queue."""
        sql = "SELECT DISTINCT endpoint_no FROM transmission_runs"
        return [r[0] for r in self.db.execute(sql)]

    def due_transmission(self, now: float, limit: int, skip: Iterable[int] = ()) -> list[Waiting]:
        """Rows due, in queue order, up to about `limit` messages, but those of the endpoints
        in `skip` (being sent) and those behind an older row of their endpoint that is still
        backing off (a dialog's messages go in order)."""
        probed = self.db.execute(
            "SELECT id, endpoint_no FROM transmission_runs INDEXED BY transmission_runs_due "
            "WHERE next_attempt <= ? LIMIT ?",
            (now, DUE_PROBE),
        ).fetchall()
        if len(probed) < DUE_PROBE:  # few: every due row is one of these
            skip = skip if isinstance(skip, (set, frozenset)) else set(skip)
            due = [i for i, ep in probed if ep not in skip]
            if not due:  # none, or all of dialogs being sent: nothing more to read
                return []
            among, args = "id IN (SELECT value FROM json_each(?2))", (now, json.dumps(due))
        else:  # many: found densely in row order
            among = "endpoint_no NOT IN (SELECT value FROM json_each(?2))"
            args = (now, json.dumps(list(skip)))
        cur = self.db.execute(
            f"SELECT {_COLUMNS} FROM transmission_runs t WHERE {among} AND next_attempt <= ?1 "
            "AND NOT EXISTS (SELECT 1 FROM transmission_runs o WHERE o.endpoint_no = "
            "t.endpoint_no AND o.first_seq < t.first_seq AND o.next_attempt > ?1) ORDER BY id",
            args,
        )
        out: list[Waiting] = []
        n = 0
        while n < limit and (batch := cur.fetchmany(64)):
            for row in batch:
                w = _waiting(row)
                out.append(w)
                n += len(w.bodies)
                if n >= limit:
                    break
        return out

    def endpoint_transmission(self, endpoint_no: int) -> list[Waiting]:
        """One endpoint's rows, in sequence order."""
        sql = f"SELECT {_COLUMNS} FROM transmission_runs WHERE endpoint_no=? ORDER BY first_seq"
        return [_waiting(r) for r in self.db.execute(sql, (endpoint_no,))]

    def delay_transmission(self, rows: Iterable[tuple[str, float, int, int]]) -> None:
        """rows: (status, next_attempt, attempts, id)."""
        self.db.executemany(
            "UPDATE transmission_runs SET status=?, next_attempt=?, attempts=? WHERE id=?", rows
        )

    def fail_transmission(
        self,
        ids: Iterable[int],
        status: str,
        now: float,
        retry_min_s: float = 0.05,
        retry_max_s: float = 5.0,
    ) -> None:
        """No hop took these rows: count the attempt and back off (`retry_min_s` doubling up to
        `retry_max_s`, as `Limits.backoff`)."""
        self.db.executemany(
            "UPDATE transmission_runs SET status=?, attempts=attempts+1, "
            "next_attempt=? + MIN(?, ? * (1 << MIN(attempts, 10))) WHERE id=?",
            ((status, now, retry_max_s, retry_min_s, i) for i in dict.fromkeys(ids)),
        )

    def retry_now(self, endpoint_no: int | None = None) -> int:
        """Make every waiting row (of one endpoint) due, not waiting out its backoff (a route
        changed, an operator asked); how many messages were waiting."""
        where, args = "next_attempt > 0", ()
        if endpoint_no is not None:
            where, args = "next_attempt > 0 AND endpoint_no=?", (endpoint_no,)
        waiting = self.db.execute(
            f"SELECT COALESCE(SUM(last_seq - first_seq + 1), 0) FROM transmission_runs "
            f"WHERE {where}",
            args,
        ).fetchone()[0]
        self.db.execute(f"UPDATE transmission_runs SET next_attempt=0 WHERE {where}", args)
        return waiting

    def delete_acknowledged(
        self,
        ranges: Iterable[tuple[int, int, int]],
        on_edges: Container[tuple[int, int, int]] = (),
    ) -> None:
        """ranges: (endpoint_no, first_seq, last_seq) acknowledged by the far broker. A row the
        range covers goes; a row it covers in part keeps the rest. Those of `ranges` in
        `on_edges` are known to begin where a row begins and end where one ends (the rows that
        were sent): no row straddles their ends, so none is left in part and none is looked
        for (a statement per range saved, in the usual case)."""
        ranges = list(ranges)
        self.db.executemany(
            "DELETE FROM transmission_runs WHERE endpoint_no=? AND first_seq>=? AND last_seq<=?",
            ranges,
        )
        for ep, first, last in ranges:
            if (ep, first, last) in on_edges:
                continue
            for row in self.db.execute(
                f"SELECT {_COLUMNS} FROM transmission_runs WHERE endpoint_no=? "
                "AND first_seq<=? AND last_seq>=?",
                (ep, last, first),
            ).fetchall():
                self._keep_unacknowledged(_waiting(row), first, last)

    def _keep_unacknowledged(self, w: Waiting, first: int, last: int) -> None:
        keep = [i for i, seq in enumerate(w.seqs) if not first <= seq <= last]
        if not keep:  # the rest of a row an earlier range of the answer covered in part
            self.db.execute("DELETE FROM transmission_runs WHERE id=?", (w.id,))
            return
        # an acknowledged range is one run of numbers: what is left of a row is one run too,
        # unless the range is inside the row (then the row is cut in two)
        pieces = [keep]
        breaks = [k for k in range(1, len(keep)) if keep[k] != keep[k - 1] + 1]
        if breaks:
            pieces = [keep[: breaks[0]], keep[breaks[0] :]]
        head, *tail = pieces
        self.db.execute(
            "UPDATE transmission_runs SET first_seq=?, last_seq=?, parts=? WHERE id=?",
            (*self._span(w, head), w.id),
        )
        for piece in tail:  # a row of its own, numbered last: readers order by sequence
            self.db.execute(
                "INSERT INTO transmission_runs (endpoint_no, first_seq, last_seq, parts, "
                "to_service, to_broker, status, enqueued_at, attempts, next_attempt) SELECT "
                "endpoint_no, ?, ?, ?, to_service, to_broker, status, enqueued_at, attempts, "
                "next_attempt FROM transmission_runs WHERE id=?",
                (*self._span(w, piece), w.id),
            )

    @staticmethod
    def _span(w: Waiting, keep: list[int]) -> tuple[int, int, bytes]:
        return (
            w.first_seq + keep[0],
            w.first_seq + keep[-1],
            pack_parts([w.types[i] for i in keep], [w.bodies[i] for i in keep]),
        )

    def with_transmission(self, endpoint_nos: Iterable[int]) -> set[int]:
        """Those of `endpoint_nos` with rows in the transmission queue (one statement for up to
        a few hundred of them)."""
        out: set[int] = set()
        for part in parts(list(endpoint_nos)):
            where = f"endpoint_no IN ({marks(part)})"
            sql = f"SELECT DISTINCT endpoint_no FROM transmission_runs WHERE {where}"
            out.update(r[0] for r in self.db.execute(sql, part))
        return out

    def delete_endpoint_transmission(self, endpoint_no: int) -> None:
        self.db.execute("DELETE FROM transmission_runs WHERE endpoint_no=?", (endpoint_no,))

    def transmission_messages(self, limit: int) -> list[tuple[Any, ...]]:
        """The queue's messages, oldest first, up to `limit`: (row id, endpoint_no, seq, type,
        body size, to_service, to_broker, status, enqueued_at, attempts, next_attempt)."""
        cur = self.db.execute(
            "SELECT id, endpoint_no, first_seq, parts, to_service, to_broker, status, "
            "enqueued_at, attempts, next_attempt FROM transmission_runs ORDER BY id"
        )
        return list(_messages(cur, limit))

    def transmission_depth(self) -> int:
        """Messages waiting in the transmission queue."""
        sql = "SELECT COALESCE(SUM(last_seq - first_seq + 1), 0) FROM transmission_runs"
        return self.db.execute(sql).fetchone()[0]

    def _transmission_of_older_stores(self) -> bool:
        """A store written before the queue was kept in runs (schema 2) has a row per message
        in a `transmission` table: each becomes a row of one, keeping its id, status, attempts
        and backoff, and the table goes. Whether there was one (run in a transaction)."""
        old = "SELECT 1 FROM sqlite_master WHERE type='table' AND name='transmission'"
        if self.db.execute(old).fetchone() is None:
            return False
        rows = self.db.execute(
            "SELECT id, endpoint_no, seq, seq, type, body, to_service, to_broker, status, "
            "enqueued_at, attempts, next_attempt FROM transmission ORDER BY id"
        )
        while batch := rows.fetchmany(10_000):
            self.db.executemany(
                "INSERT INTO transmission_runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                ((*r[:4], pack_parts([r[4]], [r[5]]), *r[6:]) for r in batch),
            )
        self.db.execute("DROP TABLE transmission")
        return True


def _messages(cur: Iterable[Sequence[Any]], limit: int) -> Iterator[tuple[Any, ...]]:
    n = 0
    for i, ep, first, packed, *rest in cur:
        types, bodies = unpack_parts(packed)
        for k, (mt, body) in enumerate(zip(types, bodies, strict=True)):
            if n == limit:
                return
            n += 1
            yield (i, ep, first + k, mt, len(body), *rest)
