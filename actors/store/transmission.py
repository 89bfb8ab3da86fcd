"""The transmission queue's SQL: messages waiting to leave this broker (or for their target
service to appear here), in order per endpoint, with their attempts and backoff. A part of
`actors.store.database.Store`, kept apart because the rest of the store's tables do not need it."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from actors.store.file import Connection


class TransmissionRow(NamedTuple):
    """A message waiting in the transmission queue, as dispatch reads it."""

    id: int
    endpoint_no: int
    seq: int
    message_type: str
    body: bytes
    to_service: str
    to_broker: str | None
    attempts: int
    enqueued_at: float


class WaitingRow(NamedTuple):
    """A message waiting in the transmission queue, as local delivery reads it."""

    id: int
    endpoint_no: int
    seq: int
    message_type: str
    body: bytes
    enqueued_at: float


class TransmissionRows:
    """The transmission table's statements (`Store` is one; `db` is its connection)."""

    db: Connection

    def insert_transmission(self, rows: Iterable[Sequence[Any]]) -> None:
        """rows: (endpoint_no, seq, type, body, to_service, to_broker, status, enqueued_at)."""
        self.db.executemany(
            "INSERT INTO transmission (endpoint_no, seq, type, body, to_service, to_broker, "
            "status, enqueued_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )

    def transmission_for(self, to_service: str) -> list[WaitingRow]:
        """Rows waiting to go to `to_service`, in queue order."""
        return self._waiting("to_service=? ORDER BY id", to_service)

    def _waiting(self, where: str, arg: Any) -> list[WaitingRow]:
        sql = "SELECT id, endpoint_no, seq, type, body, enqueued_at FROM transmission WHERE "
        return [WaitingRow(*r) for r in self.db.execute(sql + where, (arg,))]

    def parked_endpoints(self) -> list[int]:
        """Every endpoint with messages in the transmission queue."""
        return [r[0] for r in self.db.execute("SELECT DISTINCT endpoint_no FROM transmission")]

    def due_transmission(
        self, now: float, limit: int, skip: Iterable[int] = ()
    ) -> list[TransmissionRow]:
        """Rows due, in queue order, but those of the endpoints in `skip` (being sent)."""
        rows = self.db.execute(
            "SELECT id, endpoint_no, seq, type, body, to_service, to_broker, attempts, "
            "enqueued_at FROM transmission WHERE next_attempt <= ? AND endpoint_no NOT IN "
            "(SELECT value FROM json_each(?)) ORDER BY id LIMIT ?",
            (now, json.dumps(list(skip)), limit),
        ).fetchall()
        return [TransmissionRow(*r) for r in rows]

    def endpoint_transmission(self, endpoint_no: int) -> list[WaitingRow]:
        """One endpoint's waiting rows, in sequence order."""
        return self._waiting("endpoint_no=? ORDER BY seq", endpoint_no)

    def delay_transmission(self, rows: Iterable[tuple[str, float, int, int]]) -> None:
        """rows: (status, next_attempt, attempts, id)."""
        self.db.executemany(
            "UPDATE transmission SET status=?, next_attempt=?, attempts=? WHERE id=?", rows
        )

    def fail_transmission(
        self,
        ids: Sequence[int],
        status: str,
        now: float,
        retry_min_s: float = 0.05,
        retry_max_s: float = 5.0,
    ) -> None:
        """No hop took these rows: count the attempt and back off (`retry_min_s` doubling up to
        `retry_max_s`, as `Limits.backoff`)."""
        self.db.executemany(
            "UPDATE transmission SET status=?, attempts=attempts+1, "
            "next_attempt=? + MIN(?, ? * (1 << MIN(attempts, 10))) WHERE id=?",
            ((status, now, retry_max_s, retry_min_s, i) for i in ids),
        )

    def retry_now(self, endpoint_no: int | None = None) -> int:
        """Make every waiting row (of one endpoint) due, not waiting out its backoff (a route
        changed, an operator asked); how many were waiting."""
        if endpoint_no is None:
            cur = self.db.execute("UPDATE transmission SET next_attempt=0 WHERE next_attempt > 0")
        else:
            cur = self.db.execute(
                "UPDATE transmission SET next_attempt=0 WHERE next_attempt > 0 AND endpoint_no=?",
                (endpoint_no,),
            )
        return cur.rowcount

    def delete_acknowledged(self, ranges: Iterable[tuple[int, int, int]]) -> None:
        """ranges: (endpoint_no, first_seq, last_seq) acknowledged by the far broker."""
        self.db.executemany(
            "DELETE FROM transmission WHERE endpoint_no=? AND seq BETWEEN ? AND ?", ranges
        )

    def oldest_seq(self, endpoint_no: int) -> int | None:
        row = self.db.execute(
            "SELECT MIN(seq) FROM transmission WHERE endpoint_no=?", (endpoint_no,)
        ).fetchone()
        return row[0]

    def has_transmission(self, endpoint_no: int) -> bool:
        return (
            self.db.execute(
                "SELECT 1 FROM transmission WHERE endpoint_no=? LIMIT 1", (endpoint_no,)
            ).fetchone()
            is not None
        )

    def delete_transmission(self, ids: Iterable[int]) -> None:
        self.db.executemany("DELETE FROM transmission WHERE id=?", ((i,) for i in ids))

    def delete_endpoint_transmission(self, endpoint_no: int) -> None:
        self.db.execute("DELETE FROM transmission WHERE endpoint_no=?", (endpoint_no,))

    def transmission_rows(self, limit: int) -> list[tuple[Any, ...]]:
        return self.db.execute(
            "SELECT id, endpoint_no, seq, type, length(body), to_service, to_broker, status, "
            "enqueued_at, attempts, next_attempt FROM transmission ORDER BY id LIMIT ?",
            (limit,),
        ).fetchall()

    def transmission_depth(self) -> int:
        """Messages waiting in the transmission queue."""
        return self.db.execute("SELECT COUNT(*) FROM transmission").fetchone()[0]
