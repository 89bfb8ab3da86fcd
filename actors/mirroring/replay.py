"""The mirror's side of the log: apply shipped transactions in order, and rebuild from a snapshot.

`apply` runs a batch of entries in one SQLite transaction (one commit, one fsync, for a whole
ship) and moves `mirror_seq` with them, so the store says what it holds. An entry that does not
follow the store's number is a gap (the mirror missed something, or started empty): refused with
`MirrorBehind`, and the principal answers with a rebuild. A rebuild replaces the whole file with
the principal's (`snapshot` there, `install` here), never with anything of the mirror's own: an
old principal may hold a tail of transactions nobody else has, and those must go.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Sequence
from typing import Any

from actors.errors import MirrorBehind
from actors.mirroring.capture import SET_SEQ, Entry, stored_seq
from actors.store.file import sync_directory, write_new

CHUNK_BYTES = 8 << 20  # a snapshot travels in pieces of this size


def apply(db: Any, held: int, entries: Sequence[Entry]) -> int:
    """Apply `entries` after `held` (the store's number) in one transaction; the new number.
    Entries the store already holds are skipped (a ship retried after a lost answer)."""
    todo = [e for e in entries if e.seq > held]
    if not todo:
        return held
    if todo[0].seq != held + 1:
        raise MirrorBehind(held, todo[0].seq)
    for a, b in zip(todo, todo[1:], strict=False):
        if b.seq != a.seq + 1:
            raise MirrorBehind(a.seq, b.seq)
    db.execute("BEGIN IMMEDIATE")
    try:
        for entry in todo:
            for many, sql, params in entry.statements:
                if many:
                    db.executemany(sql, params)
                else:
                    db.execute(sql, params)
        db.execute(SET_SEQ, (str(todo[-1].seq),))
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return todo[-1].seq


def snapshot(db: sqlite3.Connection) -> bytes:
    """The whole store as one SQLite file's bytes, read between transactions (so consistent)."""
    return db.serialize()


def chunks(data: bytes, size: int = CHUNK_BYTES) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)] or [b""]


def install(path: str, data: bytes) -> None:
    """Replace the (closed) store file at `path` with `data`. The old -wal and -shm go first: a
    stale WAL left beside the new file would be replayed onto it. The directory is synced once
    the new file is in place, so the rename survives a power cut (the mirror answers the rebuild
    as done after this)."""
    tmp = f"{path}.rebuild"
    write_new(tmp, data)
    for stale in (f"{path}-wal", f"{path}-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(stale)
    os.replace(tmp, path)
    sync_directory(os.path.dirname(os.path.abspath(path)))


def held_seq(store: Any) -> int:
    """The ship sequence number of a `Store`."""
    return stored_seq(store.get_meta)


def is_blank(store: Any) -> bool:
    """A store nothing was ever defined or written in (it may be made anyone's mirror)."""
    db = store.db
    return all(
        db.execute(f"SELECT 1 FROM {t} LIMIT 1").fetchone() is None
        for t in ("catalog", "endpoints", "routes")
    ) and not held_seq(store)
