"""Reads of one endpoint or one conversation group by key, and the indexes the broker pages its
working set from: the store is the truth for endpoints and groups, and the broker keeps only
those in use in memory (`actors.core.working_set`). A part of `actors.store.database.Store`;
its tables and indexes are in its SCHEMA (`KEYED_INDEXES`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from actors.store.file import Connection
from actors.store.seq_journal import SeqJournal

ENDPOINT_COLUMNS = (
    "no, handle, conversation_id, is_initiator, service, far_service, contract, group_no, state, "
    "send_seq, recv_seq, expires_at, timer_at, far_broker, closed_at, user_sent, encryption, "
    "onward"
)
# each endpoint's live sequence numbers are in `endpoint_seqs` (see `Store`'s endpoints section),
# or newer ones in the journal (`_live`)
_LIVE = ", ".join(
    f"s.{c}" if c in ("send_seq", "recv_seq") else f"e.{c}" for c in ENDPOINT_COLUMNS.split(", ")
)
# an endpoint as the broker loads it: its columns, its sealed session key (or NULL) and whether
# it is a live dialog begun `if_absent`
_ENDPOINT = (
    f"SELECT {_LIVE}, k.sealed, r.handle IS NOT NULL FROM endpoints e "
    "JOIN endpoint_seqs s ON s.no = e.no LEFT JOIN dialog_keys k ON k.endpoint_no = e.no "
    "LEFT JOIN rerunnable r ON r.handle = e.handle AND r.ended_at IS NULL"
)
_GROUP_COLUMNS = (
    "no, group_id, queue, state IS NOT NULL, "
    "(SELECT COUNT(*) FROM endpoints e WHERE e.group_no = g.no)"
)
_GROUP = f"SELECT {_GROUP_COLUMNS} FROM groups g"
# what falls due for an endpoint is found from these, not from a schedule of every dialog
KEYED_INDEXES = """
CREATE INDEX IF NOT EXISTS endpoints_group ON endpoints (group_no);
CREATE INDEX IF NOT EXISTS endpoints_timer ON endpoints (timer_at) WHERE timer_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS endpoints_expiry ON endpoints (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS endpoints_closed ON endpoints (closed_at) WHERE closed_at IS NOT NULL;
"""
EndpointRow = tuple[Any, ...]  # ENDPOINT_COLUMNS, then sealed key, then rerunnable
GroupRow = tuple[int, str, str, int, int]  # no, group id, queue, stateful, members


class KeyedReads:
    """The keyed reads' statements (`Store` is one; `db` is its connection)."""

    db: Connection
    seq_journal: SeqJournal

    def _live(self, row: EndpointRow | None) -> EndpointRow | None:
        """`row` with the newest sequence numbers, the journal's if it holds any."""
        seqs = None if row is None else self.seq_journal.seqs(row[0])
        return row if seqs is None else (*row[:9], seqs[0], seqs[1], *row[11:])

    def endpoint_by_no(self, no: int) -> EndpointRow | None:
        return self._live(self.db.execute(f"{_ENDPOINT} WHERE e.no=?", (no,)).fetchone())

    def endpoint_by_handle(self, handle: str) -> EndpointRow | None:
        return self._live(self.db.execute(f"{_ENDPOINT} WHERE e.handle=?", (handle,)).fetchone())

    def endpoint_by_conversation(
        self, conversation_id: str, is_initiator: bool
    ) -> EndpointRow | None:
        row = self.db.execute(
            f"{_ENDPOINT} WHERE e.conversation_id=? AND e.is_initiator=?",
            (conversation_id, int(is_initiator)),
        ).fetchone()
        return self._live(row)

    def fits(self, n: int) -> bool:
        """Whether the store holds at most `n` endpoints and at most `n` groups (counting no
        further than that: a store of millions answers at once)."""
        return (
            self.db.execute(
                "SELECT (SELECT COUNT(*) FROM (SELECT 1 FROM endpoints LIMIT ?1)) <= ?2 "
                "AND (SELECT COUNT(*) FROM (SELECT 1 FROM groups LIMIT ?1)) <= ?2",
                (n + 1, n),
            ).fetchone()[0]
            == 1
        )

    def all_endpoints(self) -> Iterator[EndpointRow]:
        """Every endpoint, in number order (for views and checks that look at all of them)."""
        rows = self.db.execute(f"{_ENDPOINT} ORDER BY e.no")
        return rows if not self.seq_journal.latest else map(self._live, rows)

    def endpoints_after(self, handle: str | None, limit: int) -> Iterator[EndpointRow]:
        """The first `limit` endpoints whose handle sorts after `handle` (all: None), in handle
        order: a view's page."""
        rows = self.db.execute(
            f"{_ENDPOINT} WHERE e.handle > ? ORDER BY e.handle LIMIT ?", (handle or "", limit)
        )
        return rows if not self.seq_journal.latest else map(self._live, rows)

    def dialog_counts(self) -> tuple[dict[str, int], int]:
        """How many endpoints are in each state; how many have a session key (secured)."""
        by_state = dict(self.db.execute("SELECT state, COUNT(*) FROM endpoints GROUP BY state"))
        return by_state, self.db.execute("SELECT COUNT(*) FROM dialog_keys").fetchone()[0]

    def group_by_no(self, no: int) -> GroupRow | None:
        return self.db.execute(f"{_GROUP} WHERE g.no=?", (no,)).fetchone()

    def group_no_of(self, group_id: str) -> int | None:
        row = self.db.execute("SELECT no FROM groups WHERE group_id=?", (group_id,)).fetchone()
        return row[0] if row else None

    def group_nos_of_queue(self, queue: str) -> list[int]:
        return [n for (n,) in self.db.execute("SELECT no FROM groups WHERE queue=?", (queue,))]

    def all_groups(self) -> list[GroupRow]:
        return self.db.execute(f"{_GROUP} ORDER BY g.no").fetchall()

    def groups_after(self, queue: str | None, group_id: str | None, limit: int) -> list[Any]:
        """A view's page: the first `limit` groups (of `queue`) whose id sorts after
        `group_id` (all: None), in id order, each row ending with the group's state (read in
        the same statement, not one each)."""
        where = "g.group_id > ?" + ("" if queue is None else " AND g.queue = ?")
        args = (group_id or "", *(() if queue is None else (queue,)), limit)
        return self.db.execute(
            f"SELECT {_GROUP_COLUMNS}, g.state FROM groups g WHERE {where} "
            "ORDER BY g.group_id LIMIT ?",
            args,
        ).fetchall()

    def router_mappings(self, queue: str, limit: int) -> tuple[int, list[str]]:
        """A router replica's live mappings on `queue`, which `actors.ddr.router` keeps as its
        groups' states ({inbound handle: pair} in JSON): how many there are, and the first
        `limit` pairs as JSON text, in group order. Read with SQLite's JSON functions, so a
        replica holding a million dialogs builds no object for each to answer."""
        live = (
            "FROM groups g, json_each(CAST(g.state AS TEXT)) j WHERE g.queue=? "
            "AND g.state IS NOT NULL AND json_extract(j.value, '$.out') IS NOT NULL "
            "AND json_extract(j.value, '$.out_ended') = 0"
        )
        (total,) = self.db.execute(f"SELECT COUNT(*) {live}", (queue,)).fetchone()
        pairs = self.db.execute(f"SELECT j.value {live} ORDER BY g.no LIMIT ?", (queue, limit))
        return total, [pair for (pair,) in pairs]

    def due_between(
        self, after: float | None, until: float, closed_retention_s: float
    ) -> list[tuple[int, float | None, float | None, float | None]]:
        """(no, timer_at, expires_at, closed_at) of the endpoints with a timer, a lifetime or a
        purge (`closed_retention_s` after their close) in (`after`, `until`] (`after` None: at
        or before `until`)."""
        low = float("-inf") if after is None else after
        return self.db.execute(
            "SELECT no, timer_at, expires_at, closed_at FROM endpoints WHERE no IN ("
            "SELECT no FROM endpoints WHERE timer_at > ?1 AND timer_at <= ?2 UNION "
            "SELECT no FROM endpoints WHERE expires_at > ?1 AND expires_at <= ?2 UNION "
            "SELECT no FROM endpoints WHERE closed_at > ?3 AND closed_at <= ?4)",
            (low, until, low - closed_retention_s, until - closed_retention_s),
        ).fetchall()
