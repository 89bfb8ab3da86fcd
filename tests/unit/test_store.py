"""The SQLite store, on :memory: and on a real file: transactions, durability, and every table."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator

import pytest

from actors.errors import InvalidArgument, StoreError
from actors.runs import rows_of
from actors.store.database import ENDPOINT_COLUMNS, Store
from actors.store.segments import run_of
from tests.unit.conftest import stored_messages

WAITING, RECEIVED = 0, 1


@pytest.fixture
def path(tmp_path) -> str:
    return str(tmp_path / "broker.sqlite")


@pytest.fixture(params=["memory", "file"])
def store(request, path) -> Iterator[Store]:
    s = Store(":memory:" if request.param == "memory" else path)
    yield s
    s.close()


def _row(
    id: int, group: int = 1, endpoint: int = 1, status: int = WAITING
) -> tuple[int, int, int, int, str, bytes, int, float, float]:
    """A message row: (id, group_no, endpoint_no, seq, type, body, status, sent_at, arrived_at)."""
    return (id, group, endpoint, id, "M", f"m{id}".encode(), status, float(id), float(id) + 0.5)


def _msg(id: int, group: int = 1, endpoint: int = 1, status: int = WAITING) -> tuple:
    """_row as the run of one message the store takes (actors.store.segments)."""
    return run_of(_row(id, group, endpoint, status))


def _fetched(id: int, endpoint: int = 1) -> tuple[int, int, int, str, bytes, float, float]:
    """What fetch_group returns for `_msg(id, ..., endpoint)`."""
    _, _, ep, seq, mt, body, _, sent, arrived = _row(id, endpoint=endpoint)
    return (id, ep, seq, mt, body, sent, arrived)


def _ids(rows) -> list[int]:
    return [r[0] for r in rows]


def _all_messages(s: Store) -> list[tuple]:
    return stored_messages(s)


def _endpoints(s: Store) -> list[tuple]:
    """Every endpoint's columns as the store keeps them (without its key and rerun trace)."""
    return [row[:18] for row in s.all_endpoints()]


def _groups(s: Store) -> list[tuple]:
    return [row[:3] for row in s.all_groups()]


def _keys(s: Store) -> list[tuple]:
    return [(row[0], row[17]) for row in s.all_endpoints() if row[17] is not None]


def _endpoint_row(no: int, state: str = "CONVERSING") -> tuple:
    return (
        no,
        f"h-{no}",
        f"c-{no}",
        1,
        "Here",
        "There",
        "C",
        1,
        state,
        2,
        3,
        10.5,
        None,
        None,
        None,
        None,
        0,  # encryption
        None,  # onward
    )


# --- opening ---------------------------------------------------------------------------------


@pytest.mark.parametrize("durability", ["fast", "FULL", "", None])
def test_a_bad_durability_is_an_invalid_argument_and_creates_no_file(path, durability):
    with pytest.raises(InvalidArgument):
        Store(path, durability=durability)
    assert not os.path.exists(path)


@pytest.mark.parametrize("durability", ["normal", "full"])
def test_a_store_opens_with_either_durability(path, durability):
    s = Store(path, durability=durability)
    sync = s.db.execute("PRAGMA synchronous").fetchone()[0]
    s.close()
    assert sync == {"normal": 1, "full": 2}[durability]


def test_a_file_store_uses_write_ahead_logging(path):
    s = Store(path)
    mode = s.db.execute("PRAGMA journal_mode").fetchone()[0]
    s.close()
    assert mode == "wal"


def test_a_store_keeps_its_savepoints_sub_journal_in_memory(path):
    # a group commit's units are savepoints; in a temporary file each changed page is a write
    # call (a new dialog's inserts cost twice as much: docs/benchmarks.md)
    s = Store(path)
    temp_store = s.db.execute("PRAGMA temp_store").fetchone()[0]
    s.close()
    assert temp_store == 2  # MEMORY


def test_a_deleted_batch_is_not_written_again_to_erase_it(path):
    # Debian's SQLite zeroes freed pages by default (secure_delete): a consumed 200 KB segment
    # would be written to the WAL twice more. FAST erases only within pages written anyway.
    s = Store(path)
    s.db.execute("CREATE TABLE scratch (b BLOB)")
    s.db.execute("INSERT INTO scratch VALUES (?)", (os.urandom(200_000),))
    before = os.path.getsize(path + "-wal")
    s.db.execute("DELETE FROM scratch")
    grown = os.path.getsize(path + "-wal") - before
    s.close()
    assert grown < 50_000, f"deleting 200 KB wrote {grown:,} bytes to the WAL"


def test_a_store_that_cannot_be_opened_is_a_store_error(tmp_path):
    with pytest.raises(StoreError, match="cannot open: its directory .* does not exist"):
        Store(str(tmp_path / "no-such-dir" / "broker.sqlite"))


def test_a_new_store_is_empty(store):
    assert store.load_catalog() == []
    assert _groups(store) == []
    assert _endpoints(store) == []
    assert store.max_keys() == (0, 0, 0)
    assert store.waiting_by_group() == []


# --- transactions ----------------------------------------------------------------------------


def test_a_transaction_commits_when_its_block_ends(store):
    with store.tx():
        store.set_meta("k", "v")
        store.insert_messages([_msg(1)])
    assert store.get_meta("k") == "v"
    assert _ids(rows_of(store.fetch_group(1, None))) == [1]


def test_a_transaction_rolls_back_everything_when_its_block_raises(store):
    with store.tx():
        store.set_meta("k", "before")
    with pytest.raises(RuntimeError, match="boom"), store.tx():
        store.set_meta("k", "after")
        store.put_definition("queue", "Q", {"name": "Q"})
        store.insert_groups([(1, "g-1", "Q")])
        store.insert_messages([_msg(1)])
        store.put_requests([("r-1", 1.0, b"result")])
        raise RuntimeError("boom")
    assert store.get_meta("k") == "before"
    assert store.load_catalog() == []
    assert _groups(store) == []
    assert _all_messages(store) == []
    assert store.request_results(["r-1"]).get("r-1") is None


def test_a_store_takes_new_transactions_after_a_rollback(store):
    with pytest.raises(RuntimeError), store.tx():
        raise RuntimeError("boom")
    with store.tx():
        store.set_meta("k", "v")
    assert store.get_meta("k") == "v"


def test_a_committed_transaction_is_seen_by_another_connection_to_the_file(path):
    writer = Store(path)
    reader = sqlite3.connect(path)  # a tool reading the file while the broker runs
    with writer.tx():
        writer.set_meta("k", "v")
    assert reader.execute("SELECT value FROM meta WHERE key='k'").fetchone() == ("v",)
    writer.close()
    reader.close()


def test_a_transaction_that_could_not_begin_leaves_the_store_usable(path):
    store = Store(path)
    other = sqlite3.connect(path, isolation_level=None)  # another process writing the file
    store.db.execute("PRAGMA busy_timeout=0")  # fail at once instead of waiting 5 s
    other.execute("BEGIN IMMEDIATE")
    with pytest.raises(StoreError, match="begin a transaction") as err, store.tx():
        pass
    assert err.value.path == path and err.value.operation == "begin a transaction"
    other.execute("ROLLBACK")
    with store.tx():
        store.set_meta("k", "v")
    assert store.get_meta("k") == "v"
    store.close()
    other.close()


def test_everything_committed_survives_closing_and_reopening_a_file_store(path):
    s = Store(path)
    with s.tx():
        s.set_meta("broker_id", "b-1")
        s.put_definition("queue", "Q", {"name": "Q", "enabled": True})
        s.insert_groups([(1, "g-1", "Q")])
        s.set_group_states([(b"state", 1)])
        s.upsert_endpoints([_endpoint_row(1)])
        s.insert_messages([_msg(1), _msg(2, status=RECEIVED)])
        s.insert_transmission([(1, 0, "M", [b"t"], "There", None, "pending", 1.0)])
        s.put_requests([("r-1", 1.0, b"result")])
    s.close()

    s = Store(path)
    assert s.get_meta("broker_id") == "b-1"
    assert s.load_catalog() == [("queue", {"name": "Q", "enabled": True})]
    assert _groups(s) == [(1, "g-1", "Q")]
    assert s.group_state(1) == b"state"
    assert _endpoints(s) == [_endpoint_row(1)]
    assert _all_messages(s) == [_row(1), _row(2, status=RECEIVED)]
    assert s.waiting_endpoints("There") == [1]
    assert s.request_results(["r-1"]).get("r-1") == b"result"
    assert s.max_keys() == (1, 1, 2)
    s.close()


# --- meta and catalog ------------------------------------------------------------------------


def test_meta_values_are_set_replaced_and_missing_keys_are_none(store):
    assert store.get_meta("k") is None
    store.set_meta("k", "1")
    store.set_meta("k", "2")
    assert store.get_meta("k") == "2"


def test_the_catalog_reloads_in_creation_order_even_after_an_update(store):
    store.put_definition("message_type", "M", {"name": "M"})
    store.put_definition("queue", "Q", {"name": "Q", "enabled": True})
    store.put_definition("service", "S", {"name": "S", "queue": "Q"})
    store.put_definition("queue", "Q", {"name": "Q", "enabled": False})
    assert store.load_catalog() == [
        ("message_type", {"name": "M"}),
        ("queue", {"name": "Q", "enabled": False}),
        ("service", {"name": "S", "queue": "Q"}),
    ]


def test_the_same_name_may_be_used_by_different_kinds(store):
    store.put_definition("message_type", "X", {"name": "X"})
    store.put_definition("contract", "X", {"name": "X", "messages": {"X": "any"}})
    assert [kind for kind, _ in store.load_catalog()] == ["message_type", "contract"]


def test_a_deleted_definition_does_not_reload(store):
    store.put_definition("queue", "Q", {"name": "Q"})
    store.put_definition("queue", "R", {"name": "R"})
    store.delete_definition("queue", "Q")
    assert store.load_catalog() == [("queue", {"name": "R"})]


# --- groups and endpoints --------------------------------------------------------------------


def test_groups_keep_their_state_until_deleted(store):
    store.insert_groups([(1, "g-1", "Q"), (2, "g-2", "Q")])
    assert store.group_state(1) is None
    store.set_group_states([(b"one", 1), (b"two", 2)])
    store.set_group_states([(None, 2)])
    assert (store.group_state(1), store.group_state(2)) == (b"one", None)
    store.delete_groups([1])
    assert _groups(store) == [(2, "g-2", "Q")]
    assert store.group_state(1) is None


def test_upserting_an_endpoint_replaces_its_row(store):
    store.upsert_endpoints([_endpoint_row(1), _endpoint_row(2)])
    store.upsert_endpoints([_endpoint_row(1, "CLOSED")])
    assert sorted(_endpoints(store)) == [_endpoint_row(1, "CLOSED"), _endpoint_row(2)]
    store.delete_endpoints([1])
    assert _endpoints(store) == [_endpoint_row(2)]


def test_an_endpoints_sequence_numbers_and_other_columns_are_updated_apart(store):
    store.upsert_endpoints([_endpoint_row(1), _endpoint_row(2)])
    store.update_endpoint_seqs([(7, 9, 1)])  # (send_seq, recv_seq, no)
    store.update_endpoints([(4, "CLOSED", None, 20.0, "b-far", 30.0, 5, 1, 2)])
    want_1 = (*_endpoint_row(1)[:9], 7, 9, *_endpoint_row(1)[11:])
    want_2 = (*_endpoint_row(2)[:7], 4, "CLOSED", 2, 3, None, 20.0, "b-far", 30.0, 5, 0, 1)
    assert sorted(_endpoints(store)) == [want_1, want_2]


def test_a_deleted_endpoints_number_used_again_starts_from_its_new_row(store):
    store.upsert_endpoints([_endpoint_row(1)])
    store.update_endpoint_seqs([(7, 9, 1)])
    store.delete_endpoints([1])
    store.upsert_endpoints([_endpoint_row(1)])  # e.g. the highest number, reused after restart
    assert _endpoints(store) == [_endpoint_row(1)]


def test_a_store_written_before_the_sequence_table_keeps_its_endpoints_numbers(path):
    s = Store(path)
    s.upsert_endpoints([_endpoint_row(1)])
    s.db.execute("DROP TABLE endpoint_seqs")  # as a store of an earlier version has it
    s.close()
    s = Store(path)
    assert _endpoints(s) == [_endpoint_row(1)]
    s.update_endpoint_seqs([(5, 6, 1)])
    s.close()
    s = Store(path)  # opened again: moved once, not overwritten by the old columns
    assert _endpoints(s) == [(*_endpoint_row(1)[:9], 5, 6, *_endpoint_row(1)[11:])]
    s.close()


def test_an_endpoint_an_earlier_raybroker_wrote_gets_its_numbers_on_the_next_open(path):
    s = Store(path)
    s.upsert_endpoints([_endpoint_row(1)])
    row = _endpoint_row(2)
    s.db.execute(  # as an earlier version writes one: the endpoints table alone
        f"INSERT INTO endpoints ({ENDPOINT_COLUMNS}) VALUES ({', '.join('?' * len(row))})", row
    )
    s.close()
    s = Store(path)
    assert sorted(_endpoints(s)) == [_endpoint_row(1), _endpoint_row(2)]
    s.close()


def test_a_store_written_before_user_sent_gets_the_column_and_keeps_its_endpoints(path):
    s = Store(path)
    s.upsert_endpoints([_endpoint_row(1)])
    s.db.execute("ALTER TABLE endpoints DROP COLUMN user_sent")  # as the previous release has it
    s.close()
    s = Store(path)
    assert _endpoints(s) == [_endpoint_row(1)]
    s.update_endpoints([(1, "DISCONNECTED_OUTBOUND", None, None, None, None, 2, None, 1)])
    s.close()
    s = Store(path)
    assert _endpoints(s)[0][-3] == 2  # user_sent (before encryption and onward)
    s.close()


def test_a_store_written_before_relayed_dialogs_gets_the_column_and_nothing_relays(path):
    s = Store(path)
    s.upsert_endpoints([_endpoint_row(1), _endpoint_row(2)])
    s.db.execute("ALTER TABLE endpoints DROP COLUMN onward")  # as the previous release has it
    s.close()
    s = Store(path)
    assert _endpoints(s) == [_endpoint_row(1), _endpoint_row(2)]  # onward empty
    s.update_endpoints([(1, "CONVERSING", None, None, None, None, None, 2, 1)])
    s.close()
    s = Store(path)
    assert [row[-1] for row in _endpoints(s)] == [2, None]  # kept across a reopen
    s.close()


def test_a_store_written_before_dialog_security_keeps_its_dialogs_in_the_clear(path):
    s = Store(path)
    s.upsert_endpoints([_endpoint_row(1)])
    s.db.execute("ALTER TABLE endpoints DROP COLUMN encryption")  # as the previous release has it
    s.db.execute("DROP TABLE dialog_keys")
    s.close()
    s = Store(path)
    assert _endpoints(s) == [_endpoint_row(1)]  # encryption 0: off
    assert _keys(s) == []
    s.put_dialog_keys([(1, b"sealed")])
    s.delete_endpoints([1])
    assert _keys(s) == []  # a dialog's key goes with its endpoint
    s.close()


def test_max_keys_are_the_highest_endpoint_group_and_message_numbers(store):
    store.upsert_endpoints([_endpoint_row(4), _endpoint_row(2)])
    store.insert_groups([(7, "g-7", "Q")])
    store.insert_messages([_msg(9), _msg(3)])
    assert store.max_keys() == (4, 7, 9)


# --- queue messages --------------------------------------------------------------------------


def test_fetch_group_returns_waiting_messages_of_the_group_in_queue_order(store):
    store.insert_messages(
        [_msg(5), _msg(2), _msg(3, group=2), _msg(4, status=RECEIVED), _msg(1, endpoint=2)]
    )
    assert rows_of(store.fetch_group(1, None)) == [
        _fetched(1, endpoint=2),
        _fetched(2),
        _fetched(5),
    ]


def test_fetch_group_returns_at_most_limit_messages(store):
    store.insert_messages([_msg(i) for i in range(1, 6)])
    assert _ids(rows_of(store.fetch_group(1, 2))) == [1, 2]


def test_fetch_group_starts_after_the_given_id(store):
    store.insert_messages([_msg(i) for i in range(1, 6)])
    assert _ids(rows_of(store.fetch_group(1, None, after_id=3))) == [4, 5]
    assert _ids(rows_of(store.fetch_group(1, 1, after_id=3))) == [4]
    assert rows_of(store.fetch_group(1, None, after_id=5)) == []


def test_remove_received_without_retention_deletes_the_waiting_messages_in_range(store):
    # a range is always a group's oldest waiting messages (a lock's): here a segment's head
    store.insert_groups([(1, "g-1", "Q"), (2, "g-2", "Q")])
    store.insert_messages([_msg(i) for i in range(1, 6)] + [_msg(6, group=2)])
    store.remove_received([(1, 3)], retain=False)
    assert _ids(_all_messages(store)) == [4, 5, 6]
    assert _ids(rows_of(store.fetch_group(1, None))) == [4, 5]
    assert store.waiting_by_group() == [(1, "Q", 2, 4), (2, "Q", 1, 6)]
    store.remove_received([(1, 5)], retain=False)
    assert _ids(_all_messages(store)) == [6]


def test_remove_received_with_retention_marks_the_messages_received_and_keeps_them(store):
    store.insert_messages([_msg(i) for i in range(1, 6)] + [_msg(13, group=2)])
    store.remove_received([(1, 3)], retain=True)
    assert _ids(rows_of(store.fetch_group(1, None))) == [4, 5]
    statuses = {row[0]: row[6] for row in _all_messages(store)}
    assert statuses == {1: RECEIVED, 2: RECEIVED, 3: RECEIVED, 4: WAITING, 5: WAITING, 13: WAITING}
    store.remove_received([(1, 5)], retain=True)
    assert rows_of(store.fetch_group(1, None)) == [] and len(_all_messages(store)) == 6


def test_a_range_over_several_conversations_segments_takes_each_ones_oldest(store):
    store.insert_groups([(1, "g-1", "Q")])
    store.insert_messages([_msg(1, endpoint=1), _msg(2, endpoint=1)])
    store.insert_messages([_msg(3, endpoint=2), _msg(4, endpoint=2)])
    store.insert_messages([_msg(5, endpoint=1), _msg(6, endpoint=1)])
    assert store.db.execute("SELECT COUNT(*) FROM segments").fetchone() == (3,)
    store.remove_received([(1, 5)], retain=False)
    assert _ids(_all_messages(store)) == [6]
    assert rows_of(store.fetch_group(1, None)) == [_fetched(6)]
    assert store.waiting_by_group() == [(1, "Q", 1, 6)]


@pytest.mark.parametrize("first_kept", [True, False], ids=["kept-then-gone", "gone-then-kept"])
def test_a_queue_whose_retention_changes_applies_the_new_rule_to_what_is_received_next(
    store, first_kept
):
    store.insert_messages([_msg(i) for i in range(1, 7)])  # one segment
    store.remove_received([(1, 2)], retain=first_kept)
    store.settle_received([1])  # the core's ALTER QUEUE does this in its transaction
    store.remove_received([(1, 4)], retain=not first_kept)
    statuses = {row[0]: row[6] for row in _all_messages(store)}
    kept = [1, 2] if first_kept else [3, 4]
    assert statuses == {**dict.fromkeys(kept, RECEIVED), 5: WAITING, 6: WAITING}
    assert _ids(rows_of(store.fetch_group(1, None))) == [5, 6]


def test_one_send_of_many_messages_is_a_few_rows_each_within_the_segment_limits(store):
    from actors.store.segments import MAX_BYTES, MAX_MESSAGES

    n = 3 * MAX_MESSAGES + 1
    store.insert_messages([(1, 1, 1, 0, "M", [b"m"] * n, WAITING, 1.0, 1.0)])  # one send
    rows = store.db.execute("SELECT first_id, last_id FROM segments ORDER BY first_id").fetchall()
    assert len(rows) == 4 and rows[-1] == (n, n)
    got = rows_of(store.fetch_group(1, None))
    assert _ids(got) == list(range(1, n + 1)) and [r[2] for r in got] == list(range(n))
    big = [bytes(MAX_BYTES // 2 + 1)] * 3  # two of them are over the bytes limit together
    store.insert_messages([(n + 1, 1, 1, n, "M", big, WAITING, 1.0, 1.0)])
    assert store.db.execute("SELECT COUNT(*) FROM segments").fetchone() == (7,)
    assert [r[2] for r in rows_of(store.fetch_group(1, None))[-3:]] == [n, n + 1, n + 2]


def test_remove_received_leaves_other_groups_alone(store):
    store.insert_messages([_msg(1), _msg(2, group=2), _msg(3)])
    store.remove_received([(1, 3)], retain=False)
    assert _ids(_all_messages(store)) == [2]


@pytest.mark.parametrize("retain", [False, True], ids=["deleted", "kept"])
def test_remove_received_takes_several_groups_ranges_in_one_call(store, retain):
    # one settle of many groups: each range its own group's, whole segments and a head alike
    store.insert_groups([(1, "g-1", "Q"), (2, "g-2", "Q"), (3, "g-3", "Q")])
    store.insert_messages([_msg(1), _msg(2), _msg(3, group=2), _msg(4, group=3), _msg(5)])
    store.insert_messages([_msg(6, group=2), _msg(7, group=2)])
    store.remove_received([(1, 2), (2, 6)], retain=retain)
    assert _ids(rows_of(store.fetch_group(1, None))) == [5]
    assert _ids(rows_of(store.fetch_group(2, None))) == [7]
    assert _ids(rows_of(store.fetch_group(3, None))) == [4]
    left = _ids(_all_messages(store))
    assert left == ([1, 2, 3, 4, 5, 6, 7] if retain else [4, 5, 7])


def test_delete_conversation_messages_counts_only_the_waiting_ones_but_deletes_all(store):
    store.insert_messages(
        [
            _msg(1, endpoint=1),
            _msg(2, endpoint=1, status=RECEIVED),
            _msg(3, endpoint=2),
            _msg(4, endpoint=1),
            _msg(5, endpoint=1, group=2),
        ]
    )
    assert store.delete_conversation_messages(1, 1) == 2
    assert _ids(_all_messages(store)) == [3, 5]


def test_delete_conversation_messages_of_a_conversation_with_nothing_waiting_counts_zero(store):
    store.insert_messages([_msg(1, status=RECEIVED)])
    assert store.delete_conversation_messages(1, 1) == 0
    assert _all_messages(store) == []


def test_move_messages_moves_an_endpoints_messages_and_returns_the_waiting_ids(store):
    store.insert_messages(
        [
            _msg(3, endpoint=1),
            _msg(1, endpoint=1),
            _msg(2, endpoint=1, status=RECEIVED),
            _msg(4, endpoint=2),
        ]
    )
    assert store.move_messages(1, old_group=1, new_group=9) == [1, 3]
    groups = {row[0]: row[1] for row in _all_messages(store)}
    assert groups == {1: 9, 2: 9, 3: 9, 4: 1}
    assert _ids(rows_of(store.fetch_group(9, None))) == [1, 3]


def test_waiting_by_group_counts_waiting_messages_and_finds_the_first(store):
    store.insert_groups([(1, "g-1", "Q"), (2, "g-2", "R"), (3, "g-3", "Q")])
    store.insert_messages(
        [
            _msg(1, status=RECEIVED),
            _msg(2),
            _msg(3),
            _msg(4, group=2),
            _msg(5, group=3, status=RECEIVED),
        ]
    )
    assert sorted(store.waiting_by_group()) == [(1, "Q", 2, 2), (2, "R", 1, 4)]


def test_queue_rows_lists_the_groups_messages_in_queue_order_with_group_and_status(store):
    store.insert_messages([_msg(3, group=2), _msg(1), _msg(2, status=RECEIVED), _msg(4, group=3)])
    rows = store.queue_rows([2, 1], limit=10)
    assert [(r[0], r[7], r[8]) for r in rows] == [
        (1, 1, WAITING),
        (2, 1, RECEIVED),
        (3, 2, WAITING),
    ]


def test_queue_rows_over_many_groups_returns_the_oldest_up_to_the_limit(store):
    store.insert_messages([_msg(i, group=i) for i in range(1, 1201)])
    rows = store.queue_rows(list(range(1200, 0, -1)), limit=1100)
    assert _ids(rows) == list(range(1, 1101))


# --- transmission queue ----------------------------------------------------------------------


def test_transmission_rows_are_kept_per_service_in_order_until_deleted(store):
    store.insert_transmission(
        [
            (1, 0, "M", [b"a"], "There", None, "pending", 1.0),
            (2, 0, "M", [b"bb"], "Elsewhere", "b-2", "pending", 2.0),
            (1, 1, "N", [b"c"], "There", None, "pending", 1.0),
        ]
    )
    # one endpoint's runs of a transaction that go on from each other share a row
    [row] = store.endpoint_transmission(1)
    assert (row.first_seq, row.types, row.bodies) == (0, ["M", "N"], [b"a", b"c"])
    assert store.waiting_endpoints("There") == [1] and store.transmission_depth() == 3
    store.delete_endpoint_transmission(1)
    assert store.waiting_endpoints("There") == []
    assert store.transmission_messages(10) == [
        (2, 2, 0, "M", 2, "Elsewhere", "b-2", "pending", 2.0, 0, 0.0)
    ]


# --- events, audit, request ids --------------------------------------------------------------


def test_events_are_read_after_an_id_up_to_a_limit(store):
    store.insert_events([(float(i), "kind", f"s{i}", "{}") for i in range(1, 6)])
    assert _ids(store.events(after_id=2, limit=2)) == [3, 4]
    assert store.events(after_id=4, limit=10) == [(5, 5.0, "kind", "s5", "{}")]
    assert _ids(store.events(after_id=0, limit=2, newest=True)) == [4, 5]  # the last two
    assert _ids(store.events(after_id=3, limit=10, newest=True)) == [4, 5]


def test_audit_rows_are_read_after_an_id_up_to_a_limit(store):
    for i in range(1, 6):
        store.insert_audit(float(i), f"p{i}".encode())
    assert list(store.audit_rows(after_id=1, limit=2)) == [(2, 2.0, b"p2"), (3, 3.0, b"p3")]


@pytest.mark.parametrize("table", ["events", "audit"])
def test_prune_keeps_only_the_newest_rows(store, table):
    for i in range(1, 11):
        if table == "events":
            store.insert_events([(float(i), "k", "s", "{}")])
        else:
            store.insert_audit(float(i), b"p")
    store.prune(table, 3)
    read = store.events if table == "events" else store.audit_rows
    assert _ids(read(0, 100)) == [8, 9, 10]
    store.prune(table, 5)
    assert _ids(read(0, 100)) == [8, 9, 10]


def test_prune_of_an_empty_table_is_harmless(store):
    store.prune("events", 3)
    assert store.events(0, 10) == []


def test_a_request_result_is_found_by_its_id(store):
    store.put_requests([("r-1", 1.0, b"one")])
    store.put_requests([("r-2", 2.0, b"two")])
    assert store.request_results(["r-1"]).get("r-1") == b"one"
    assert store.request_results(["r-2"]).get("r-2") == b"two"
    assert store.request_results(["r-3"]).get("r-3") is None


def test_prune_requests_forgets_only_requests_older_than_the_cutoff(store):
    for i in range(1, 5):
        store.put_requests([(f"r-{i}", float(i), b"x")])
    store.prune_requests(before=3.0)
    assert [store.request_results([f"r-{i}"]).get(f"r-{i}") for i in range(1, 5)] == [
        None,
        None,
        b"x",
        b"x",
    ]


def test_prune_requests_keeps_every_young_request_when_the_clock_stepped_back(store):
    # written in this order; the clock stepped back after r-3: r-4 is old, yet after a young one
    for i, at in enumerate((1.0, 2.0, 5.0, 2.5, 6.0), start=1):
        store.put_requests([(f"r-{i}", at, b"x")])
    store.prune_requests(before=3.0)
    kept = [store.request_results([f"r-{i}"]).get(f"r-{i}") is not None for i in range(1, 6)]
    assert kept == [False, False, True, True, True]  # r-4 waits for the next prune


def test_prune_requests_forgets_all_when_all_are_old(store):
    store.put_requests([(f"r-{i}", float(i), b"x") for i in range(1, 4)])
    store.prune_requests(before=10.0)
    assert [store.request_results([f"r-{i}"]).get(f"r-{i}") for i in range(1, 4)] == [
        None,
        None,
        None,
    ]


def test_request_ids_are_unique_and_ordered_by_time():
    from actors.ids import new_request_id

    ids = [new_request_id() for _ in range(1000)]
    assert len(set(ids)) == 1000 and all(len(i) == 32 for i in ids)
    times = [i[:16] for i in ids]
    assert times == sorted(times)  # the time part first: appended at the end of the index


def test_request_results_finds_any_number_of_ids_at_once(store):
    store.put_requests([(f"r-{i}", 1.0, str(i).encode()) for i in range(0, 1200, 2)])
    found = store.request_results([f"r-{i}" for i in range(1200)])  # over several statements
    assert found == {f"r-{i}": str(i).encode() for i in range(0, 1200, 2)}
