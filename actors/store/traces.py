"""What the store remembers of dialogs after their endpoints go, and the pruning of rows kept for
a time: target endpoints of dialogs from other brokers (`ended`: a late resend of what they took
is acknowledged, not delivered again) and initiator dialogs begun `if_absent` (`rerunnable`: a
re-run finds them ended). A part of `actors.store.database.Store`; its tables are in its SCHEMA."""

from __future__ import annotations

from collections.abc import Iterable

from actors.store.file import Connection, marks, parts


class EndedTraces:
    """The traces' statements (`Store` is one; `db` is its connection)."""

    db: Connection

    def insert_ended(self, rows: Iterable[tuple[str, int, float]]) -> None:
        """rows: (conversation_id, recv_seq, at): target endpoints removed, and how many of the
        initiator's messages each had taken."""
        self.db.executemany(
            "INSERT INTO ended (conversation_id, recv_seq, at) VALUES (?,?,?)", rows
        )

    def ended_recv_seqs(self, conversation_ids: Iterable[str]) -> dict[str, int]:
        """How many messages the removed target endpoint of each of `conversation_ids` took,
        for those this broker remembers (one statement per few hundred: an arrival asks for
        every new dialog of its bundles at once)."""
        out: dict[str, int] = {}
        for part in parts(list(conversation_ids)):
            out.update(
                self.db.execute(
                    "SELECT conversation_id, MAX(recv_seq) FROM ended "
                    f"WHERE conversation_id IN ({marks(part)}) GROUP BY conversation_id",
                    part,
                ).fetchall()
            )
        return out

    def prune_ended(self, before: float) -> None:
        self._prune_before(("ended",), before)
        self.db.execute("DELETE FROM rerunnable WHERE ended_at < ?", (before,))

    # --- initiator dialogs begun `if_absent` (a re-run of the same Begin finds them) -------------

    def trace_reruns(self, handles: Iterable[str]) -> None:
        """Dialogs just begun with `if_absent`: their handles, while they live."""
        self.db.executemany(
            "INSERT OR REPLACE INTO rerunnable (handle) VALUES (?)", ((h,) for h in handles)
        )

    def has_reruns(self) -> bool:
        """Whether any dialog begun with `if_absent` is remembered, live or ended."""
        return self.db.execute("SELECT 1 FROM rerunnable LIMIT 1").fetchone() is not None

    def end_reruns(self, rows: Iterable[tuple[str, str, str, str, str, int, float]]) -> None:
        """rows: (handle, conversation_id, service, far_service, contract, send_seq, ended_at)
        of dialogs begun with `if_absent` whose initiator endpoint just went."""
        self.db.executemany(
            "INSERT OR REPLACE INTO rerunnable (handle, conversation_id, service, far_service, "
            "contract, send_seq, ended_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            rows,
        )

    def reruns_after(self, handle: str | None, limit: int) -> list[tuple[str, float | None]]:
        """(handle, ended at or None while it lives) of the first `limit` dialogs begun with
        `if_absent` whose handle sorts after `handle`, in handle order: a view's page."""
        return self.db.execute(
            "SELECT handle, ended_at FROM rerunnable WHERE handle > ? ORDER BY handle LIMIT ?",
            (handle or "", limit),
        ).fetchall()

    def forget_reruns(self, handles: Iterable[str]) -> None:
        self.db.executemany("DELETE FROM rerunnable WHERE handle=?", ((h,) for h in handles))

    def ended_reruns(self, handles: list[str]) -> dict[str, tuple[str, str, str, str, int]]:
        """Of `handles`, those of ended dialogs begun with `if_absent`: handle -> (conversation_id,
        service, far_service, contract, send_seq)."""
        found = {}
        for part in parts(handles):
            q = (
                "SELECT handle, conversation_id, service, far_service, contract, send_seq FROM "
                f"rerunnable WHERE handle IN ({marks(part)}) AND ended_at IS NOT NULL"
            )
            found.update((row[0], row[1:]) for row in self.db.execute(q, part))
        return found

    def _prune_before(self, tables: Iterable[str], before: float) -> None:
        # rows come in time order: delete those before the first one young enough to keep
        for table in tables:
            q = f"SELECT rowid FROM {table} WHERE at >= ? ORDER BY rowid LIMIT 1"
            self.db.execute(
                f"DELETE FROM {table} WHERE rowid < COALESCE(({q}), 1 << 62)", (before,)
            )
