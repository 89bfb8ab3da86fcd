"""The broker's durable store: one SQLite file in WAL mode (or `:memory:`).

All SQL lives here (the transmission queue's in `actors.store.transmission`). One connection, one
transaction context (`tx`), the only place a transaction begins or ends. The broker's in-memory
indexes are rebuilt from these tables on start, so everything that must survive a crash is
written here inside one transaction per verb.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import msgpack

from actors.calls.ordering import RequestId
from actors.errors import InvalidArgument, StoreError
from actors.packing import packb
from actors.store import segments
from actors.store.checkpoint import CHECKPOINT_PRAGMAS, Checkpointer
from actors.store.file import Connection, check_file, lock, marks, parts, reason
from actors.store.keyed import ENDPOINT_COLUMNS, KEYED_INDEXES, KeyedReads
from actors.store.queued import INSERT_SEGMENTS, SCHEMA_VERSION, QueuedMessages
from actors.store.savepoints import HeldWrites, Savepoint
from actors.store.seq_journal import SEQ_JOURNAL, SeqJournal
from actors.store.traces import EndedTraces
from actors.store.transmission import TRANSMISSION_SCHEMA, TransmissionRows

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS catalog (
    kind TEXT NOT NULL, name TEXT NOT NULL, body TEXT NOT NULL, PRIMARY KEY (kind, name));
CREATE TABLE IF NOT EXISTS groups (
    no INTEGER PRIMARY KEY, group_id TEXT NOT NULL UNIQUE, queue TEXT NOT NULL, state BLOB);
CREATE TABLE IF NOT EXISTS endpoints (
    no INTEGER PRIMARY KEY, handle TEXT NOT NULL UNIQUE, conversation_id TEXT NOT NULL,
    is_initiator INTEGER NOT NULL, service TEXT NOT NULL, far_service TEXT NOT NULL,
    contract TEXT NOT NULL, group_no INTEGER NOT NULL, state TEXT NOT NULL,
    send_seq INTEGER NOT NULL, recv_seq INTEGER NOT NULL, expires_at REAL, timer_at REAL,
    far_broker TEXT, closed_at REAL, user_sent INTEGER, encryption INTEGER NOT NULL DEFAULT 0,
    onward INTEGER);
CREATE INDEX IF NOT EXISTS endpoints_conversation ON endpoints (conversation_id, is_initiator);
CREATE TABLE IF NOT EXISTS dialog_keys (endpoint_no INTEGER PRIMARY KEY, sealed BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS endpoint_seqs (
    no INTEGER PRIMARY KEY, send_seq INTEGER NOT NULL, recv_seq INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS segments (
    first_id INTEGER PRIMARY KEY, last_id INTEGER NOT NULL, group_no INTEGER NOT NULL,
    endpoint_no INTEGER NOT NULL, taken_to INTEGER NOT NULL, kept INTEGER NOT NULL,
    parts BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS segments_group ON segments (group_no, first_id);
CREATE TABLE IF NOT EXISTS routes (
    tbl TEXT NOT NULL, name TEXT NOT NULL, body TEXT NOT NULL, PRIMARY KEY (tbl, name));
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY, at REAL NOT NULL, kind TEXT NOT NULL, subject TEXT NOT NULL,
    detail TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY, at REAL NOT NULL, payload BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS requests (
    request_id TEXT PRIMARY KEY, at REAL NOT NULL, result BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS call_requests (
    id INTEGER PRIMARY KEY, call TEXT NOT NULL, at REAL NOT NULL, results BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS call_requests_call ON call_requests (call);
CREATE TABLE IF NOT EXISTS ended (
    id INTEGER PRIMARY KEY, conversation_id TEXT NOT NULL, recv_seq INTEGER NOT NULL,
    at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS ended_conversation ON ended (conversation_id);
CREATE TABLE IF NOT EXISTS rerunnable (
    handle TEXT PRIMARY KEY, conversation_id TEXT, service TEXT, far_service TEXT,
    contract TEXT, send_seq INTEGER, ended_at REAL);
CREATE INDEX IF NOT EXISTS rerunnable_ended ON rerunnable (ended_at) WHERE ended_at IS NOT NULL;
"""

MESSAGE_COLUMNS = "id, endpoint_no, seq, type, body, sent_at, arrived_at"  # a receive's rows


class Store(QueuedMessages, TransmissionRows, EndedTraces, KeyedReads):
    """SQLite persistence for one broker. `durability`: "normal" (a committed transaction survives
    the process being killed; WAL with synchronous=NORMAL) or "full" (also survives power loss)."""

    def __init__(self, path: str, durability: str = "normal", holder: str = "") -> None:
        """`holder`: the broker's name, told to a second broker refused the same file."""
        if durability not in ("normal", "full"):
            raise InvalidArgument(f"durability must be 'normal' or 'full', got {durability!r}")
        self.path = path
        self._lock_fd: int | None = None
        self._in_tx = False
        if path != ":memory:":
            check_file(path)
            self._lock_fd = lock(path, holder)
        try:
            self.db = sqlite3.connect(
                path, isolation_level=None, check_same_thread=False, factory=Connection
            )
            self.db.path = path
            self.writes = HeldWrites(self.db)
            if path != ":memory:":
                for pragma in ("journal_mode=WAL", *CHECKPOINT_PRAGMAS):
                    self.db.execute(f"PRAGMA {pragma}")
            self.db.execute(f"PRAGMA synchronous={durability.upper()}")
            self.db.execute("PRAGMA busy_timeout=5000")
            self.db.execute("PRAGMA cache_size=-65536")  # 64 MiB: receive reads what send wrote
            # a group commit's units are savepoints: SQLite keeps the pages a unit changes in a
            # sub-journal, a temporary file by default (a write call per page); in memory a
            # new dialog's store writes cost less than half as much
            self.db.execute("PRAGMA temp_store=MEMORY")
            # Debian's SQLite is built with secure_delete on: every deleted row's pages are
            # zeroed and written again, so a consumed batch costs its bytes twice more (WAL and
            # checkpoint). FAST zeroes what is in pages being written anyway, not freed ones.
            self.db.execute("PRAGMA secure_delete=FAST")
            self.db.executescript(SCHEMA + TRANSMISSION_SCHEMA + KEYED_INDEXES + SEQ_JOURNAL)
            self.seq_journal = SeqJournal(self.db)
            self._seqs_of_older_stores()
            self._upgrade_older_stores()
            # the broker id is born with the store and never changes
            self.db.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('broker_id', ?)",
                (str(uuid.uuid4()),),
            )
            self.broker_id: str = self.get_meta("broker_id") or ""
            if path != ":memory:":
                self._checkpointer = Checkpointer(path, durability)
        except (StoreError, sqlite3.Error) as exc:
            self.close()
            why = exc.reason if isinstance(exc, StoreError) else reason(exc)
            raise StoreError(path, "open", why) from exc

    def close(self) -> None:
        """Close the file and release it to the next broker (idempotent)."""
        checkpointer = getattr(self, "_checkpointer", None)
        if checkpointer is not None:
            checkpointer.stop()
            self._checkpointer = None
        db = getattr(self, "db", None)
        if db is not None:
            db.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the lock
            self._lock_fd = None

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; rolls back if the block or the commit raises. A store fault
        (disk full, read-only, I/O error) is a `StoreError`; the store stays usable after it."""
        assert not self._in_tx, "transactions do not nest"
        self.db.execute("BEGIN IMMEDIATE")
        self._in_tx = True
        try:
            yield self.db
            self.seq_journal.before_commit()
            self.db.execute("COMMIT")
        except BaseException:
            self._roll_back()
            self.seq_journal.rolled_back()
            raise
        else:
            self.seq_journal.committed()
        finally:
            self._in_tx = False
            self.writes.reset()

    def savepoint(self) -> Savepoint:
        """One unit in the open transaction (a group commit's caller); see
        actors.store.savepoints."""
        return self.writes.savepoint()

    @property
    def in_tx_lost(self) -> bool:
        """Whether the open transaction can no longer commit what its units wrote."""
        return self._in_tx and (not self.db.in_transaction or self.writes.broken)

    def _roll_back(self) -> None:
        # After some I/O errors SQLite has already rolled the transaction back itself.
        if self.db.in_transaction:
            # In WAL mode a rollback writes nothing, so it works on a full or read-only disk;
            # should it fail anyway, the error that got us here is the one worth raising.
            with contextlib.suppress(StoreError):
                self.db.execute("ROLLBACK")

    # --- meta and catalog ------------------------------------------------------------------------

    def get_meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def load_catalog(self) -> list[tuple[str, dict[str, Any]]]:
        rows = self.db.execute("SELECT kind, body FROM catalog ORDER BY rowid").fetchall()
        return [(kind, json.loads(body)) for kind, body in rows]

    def put_definition(self, kind: str, name: str, record: dict[str, Any]) -> None:
        # An UPDATE keeps the row's place, so definitions reload in creation order.
        body = json.dumps(record)
        cur = self.db.execute(
            "UPDATE catalog SET body=? WHERE kind=? AND name=?", (body, kind, name)
        )
        if cur.rowcount == 0:
            self.db.execute(
                "INSERT INTO catalog (kind, name, body) VALUES (?, ?, ?)", (kind, name, body)
            )

    def delete_definition(self, kind: str, name: str) -> None:
        self.db.execute("DELETE FROM catalog WHERE kind=? AND name=?", (kind, name))

    # --- groups ----------------------------------------------------------------------------------

    def insert_groups(self, rows: Iterable[tuple[int, str, str]]) -> None:
        self.db.executemany("INSERT INTO groups (no, group_id, queue) VALUES (?, ?, ?)", rows)

    def group_state(self, no: int) -> bytes | None:
        row = self.db.execute("SELECT state FROM groups WHERE no=?", (no,)).fetchone()
        return row[0] if row else None

    def set_group_states(self, rows: Iterable[tuple[bytes | None, int]]) -> None:
        self.db.executemany("UPDATE groups SET state=? WHERE no=?", rows)

    def delete_groups(self, nos: Iterable[int]) -> None:
        self.db.executemany("DELETE FROM groups WHERE no=?", ((n,) for n in nos))

    def delete_empty_groups(self, nos: Iterable[int]) -> list[int]:
        """Delete those of the groups `nos` that hold no message rows and no endpoint; returns
        which."""
        held = (
            "SELECT EXISTS (SELECT 1 FROM segments WHERE group_no=?1) "
            "OR EXISTS (SELECT 1 FROM endpoints WHERE group_no=?1)"
        )
        empty = [n for n in nos if not self.db.execute(held, (n,)).fetchone()[0]]
        self.delete_groups(empty)
        return empty

    # --- endpoints -------------------------------------------------------------------------------

    # An endpoint's sequence numbers change with every message it sends or receives; the rest of
    # its row rarely does. They live in a narrow table of their own (`endpoint_seqs`, whose values
    # win over the endpoints table's columns of the same names, which keep those of BEGIN): a
    # group commit rewrites a dozen bytes per endpoint there rather than its whole wide row
    # (measured: about a microsecond a row against three and a half). Changes after BEGIN are
    # appended to a journal and folded into that table in sorted sweeps (`SeqJournal`): written
    # in place, each busy endpoint of a table of millions costs a page of its own per commit.

    def _seqs_of_older_stores(self) -> None:
        """Endpoints without a row in `endpoint_seqs` (a store written before it existed, or
        rows an earlier raybroker wrote since) get theirs from the endpoints table when the
        store opens; those that have one keep it. An endpoints table written before `user_sent`
        existed gets the column (empty: such endpoints' users sent all their messages); one
        written before dialog security gets `encryption` (off: such dialogs go in the clear);
        one written before relayed dialogs gets `onward` (empty: nothing relays)."""
        columns = {row[1] for row in self.db.execute("PRAGMA table_info(endpoints)")}
        if "user_sent" not in columns:
            self.db.execute("ALTER TABLE endpoints ADD COLUMN user_sent INTEGER")
        if "encryption" not in columns:
            self.db.execute(
                "ALTER TABLE endpoints ADD COLUMN encryption INTEGER NOT NULL DEFAULT 0"
            )
        if "onward" not in columns:
            self.db.execute("ALTER TABLE endpoints ADD COLUMN onward INTEGER")
        # endpoints are numbered upwards, so rows written without theirs include the highest:
        # two lookups by key, not a pass over millions of endpoints, on every open
        behind = self.db.execute(
            "SELECT (SELECT MAX(no) FROM endpoints) IS NOT (SELECT MAX(no) FROM endpoint_seqs)"
        ).fetchone()[0]
        if behind:
            self.db.execute(
                "INSERT OR IGNORE INTO endpoint_seqs SELECT no, send_seq, recv_seq FROM endpoints"
            )

    def _upgrade_older_stores(self) -> None:
        """A store written before segments (schema 1) keeps its messages a row each in a
        `messages` table: they move into segments, and the table goes; one written before the
        transmission queue was kept in runs (schema 2) moves its rows likewise. In one
        transaction: an open that fails leaves the store as it was."""
        with self.tx():
            old = "SELECT 1 FROM sqlite_master WHERE type='table' AND name='messages'"
            if self.db.execute(old).fetchone() is not None:
                rows = self.db.execute("SELECT * FROM messages ORDER BY id")
                while batch := rows.fetchmany(10_000):
                    runs = [segments.run_of(row) for row in batch]
                    self.db.executemany(INSERT_SEGMENTS, segments.segments(runs))
                self.db.execute("DROP TABLE messages")
            self._transmission_of_older_stores()
            if int(self.get_meta("schema") or 0) < int(SCHEMA_VERSION):
                self.set_meta("schema", SCHEMA_VERSION)

    def upsert_endpoints(self, rows: Iterable[Sequence[Any]]) -> None:
        rows = list(rows)
        self.db.executemany(
            f"INSERT OR REPLACE INTO endpoints ({ENDPOINT_COLUMNS}) "
            f"VALUES ({', '.join('?' * ENDPOINT_COLUMNS.count(','))}, ?)",
            rows,
        )
        self.db.executemany(
            "INSERT OR REPLACE INTO endpoint_seqs (no, send_seq, recv_seq) VALUES (?, ?, ?)",
            ((r[0], r[9], r[10]) for r in rows),
        )

    def update_endpoints(self, rows: Iterable[Sequence[Any]]) -> None:
        """Stored endpoints' columns that change after BEGIN DIALOG (no index), but their
        sequence numbers: (group_no, state, expires_at, timer_at, far_broker, closed_at,
        user_sent, onward, no)."""
        self.db.executemany(
            "UPDATE endpoints SET group_no=?, state=?, expires_at=?, timer_at=?, far_broker=?, "
            "closed_at=?, user_sent=?, onward=? WHERE no=?",
            rows,
        )

    def update_endpoint_seqs(self, rows: Iterable[tuple[int, int, int]]) -> None:
        """Stored endpoints' sequence numbers: (send_seq, recv_seq, no), appended to the journal
        (`actors.store.seq_journal`)."""
        self.seq_journal.write(rows, self._in_tx)

    def delete_endpoints(self, nos: Iterable[int]) -> None:
        keys = [(n,) for n in nos]
        self.db.executemany("DELETE FROM endpoints WHERE no=?", keys)
        self.db.executemany("DELETE FROM endpoint_seqs WHERE no=?", keys)
        self.db.executemany("DELETE FROM dialog_keys WHERE endpoint_no=?", keys)
        self.seq_journal.forget((n for (n,) in keys), self._in_tx)

    def put_dialog_keys(self, rows: Iterable[tuple[int, bytes]]) -> None:
        """Secured dialogs' session keys, sealed under the master key: (endpoint no, sealed)."""
        self.db.executemany("INSERT OR REPLACE INTO dialog_keys VALUES (?, ?)", rows)

    def max_keys(self) -> tuple[int, int, int]:
        """The highest endpoint, group and message numbers in use (0 when none). An endpoint
        number the transmission queue still names counts as used: a new endpoint must not
        inherit rows its owner left (the sender drops them once it sees no endpoint), nor the
        numbers the sequence journal holds for an ended one."""
        ep, group, message = self.db.execute(
            "SELECT MAX((SELECT COALESCE(MAX(no), 0) FROM endpoints), (SELECT "
            "COALESCE(MAX(endpoint_no), 0) FROM transmission_runs)), (SELECT COALESCE(MAX(no), 0) "
            "FROM groups), (SELECT COALESCE(MAX(last_id), 0) FROM segments WHERE first_id=(SELECT "
            "MAX(first_id) FROM segments))"
        ).fetchone()
        return max(ep, self.seq_journal.top_no), group, message

    # --- routes ----------------------------------------------------------------------------------

    def load_routes(self) -> list[tuple[str, dict[str, Any]]]:
        rows = self.db.execute("SELECT tbl, body FROM routes ORDER BY rowid").fetchall()
        return [(tbl, json.loads(body)) for tbl, body in rows]

    def put_route(self, table: str, name: str, record: dict[str, Any]) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO routes (tbl, name, body) VALUES (?, ?, ?)",
            (table, name, json.dumps(record)),
        )

    def delete_route(self, table: str, name: str) -> None:
        self.db.execute("DELETE FROM routes WHERE tbl=? AND name=?", (table, name))

    # --- events, audit, request ids --------------------------------------------------------------

    def insert_events(self, rows: Iterable[tuple[float, str, str, str]]) -> None:
        self.db.executemany("INSERT INTO events (at, kind, subject, detail) VALUES (?,?,?,?)", rows)

    def events(self, after_id: int, limit: int, newest: bool = False) -> list[tuple[Any, ...]]:
        """Events after `after_id`, oldest first: the first `limit` of them, or the last."""
        rows = "SELECT id, at, kind, subject, detail FROM events WHERE id>?1"
        if newest:
            rows = f"SELECT * FROM ({rows} ORDER BY id DESC LIMIT ?2)"
        return self.db.execute(f"{rows} ORDER BY id LIMIT ?2", (after_id, limit)).fetchall()

    def insert_audit(self, at: float, payload: bytes) -> None:
        self.db.execute("INSERT INTO audit (at, payload) VALUES (?, ?)", (at, payload))

    def audit_rows(self, after_id: int, limit: int) -> Iterator[tuple[int, float, bytes]]:
        """The audit's rows after `after_id`, at most `limit`, read as they are wanted (a reader
        that has enough stops early)."""
        cur = self.db.execute(
            "SELECT id, at, payload FROM audit WHERE id>? ORDER BY id LIMIT ?", (after_id, limit)
        )
        try:
            while rows := cur.fetchmany(16):
                yield from rows
        finally:
            cur.close()

    def audit_first_id(self) -> int | None:
        """The oldest audit row still kept (None: none kept)."""
        return self.db.execute("SELECT MIN(id) FROM audit").fetchone()[0]

    def prune(self, table: str, keep: int) -> None:
        """Keep only the newest `keep` rows of a bounded table (events, audit)."""
        assert table in ("events", "audit")
        self.db.execute(f"DELETE FROM {table} WHERE id <= (SELECT MAX(id) FROM {table})-?", (keep,))

    def request_results(self, ids: Sequence[RequestId]) -> dict[RequestId, bytes]:
        """Those of `ids` already applied: their recorded results. An id is the caller's string
        (a row of its own) or a call's place in its client's order (client, number, index): the
        calls of one numbered client call share a row (see `put_requests`)."""
        out: dict[RequestId, bytes] = {}
        named = [i for i in ids if type(i) is str]
        for part in parts(named):
            q = f"SELECT request_id, result FROM requests WHERE request_id IN ({marks(part)})"
            out.update(self.db.execute(q, part).fetchall())
        placed = {i for i in ids if isinstance(i, tuple)}
        for part in parts(list({f"{c}:{n}" for c, n, _ in placed})):
            q = f"SELECT call, results FROM call_requests WHERE call IN ({marks(part)})"
            for call, blob in self.db.execute(q, part).fetchall():
                client, number = call.rsplit(":", 1)
                for index, result in msgpack.unpackb(blob, strict_map_key=False).items():
                    key = (client, int(number), index)
                    if key in placed:
                        out[key] = result
        return out

    def put_requests(self, rows: Iterable[tuple[RequestId, float, bytes]]) -> None:
        """Record applied calls' results. Those named by their place in a client call go one row
        per client call, however many calls it carried (a coalesced batch: a hundred)."""
        named: list[tuple[RequestId, float, bytes]] = []
        calls: dict[tuple[str, int], tuple[float, dict[int, bytes]]] = {}
        for row in rows:
            rid = row[0]
            if type(rid) is str:
                named.append(row)
                continue
            entry = calls.get(rid[:2])
            if entry is None:
                entry = calls[rid[:2]] = (row[1], {})
            entry[1][rid[2]] = row[2]
        if named:
            q = "INSERT INTO requests (request_id, at, result) VALUES (?, ?, ?)"
            self.db.executemany(q, named)
        if calls:
            self.db.executemany(
                "INSERT INTO call_requests (call, at, results) VALUES (?, ?, ?)",
                [(f"{c}:{n}", at, packb(results)) for (c, n), (at, results) in calls.items()],
            )

    def prune_requests(self, before: float) -> None:
        self._prune_before(("requests", "call_requests"), before)
