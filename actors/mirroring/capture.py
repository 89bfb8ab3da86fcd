"""Capture: every committed transaction of a principal's store, as the statements that made it.

The principal is its store's only writer, so replaying the same write statements with the same
values, in the same order, on an identical copy yields an identical copy (SQLite hands out the
same rowids: a new rowid is the largest plus one). That is the log shipped to the mirror. Why
statements rather than SQLite's own pages or WAL frames: the store already funnels every write
through one connection (`actors.store.file.Connection`), the statements are a few hundred bytes
where pages are 4 KiB each, and the log needs no knowledge of SQLite's file format.

Each transaction that wrote anything gets the next ship sequence number, written into `meta`
(`mirror_seq`) inside that same transaction, on the principal and on the mirror alike: the
number a store holds always says which transactions it holds. Savepoints are followed, so a
group commit's caller whose unit was rolled back leaves nothing in the log.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any, NamedTuple

SEQ_KEY = "mirror_seq"
SET_SEQ = "INSERT OR REPLACE INTO meta (key, value) VALUES ('mirror_seq', ?)"
_WRITES = frozenset({"INSERT", "UPDATE", "DELETE", "REPLACE"})

# One statement: (many, sql, parameters); `many` says executemany (parameters: a list of rows).
Statement = tuple[bool, str, Any]


class Entry(NamedTuple):
    """One committed transaction: its ship sequence number, when it committed, its writes."""

    seq: int
    at: float
    statements: list[Statement]


def _verb(sql: str) -> str:
    head = sql.lstrip()[:12].upper()
    return head.split(None, 1)[0] if head else ""


def stored_seq(get_meta: Callable[[str], str | None]) -> int:
    """The ship sequence number a store holds (0: none yet)."""
    value = get_meta(SEQ_KEY)
    return int(value) if value else 0


class Capture:
    """Watches one connection (set as its `capture`); committed transactions queue in `pending`
    until the shipper takes them. `seq`: the last committed transaction's number."""

    def __init__(self, seq: int, clock: Callable[[], float] = time.time) -> None:
        self.seq = seq
        self.clock = clock
        self.pending: collections.deque[Entry] = collections.deque()
        self.on_commit: Callable[[], None] | None = None  # told after each captured commit
        self._log: list[Statement] | None = None  # the open transaction's writes
        self._marks: list[int] = []  # savepoints: where each began in the log

    def execute(self, cursor: Any, sql: str, parameters: Any) -> Any:
        verb = _verb(sql)
        if verb in _WRITES:
            out = cursor.execute(sql, parameters)
            self._record((False, sql, tuple(parameters)))
            return out
        if verb == "COMMIT":
            return self._commit(cursor, sql)
        out = cursor.execute(sql, parameters)
        if verb == "BEGIN":
            self._log, self._marks = [], []
        elif verb == "SAVEPOINT":
            self._marks.append(len(self._log or ()))
        elif verb == "RELEASE" and self._marks:
            self._marks.pop()
        elif verb == "ROLLBACK":
            if sql.split()[1:2] and sql.split()[1].upper() == "TO":
                if self._log is not None and self._marks:
                    del self._log[self._marks[-1] :]
            else:
                self._log, self._marks = None, []
        return out

    def executemany(self, cursor: Any, sql: str, rows: Any) -> Any:
        if _verb(sql) not in _WRITES:
            return cursor.executemany(sql, rows)
        rows = [tuple(r) for r in rows]  # materialised: an iterator could be read only once
        out = cursor.executemany(sql, rows)
        if rows:
            self._record((True, sql, rows))
        return out

    def _record(self, statement: Statement) -> None:
        log = self._log
        if log is not None:
            # the same statement again (one DELETE per received group, say) joins the one
            # before as one executemany: the same rows in the same order, one call on the mirror;
            # never across a savepoint's start, whose rollback must cut between them
            inside = not self._marks or len(log) - 1 >= self._marks[-1]
            if log and inside and log[-1][1] == statement[1]:
                many, sql, rows = log[-1]
                rows = rows if many else [rows]
                rows.extend(statement[2] if statement[0] else [statement[2]])
                log[-1] = (True, sql, rows)
            else:
                log.append(statement)
        else:  # a write outside BEGIN..COMMIT committed on its own: its own transaction
            self.seq += 1
            self.pending.append(Entry(self.seq, self.clock(), [statement]))
            self._told()

    def _commit(self, cursor: Any, sql: str) -> Any:
        log, self._log, self._marks = self._log, None, []
        if not log:
            return cursor.execute(sql)
        seq = self.seq + 1
        cursor.execute(SET_SEQ, (str(seq),))  # in the same transaction
        out = cursor.execute(sql)
        self.seq = seq
        self.pending.append(Entry(seq, self.clock(), log))
        self._told()
        return out

    def _told(self) -> None:
        if self.on_commit is not None:
            self.on_commit()

    def take(self, most: int) -> list[Entry]:
        """Up to `most` committed entries, oldest first, left queued (`drop_through` drops)."""
        return [self.pending[i] for i in range(min(most, len(self.pending)))]

    def drop_through(self, seq: int) -> None:
        """The mirror holds everything up to `seq`: forget it."""
        while self.pending and self.pending[0].seq <= seq:
            self.pending.popleft()


def attach(store: Any) -> Capture:
    """Capture every transaction `store` (an `actors.store.database.Store`) commits from now on."""
    capture = Capture(stored_seq(store.get_meta))
    store.db.capture = capture
    return capture
