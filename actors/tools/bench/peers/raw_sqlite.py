"""Raw SQLite as the floor: what one store file does for the same workload with no broker logic.
WAL, one messages table indexed by conversation; the producer process inserts each call in one
transaction, and one consumer process takes the waiting messages of up to GROUPS_PER_CALL
conversations (or one message, for many-clients) and deletes them in one transaction, polling
the file when nothing waits. Default durability `synchronous=NORMAL` (raybroker's default),
power-safe `synchronous=FULL` (an fsync per commit)."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import Sequence
from typing import Any

from actors.tools.bench.peers.driver import Received, Recorder
from actors.tools.bench.peers.workloads import GROUPS_PER_CALL, INFLIGHT, Workload, decode

POLL_S = 0.002  # how often the consumer looks again when nothing waits
BUSY_MS = 10_000
SYNCHRONOUS = {"default": "NORMAL", "power-safe": "FULL"}
SCHEMA = """
CREATE TABLE messages (id INTEGER PRIMARY KEY, conv INTEGER NOT NULL, body BLOB NOT NULL);
CREATE INDEX messages_by_conv ON messages (conv, id);
"""


def connect(path: str, synchronous: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute(f"PRAGMA busy_timeout={BUSY_MS}")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={synchronous}")
    db.execute("PRAGMA secure_delete=FAST")  # as the broker's store (Debian's default is ON)
    return db


class RawSqlite:
    name = "raw-sqlite"
    detail = ""
    client = "actors.tools.bench.peers.raw_sqlite:RawSqliteClient"

    def __init__(self, workdir: str, durability: str = "default") -> None:
        self.workdir, self.durability = workdir, durability
        self.path = ""
        self.runs = 0

    def consumers(self, w: Workload) -> int:
        return 1  # one writer at a time: more consumers would only wait on the file's lock

    def pids(self) -> Sequence[int]:
        return []

    def settings(self) -> dict[str, Any]:
        db = connect(os.path.join(self.workdir, "probe.sqlite"), SYNCHRONOUS[self.durability])
        try:
            level = db.execute("PRAGMA synchronous").fetchone()[0]  # 1 NORMAL, 2 FULL
            mode = db.execute("PRAGMA journal_mode").fetchone()[0]
            erase = db.execute("PRAGMA secure_delete").fetchone()[0]  # 2: FAST
        finally:
            db.close()
        return {
            "synchronous": level,
            "journal_mode": mode,
            "secure_delete": erase,
            "sqlite": sqlite3.sqlite_version,
        }

    def open(self, w: Workload) -> dict[str, Any]:
        self.runs += 1  # a file of its own: the last run's processes may still be closing theirs
        self.path = os.path.join(self.workdir, f"raw-{w.variant}-{self.runs}.sqlite")
        db = connect(self.path, SYNCHRONOUS[self.durability])
        db.executescript(SCHEMA)
        db.close()
        return {"path": self.path, "synchronous": SYNCHRONOUS[self.durability],
                "per_call": w.per_call}  # fmt: skip

    def close(self, w: Workload) -> None:
        pass

    def stop(self) -> None:
        pass


class RawSqliteClient:
    ordered = True  # one connection: its transactions run one at a time, in order
    inflight = INFLIGHT

    def __init__(self, params: dict[str, Any]) -> None:
        self.p = params
        self.db: sqlite3.Connection | None = None

    async def start(self) -> None:
        self.db = connect(self.p["path"], self.p["synchronous"])

    async def send(self, bodies: list[tuple[int, bytes]]) -> None:
        assert self.db is not None
        self.db.execute("BEGIN IMMEDIATE")
        self.db.executemany("INSERT INTO messages (conv, body) VALUES (?, ?)", bodies)
        self.db.execute("COMMIT")

    async def consume(self, index: int, rec: Recorder) -> None:
        while not rec.stopping:
            issued = time.perf_counter()
            got = self.take(one=self.p["per_call"] == 1)
            if got:
                rec.confirmed(got, issued)
            else:
                await asyncio.sleep(POLL_S)

    def take(self, one: bool) -> list[Received]:
        """One transaction: the oldest message (`one`), or every waiting message of up to
        GROUPS_PER_CALL conversations; selected, then deleted."""
        assert self.db is not None
        db, out = self.db, []
        db.execute("BEGIN IMMEDIATE")
        if one:
            rows = db.execute("SELECT id, conv, body FROM messages ORDER BY id LIMIT 1").fetchall()
            db.executemany("DELETE FROM messages WHERE id=?", [(r[0],) for r in rows])
            out = [decode(r[2]) for r in rows]
        else:
            convs = db.execute(
                "SELECT DISTINCT conv FROM messages LIMIT ?", (GROUPS_PER_CALL,)
            ).fetchall()
            for (conv,) in convs:
                rows = db.execute(
                    "SELECT id, body FROM messages WHERE conv=? ORDER BY id", (conv,)
                ).fetchall()
                db.execute("DELETE FROM messages WHERE conv=? AND id<=?", (conv, rows[-1][0]))
                out += [decode(body) for _, body in rows]
        db.execute("COMMIT")
        return out

    async def stop(self) -> None:
        if self.db is not None:
            self.db.close()
