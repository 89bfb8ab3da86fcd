"""Raw SQLite as the floor: what one store file does for the same workload, in-process, with no
broker logic. WAL with synchronous=NORMAL (raybroker's default), one messages table indexed by
conversation, a producer call is one insert transaction; the single consumer takes the waiting
messages of up to GROUPS_PER_CALL conversations (or one message, for many-clients) and deletes them
in one transaction. One thread, no locking between readers: the cheapest a store can be."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Sequence

from actors.tools.bench.peers.driver import Received, Recorder
from actors.tools.bench.peers.workloads import GROUPS_PER_CALL, Workload, decode

WAIT_S = 0.2

SCHEMA = """
CREATE TABLE messages (id INTEGER PRIMARY KEY, conv INTEGER NOT NULL, body BLOB NOT NULL);
CREATE INDEX messages_by_conv ON messages (conv, id);
"""


class RawSqlite:
    name = "raw-sqlite"
    detail = ""  # nothing to add to its notes
    ordered = True  # calls run one at a time, in order

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir
        self.db: sqlite3.Connection | None = None
        self.w: Workload | None = None
        self.waiting = asyncio.Event()

    def consumers(self, w: Workload) -> int:
        return 1

    def pids(self) -> Sequence[int]:
        return []

    async def open(self, w: Workload) -> None:
        self.w = w
        path = os.path.join(self.workdir, f"raw-{w.variant}.sqlite")
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)

    async def send(self, bodies: list[tuple[int, bytes]]) -> None:
        assert self.db is not None
        self.db.execute("BEGIN IMMEDIATE")
        self.db.executemany("INSERT INTO messages (conv, body) VALUES (?, ?)", bodies)
        self.db.execute("COMMIT")
        self.waiting.set()

    async def consume(self, index: int, rec: Recorder) -> None:
        assert self.db is not None and self.w is not None
        while not rec.stopping:
            got = self.take(one=self.w.per_call == 1)
            if got:
                rec.confirmed(got)
                await asyncio.sleep(0)  # let the producer run between transactions
                continue
            self.waiting.clear()
            try:
                await asyncio.wait_for(self.waiting.wait(), WAIT_S)
            except TimeoutError:
                continue

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

    async def close(self) -> None:
        if self.db is not None:
            self.db.close()
        self.db = None
        self.w = None
