"""A group commit's units on the store (actors.store.savepoints): a savepoint only for a unit that
runs a statement, message inserts and received-range removals held until the next statement, and a
transaction that cannot commit once running held writes failed."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import pytest

from actors.runs import rows_of
from actors.store.database import Store
from tests.unit.conftest import stored_messages

WAITING = 0


@pytest.fixture(params=["memory", "file"])
def store(request, tmp_path) -> Iterator[Store]:
    s = Store(":memory:" if request.param == "memory" else str(tmp_path / "b.sqlite"))
    yield s
    s.close()


@pytest.fixture
def statements(store) -> list[str]:
    """Every statement SQLite runs on the store's connection from now on."""
    seen: list[str] = []
    store.db.set_trace_callback(seen.append)
    return seen


class Calls:
    """Sees each statement the store hands SQLite (as a mirror's capture does), and runs it."""

    def __init__(self) -> None:
        self.many: list[tuple[str, int]] = []  # (first word, rows) of each executemany

    def execute(self, cursor, sql, parameters):
        return cursor.execute(sql, parameters)

    def executemany(self, cursor, sql, rows):
        rows = list(rows)
        self.many.append((sql.split()[0], len(rows)))
        return cursor.executemany(sql, rows)


def _msg(id: int, group: int = 1) -> tuple:
    """The run of one message (actors.store.segments) the store takes."""
    return (id, group, 1, id, "M", [f"m{id}".encode()], WAITING, 1.0, 1.0)


def _ids(store: Store) -> list[int]:
    return [r[0] for r in stored_messages(store)]


def _savepoints(statements: list[str]) -> list[str]:
    return [s for s in statements if s.split()[0] in ("SAVEPOINT", "RELEASE", "ROLLBACK")]


def test_units_that_only_insert_and_remove_run_no_savepoint_and_commit_as_one_statement_each(
    store, statements
):
    with store.tx():
        store.insert_messages([_msg(1), _msg(2)])
    store.db.capture = calls = Calls()
    with store.tx():
        for i in range(3, 8):
            with store.savepoint():
                store.insert_messages([_msg(i)])
            if i < 5:  # commits of what was received before (never of rows sent meanwhile)
                with store.savepoint():
                    store.remove_received([(1, i - 2)], retain=False)
    assert _ids(store) == [3, 4, 5, 6, 7]
    assert _savepoints(statements) == []
    assert sorted(calls.many) == [("DELETE", 2), ("INSERT", 5), ("UPDATE", 2)]


def test_a_unit_that_fails_before_any_statement_leaves_nothing_behind(store, statements):
    with store.tx():
        with store.savepoint():
            store.insert_messages([_msg(1)])
        with pytest.raises(RuntimeError), store.savepoint():
            store.insert_messages([_msg(2)])
            store.remove_received([(1, 1)], retain=False)
            raise RuntimeError("this caller fails")
        with store.savepoint():
            store.insert_messages([_msg(3)])
    assert _ids(store) == [1, 3]
    assert _savepoints(statements) == []


def test_a_statement_sees_what_earlier_units_and_its_own_unit_hold(store):
    with store.tx():
        with store.savepoint():
            store.insert_messages([_msg(1)])
        with store.savepoint():
            store.insert_messages([_msg(2)])
            # a read in the same unit: the savepoint opens, and every held write runs first
            assert [r[0] for r in rows_of(store.fetch_group(1, None))] == [1, 2]
            store.insert_messages([_msg(3)])  # after its first statement: runs at once
            assert [r[0] for r in rows_of(store.fetch_group(1, None))] == [1, 2, 3]


def test_a_unit_that_ran_a_statement_is_rolled_back_alone_held_writes_included(store, statements):
    with store.tx():
        with store.savepoint():
            store.insert_messages([_msg(1)])
        with pytest.raises(RuntimeError), store.savepoint():
            store.insert_messages([_msg(2)])
            store.insert_events([(1.0, "K", "s", "d")])  # a statement of its own
            raise RuntimeError("this caller fails")
    assert _ids(store) == [1]
    assert store.events(0, 10) == []
    assert _savepoints(statements) == ["SAVEPOINT unit", "ROLLBACK TO unit", "RELEASE unit"]


def test_held_writes_go_with_a_transaction_that_rolls_back(store):
    with pytest.raises(RuntimeError), store.tx():
        with store.savepoint():
            store.insert_messages([_msg(1)])
        raise RuntimeError("the group fails")
    assert _ids(store) == []
    with store.tx():  # and nothing is left held for the next transaction
        store.insert_messages([_msg(2)])
    assert _ids(store) == [2]


def test_held_writes_that_fail_to_run_leave_the_transaction_unable_to_commit(store):
    with store.tx():
        store.insert_messages([_msg(1)])
    with pytest.raises(sqlite3.IntegrityError), store.tx():
        with store.savepoint():
            store.insert_messages([_msg(1)])  # the same id again: fails when it runs
        assert not store.in_tx_lost
        with pytest.raises(sqlite3.IntegrityError), store.savepoint():
            store.group_state(1)  # the next statement runs it
        assert store.in_tx_lost  # the group must end: what it holds did not all run
        raise sqlite3.IntegrityError("the group ends here")
    assert _ids(store) == [1]
    assert not store.in_tx_lost


def test_a_unit_inside_a_unit_is_rolled_back_alone_and_the_outer_one_commits(store, statements):
    with store.tx(), store.savepoint():
        store.insert_messages([_msg(1)])  # held, until the inner unit begins
        with pytest.raises(RuntimeError), store.savepoint():
            store.insert_messages([_msg(2)])
            raise RuntimeError("the inner caller fails")
        store.insert_messages([_msg(3)])
    assert _ids(store) == [1, 3]
    assert _savepoints(statements) == [
        "SAVEPOINT unit",
        "SAVEPOINT unit",
        "ROLLBACK TO unit",
        "RELEASE unit",
        "RELEASE unit",
    ]
