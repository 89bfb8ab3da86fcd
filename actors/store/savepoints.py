"""A group commit's units (actors.service.group_commit): a savepoint each, opened only when needed,
and the writes the store holds back until the next statement.

A busy broker's group commit holds a hundred or more callers, each on a savepoint of its own so
that one that fails is undone alone. Most of them write only rows of two kinds, a send's
message inserts and a commit's removal of the messages it received, and never read the store:
SQLite would see two savepoint statements and a one-row statement per caller. So a unit's writes
of those kinds are held (`HeldWrites.hold`) instead of run, and its savepoint is opened only if
it runs a statement of its own. A unit that fails before that has nothing in SQLite to undo:
its held writes are dropped. One that succeeds hands them to the group, which runs all it holds
as one statement per kind, before the next statement of any kind (a later unit's read sees
them) and before the commit. Held writes commute with each other, so their order may change:
inserts add messages with new ids, and removals name ranges of messages that were received,
so existed before this transaction began.

If running the held writes fails, the group's transaction is no longer what its units wrote:
`broken` is set and the group fails as a whole, as if SQLite had dropped it.
"""

from __future__ import annotations

import contextlib
from typing import Any

from actors.errors import StoreError
from actors.store.file import Connection, execute_bare


class HeldWrites:
    """The writes held back on one connection during a transaction, and the open unit."""

    def __init__(self, db: Connection) -> None:
        self.db = db
        self.held: dict[str, list[Any]] = {}  # sql -> rows, of units that succeeded
        self.unit: Savepoint | None = None  # the unit running now
        self.broken = False  # running held writes failed: the transaction must not commit

    def hold(self, sql: str, rows: list[Any]) -> bool:
        """Hold `rows` of `sql` for the open unit, if one is open and has run no statement
        yet (True); otherwise the caller runs them now (False)."""
        unit = self.unit
        if unit is None or unit.opened:
            return False
        unit.held.append((sql, rows))
        return True

    def savepoint(self) -> Savepoint:
        return Savepoint(self)

    def reset(self) -> None:
        """The transaction ended (committed or rolled back): nothing is held."""
        self.held, self.unit, self.broken = {}, None, False
        self.db.before_statement = None

    def arm(self) -> None:
        """Run `_before_statement` before the next statement if anything waits for one."""
        pending = self.held or (self.unit is not None and not self.unit.opened)
        self.db.before_statement = self._before_statement if pending else None

    def _before_statement(self) -> None:
        """A statement is about to run: first what earlier units hold, then the open unit's
        savepoint and its own held writes, so the statement sees everything before it."""
        self.db.before_statement = None
        held, self.held = self.held, {}
        try:
            self._run(held.items())
        except BaseException:
            self.broken = True
            raise
        unit = self.unit
        if unit is not None and not unit.opened:
            unit.open()
            own, unit.held = unit.held, []
            self._run(own)

    def _run(self, writes: Any) -> None:
        for sql, rows in writes:
            self.db.executemany(sql, rows)


class Savepoint:
    """One caller's unit inside a group commit's transaction: if the block raises, only its
    writes are undone. SQLite sees the savepoint only if the unit runs a statement."""

    __slots__ = ("writes", "opened", "held", "outer")

    def __init__(self, writes: HeldWrites) -> None:
        self.writes = writes
        self.opened = False
        self.held: list[tuple[str, list[Any]]] = []
        self.outer: Savepoint | None = None  # the unit this one runs inside, if any

    def __enter__(self) -> None:
        w = self.writes
        self.outer = w.unit
        if self.outer is not None and w.db.before_statement is not None:
            w.db.before_statement()  # a unit inside a unit: the outer one opens first
        w.unit = self
        if self.outer is not None:
            self.open()  # and this one at once, so its rollback cuts just its own writes
        else:
            w.arm()

    def open(self) -> None:
        execute_bare(self.writes.db, "SAVEPOINT unit")
        self.opened = True

    def __exit__(self, kind: type[BaseException] | None, *_: Any) -> bool:
        w = self.writes
        w.unit = self.outer
        if self.opened:
            if kind is None:
                execute_bare(w.db, "RELEASE unit")
            elif w.db.in_transaction:
                with contextlib.suppress(StoreError):  # the block's error is the one to raise
                    execute_bare(w.db, "ROLLBACK TO unit")
                    execute_bare(w.db, "RELEASE unit")
        elif kind is None:
            for sql, rows in self.held:  # the group's now
                w.held.setdefault(sql, []).extend(rows)
        w.arm()
        return False  # an error in the block goes on to the caller
