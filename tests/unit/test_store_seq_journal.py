"""The sequence journal (actors.store.seq_journal): endpoints' sequence numbers appended to a
journal, read back newest first, folded into `endpoint_seqs` in sweeps; a rollback, a kill and a
restart keep what was committed and nothing else. Real SQLite files; no Ray."""

from __future__ import annotations

import contextlib
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from actors.calls.envelope import Send
from actors.store import seq_journal
from actors.store.database import Store
from tests.unit.test_store import _endpoint_row

BIRTH = (2, 3)  # the numbers `_endpoint_row` begins an endpoint with


@pytest.fixture
def path(tmp_path) -> str:
    return str(tmp_path / "broker.sqlite")


@pytest.fixture
def small_sweeps(monkeypatch):
    """Sweeps that end after 10 rows, so a few transactions run several."""
    monkeypatch.setattr(seq_journal, "SWEEP_ROWS", 10)


def numbers(store: Store, no: int) -> tuple[int, int]:
    row = store.endpoint_by_no(no)
    return row[9], row[10]


def table(store: Store) -> dict[int, tuple[int, int]]:
    """What `endpoint_seqs` itself holds (the journal aside)."""
    rows = store.db.execute("SELECT no, send_seq, recv_seq FROM endpoint_seqs")
    return {no: (s, r) for no, s, r in rows}


def journal_rows(store: Store) -> int:
    """The entries the journal holds (packed: several to a row)."""
    return sum(1 for _ in seq_journal.entries(store.db))


def one_endpoint_at_5_6(path: str) -> Store:
    """A store with endpoint 1, its numbers (5, 6) committed to the journal."""
    s = Store(path)
    s.upsert_endpoints([_endpoint_row(1)])
    with s.tx():
        s.update_endpoint_seqs([(5, 6, 1)])
    return s


def test_the_journals_newest_numbers_win_in_every_read(path):
    s = Store(path)
    s.upsert_endpoints([_endpoint_row(1), _endpoint_row(2)])
    with s.tx():
        s.update_endpoint_seqs([(5, 6, 1)])  # (send_seq, recv_seq, no)
    with s.tx():
        s.update_endpoint_seqs([(7, 8, 1)])

    assert numbers(s, 1) == (7, 8) and numbers(s, 2) == BIRTH
    assert s.endpoint_by_handle("h-1")[9:11] == (7, 8)
    assert s.endpoint_by_conversation("c-1", True)[9:11] == (7, 8)
    assert [row[9:11] for row in s.all_endpoints()] == [(7, 8), BIRTH]
    assert table(s) == {1: BIRTH, 2: BIRTH} and journal_rows(s) == 2  # appended, not folded
    s.close()


def test_a_rolled_back_transaction_leaves_the_numbers_as_committed(path):
    s = one_endpoint_at_5_6(path)
    with pytest.raises(RuntimeError), s.tx():
        s.update_endpoint_seqs([(9, 9, 1)])
        assert numbers(s, 1) == (9, 9)  # the open transaction reads its own write
        raise RuntimeError("the caller's unit failed")

    assert numbers(s, 1) == (5, 6) and journal_rows(s) == 1
    with s.tx():
        s.update_endpoint_seqs([(10, 11, 1)])
    s.close()
    s = Store(path)
    assert numbers(s, 1) == (10, 11)
    s.close()


def test_a_broker_killed_inside_a_transaction_keeps_the_numbers_committed_before(path):
    s = one_endpoint_at_5_6(path)
    s.close()
    killed = (
        "import os, sys\n"
        "from actors.store.database import Store\n"
        "s = Store(sys.argv[1])\n"
        "with s.tx():\n"
        "    s.update_endpoint_seqs([(9, 9, 1)])\n"
        "    os._exit(7)\n"
    )
    done = subprocess.run([sys.executable, "-c", killed, path], capture_output=True, timeout=60)
    assert done.returncode == 7, done.stderr.decode()

    s = Store(path)
    assert numbers(s, 1) == (5, 6) and journal_rows(s) == 1
    s.close()


def test_a_transactions_entries_are_one_row_numbered_in_order(path):
    s = Store(path)
    s.upsert_endpoints([_endpoint_row(no) for no in range(1, 51)])
    with s.tx():
        s.update_endpoint_seqs([(no, 100 + no, no) for no in range(1, 51)])
    s.update_endpoint_seqs([(7, 7, 3), (8, 8, 4)])  # outside a transaction: commits on its own

    assert s.db.execute("SELECT COUNT(*) FROM seq_entries").fetchone()[0] == 2
    want = [(no, no, no, 100 + no) for no in range(1, 51)] + [(51, 3, 7, 7), (52, 4, 8, 8)]
    assert list(seq_journal.entries(s.db)) == want
    s.close()
    s = Store(path)  # read back from the packed rows
    assert numbers(s, 3) == (7, 7) and numbers(s, 50) == (50, 150)
    with s.tx():  # and numbered on from where they ended
        s.update_endpoint_seqs([(9, 9, 1)])
    assert list(seq_journal.entries(s.db))[-1] == (53, 1, 9, 9)
    s.close()


def test_a_store_journalled_before_the_packing_reads_its_rows_and_drops_them_after_a_sweep(
    tmp_path, small_sweeps
):
    path = str(tmp_path / "old.sqlite")
    # written by an earlier release: endpoint 1's newest numbers (5, 0) only in `seq_journal`
    shutil.copy(Path(__file__).parents[1] / "data" / "store-schema2.sqlite", path)
    s = Store(path)
    assert numbers(s, 1) == (5, 0) and numbers(s, 2) == (3, 0)
    assert table(s)[1] == (3, 0)
    for n in range(30):  # enough entries that a sweep ends
        with s.tx():
            s.update_endpoint_seqs([(10 + n, 0, 2)])
    assert s.db.execute("SELECT COUNT(*) FROM seq_journal").fetchone()[0] == 0
    assert table(s)[1] == (5, 0)  # folded into the table before its row went
    assert numbers(s, 1) == (5, 0) and numbers(s, 2) == (39, 0)
    s.close()
    s = Store(path)
    assert numbers(s, 1) == (5, 0) and numbers(s, 2) == (39, 0)
    s.close()


def test_an_ended_endpoints_number_the_journal_names_is_not_used_again(path):
    s = Store(path)
    s.upsert_endpoints([_endpoint_row(1), _endpoint_row(5)])
    with s.tx():
        s.update_endpoint_seqs([(7, 8, 5)])
    with s.tx():
        s.delete_endpoints([5])
    assert s.endpoint_by_no(5) is None
    s.close()

    s = Store(path)  # its journal row is still there: a new endpoint must not be number 5
    assert s.max_keys()[0] == 5
    s.close()


@pytest.mark.parametrize("seed", range(4))
def test_sweeps_fold_the_journal_and_reads_always_see_the_newest_numbers(path, small_sweeps, seed):
    rng = random.Random(seed)
    s = Store(path)
    nos = list(range(1, 21))
    s.upsert_endpoints([_endpoint_row(no) for no in nos])
    want = dict.fromkeys(nos, BIRTH)
    n = 10
    for step in range(300):
        written = {
            no: (n + i, n + i + 1) for i, no in enumerate(rng.sample(nos, rng.randint(1, 4)))
        }
        n += 10
        fails = rng.random() < 0.2
        with pytest.raises(RuntimeError) if fails else contextlib.nullcontext(), s.tx():
            s.update_endpoint_seqs([(a, b, no) for no, (a, b) in written.items()])
            if fails:
                raise RuntimeError("rolled back")
        if not fails:
            want |= written
        if step % 50 == 49:  # a restart reads the journal back
            s.close()
            s = Store(path)
        assert {no: numbers(s, no) for no in nos} == want
        # the journal holds two sweeps' rows and what they carried (at most one row per
        # endpoint each; three sweeps across a restart) and the rows of the transaction that
        # ends one; the table is never ahead of a read
        assert journal_rows(s) <= 3 * (seq_journal.SWEEP_ROWS + len(nos)) + 4
        assert all(table(s)[no] <= want[no] for no in nos)
        # an endpoint's numbers leave memory only once the table holds them
        assert all(table(s)[no] == want[no] for no in nos if no not in s.seq_journal.latest)
    # memory holds only endpoints written in the last two sweeps (three across a restart)
    assert len(s.seq_journal.latest) <= 3 * seq_journal.SWEEP_ROWS
    s.close()


def test_a_busy_endpoint_is_not_folded_while_it_stays_busy_and_the_journal_stays_bounded(
    path, small_sweeps
):
    s = Store(path)
    s.upsert_endpoints([_endpoint_row(no) for no in range(1, 102)])
    for n in range(1, 101):  # endpoint 1 in every transaction, each other endpoint once
        with s.tx():
            s.update_endpoint_seqs([(10 + n, 20 + n, 1), (10 + n, 20 + n, 1 + n)])
        assert journal_rows(s) <= 3 * seq_journal.SWEEP_ROWS + 2
    assert numbers(s, 1) == (110, 120)
    # the busy endpoint's row was never rewritten: each fold would be a scattered page write
    assert table(s)[1] == BIRTH
    # the quiet ones were folded and left memory, all but those of the last sweeps
    folded = [no for no in range(2, 102) if table(s)[no] == (9 + no, 19 + no)]
    assert len(folded) >= 100 - 2 * seq_journal.SWEEP_ROWS
    assert set(range(2, 102)) - set(s.seq_journal.latest) <= set(folded)
    s.close()
    s = Store(path)  # a restart reads the busy endpoint's newest numbers back
    assert numbers(s, 1) == (110, 120)
    s.close()


def test_an_endpoint_written_in_every_sweep_is_carried_never_folded_and_folded_once_quiet(
    path, small_sweeps
):
    s = Store(path)
    s.upsert_endpoints([_endpoint_row(no) for no in range(1, 302)])
    # endpoint 1 written every 8th transaction; a sweep lasts 10 or more (a row each, the
    # others written once): it misses many sweeps' windows but is written in every sweep
    for n in range(1, 201):
        rows = [(10 + n, 20 + n, 1 + n)] + ([(10 + n, 20 + n, 1)] if n % 8 == 0 else [])
        with s.tx():
            s.update_endpoint_seqs(rows)
    assert numbers(s, 1) == (210, 220)
    assert table(s)[1] == BIRTH  # carried at the journal's end, never a scattered write
    assert 1 in s.seq_journal.latest
    for n in range(201, 301):  # quiet now for many sweeps: folded, and out of memory
        with s.tx():
            s.update_endpoint_seqs([(10 + n, 20 + n, 1 + n)])
    assert table(s)[1] == (210, 220) and 1 not in s.seq_journal.latest
    assert numbers(s, 1) == (210, 220)
    s.close()
    s = Store(path)
    assert numbers(s, 1) == (210, 220)
    s.close()


def test_a_broker_restarted_between_sweeps_continues_every_dialog_in_order(
    make_core, path, open_dialog, small_sweeps
):
    core = make_core(path)
    dialogs = [open_dialog(core, bodies=[b"first"]) for _ in range(6)]
    received = {d.conversation_id: [] for d in dialogs}
    for round_ in range(8):
        for d in dialogs:
            core.apply([Send(d.init, "Req", [b"%d" % round_, b"x"])])
        for got in core.receive("TargetQ", max_groups=10):
            for m in got.messages:
                received[m.conversation_id].append(m.sequence_number)
            core.settle(commit=[got.lock_id])
        core.store.close()
        core = make_core(path, catalog=False)

    assert all(seqs == list(range(17)) for seqs in received.values())
    assert journal_rows(core.store) <= 40
