"""Checkpoints off the broker's event loop.

SQLite in WAL mode appends each commit to the -wal file; a checkpoint copies those pages back
into the database file and syncs it. Left to SQLite, the commit that crosses 1,000 pages runs
the checkpoint itself, fsync included, on the broker's event loop: every caller in that group
commit waits for it. Here a thread with its own connection checkpoints instead (PASSIVE: it never
blocks the writer, and SQLite releases the GIL while it works), so the loop only appends. The
writer keeps SQLite's own checkpoint as a backstop at a much larger size, should this thread fall
behind. Durability is unchanged: a commit is durable once it is in the WAL.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading

log = logging.getLogger("raybroker")

EVERY_S = 0.2  # how often the thread looks at the WAL's size
WAL_BYTES = 4 << 20  # checkpoint once the WAL holds this much
BACKSTOP_PAGES = 16_384  # the writer checkpoints itself past this (64 MiB of 4 KiB pages)
JOURNAL_LIMIT_BYTES = 64 << 20  # a WAL grown past this is truncated when it is reset
# the writer's settings: SQLite's own checkpoint only as the backstop
CHECKPOINT_PRAGMAS = (
    f"wal_autocheckpoint={BACKSTOP_PAGES}",
    f"journal_size_limit={JOURNAL_LIMIT_BYTES}",
)


class Checkpointer:
    """Checkpoints the store at `path` from a daemon thread until `stop`."""

    def __init__(self, path: str, durability: str) -> None:
        self.path, self.wal = path, f"{path}-wal"
        self._stop = threading.Event()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute(f"PRAGMA synchronous={durability.upper()}")
        self._thread = threading.Thread(target=self._run, name="raybroker-checkpoint", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(EVERY_S):
            try:
                if os.path.getsize(self.wal) >= WAL_BYTES:
                    self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            except (OSError, sqlite3.Error) as exc:  # a store fault: tried again next time
                log.debug("checkpoint of %s failed: %s", self.path, exc)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        with contextlib.suppress(sqlite3.Error):
            self._db.close()
