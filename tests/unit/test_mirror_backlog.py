"""The mirror's backlog: shipped transactions are held (in a file beside the store, then answered
for) and applied after, all that waits in one transaction; a mirror whose process stopped in
between applies the file when it opens; a gap is refused, a retried ship held once, a torn last
frame ignored. Real SQLite files, no Ray."""

from __future__ import annotations

import os
import shutil
import sqlite3

import pytest

from actors.errors import MirrorBehind
from actors.mirroring import backlog as backlogs
from actors.mirroring import replay
from actors.mirroring.backlog import Backlog, log_path, read_log, recover
from actors.mirroring.capture import Entry
from tests.unit.test_mirror_channel import DATA, old_log, tables
from tests.unit.test_mirror_log import dump, workload


def held(mirror) -> int:
    return replay.held_seq(mirror)


def logged(pair, core_clock, sync: bool = False) -> tuple:
    """The workload run on the principal: its log's entries, and an empty backlog on the mirror."""
    core, capture, mirror, _ = pair
    workload(core, core_clock)
    return capture.take(10_000), Backlog(mirror.path, held(mirror), sync=sync)


def test_held_transactions_are_answered_for_then_applied_in_one_go(pair, core_clock):
    core, capture, mirror, _ = pair
    workload(core, core_clock)
    entries = capture.take(10_000)
    log = Backlog(mirror.path, held(mirror), sync=False)
    half = len(entries) // 2
    assert log.accept(entries[:half]) == entries[half - 1].seq
    assert log.accept(entries[half:]) == capture.seq
    assert held(mirror) == 0  # held, not applied: the store has none of it yet
    assert [e.seq for e in read_log(log.path)] == [e.seq for e in entries]
    assert log.drain(mirror.db) == capture.seq
    assert held(mirror) == capture.seq and not log.pending and log.bytes == 0
    assert os.path.getsize(log.path) == 0  # applied: the file is emptied
    assert dump(mirror) == dump(core.store)
    log.close()


def test_a_mirror_stopped_after_answering_applies_its_file_when_it_opens(pair, core_clock):
    core, capture, mirror, open_store = pair
    workload(core, core_clock)
    log = Backlog(mirror.path, held(mirror), sync=False)
    log.accept(capture.take(10_000))
    log.close()  # the process stops: nothing applied
    mirror.close()
    reopened = open_store("m.sqlite")
    assert held(reopened) == 0
    assert recover(reopened.path, reopened.db, held(reopened)) == capture.seq
    assert dump(reopened) == dump(core.store)
    assert not os.path.exists(log_path(reopened.path))
    assert recover(reopened.path, reopened.db, capture.seq) == capture.seq  # nothing again


def test_a_last_frame_cut_short_was_never_answered_for_and_is_left_out(pair, core_clock):
    core, capture, mirror, _ = pair
    entries, log = logged(pair, core_clock)
    log.accept(entries[:3])
    log.accept(entries[3:])
    log.close()
    with open(log.path, "r+b") as f:  # the last write stopped half way
        f.truncate(os.path.getsize(log.path) - 5)
    assert [e.seq for e in read_log(log.path)] == [e.seq for e in entries[:-1]]
    damaged = log.path + "-damaged"  # a frame whole in length but not in content: read up to it
    shutil.copyfile(log.path, damaged)
    with open(damaged, "r+b") as f:
        f.seek(4 + len(backlogs._framed(entries[0])) + 4)  # into the second entry's msgpack
        f.write(b"\xc1" * 8)  # a byte msgpack never uses
    assert [e.seq for e in read_log(damaged)] == [entries[0].seq]
    assert recover(mirror.path, mirror.db, 0) == entries[-2].seq
    assert replay.apply(mirror.db, held(mirror), entries) == capture.seq  # the rest follows
    assert dump(mirror) == dump(core.store)


def test_a_gap_is_refused_and_a_retried_ship_is_held_once(pair, core_clock):
    core, capture, mirror, _ = pair
    entries, log = logged(pair, core_clock)
    log.accept(entries[:4])
    size = os.path.getsize(log.path)
    assert log.accept(entries[:4]) == entries[3].seq  # a ship again after a lost answer
    assert len(log.pending) == 4 and os.path.getsize(log.path) == size
    with pytest.raises(MirrorBehind) as info:
        log.accept(entries[5:])
    assert (info.value.held, info.value.got) == (entries[3].seq, entries[5].seq)
    assert log.received == entries[3].seq and os.path.getsize(log.path) == size
    assert log.accept(entries[2:]) == capture.seq  # overlapping: only what is new is held
    log.drain(mirror.db)
    assert dump(mirror) == dump(core.store)
    log.close()


def test_a_backlog_that_cannot_be_applied_is_left_as_it_was(pair, core_clock):
    core, capture, mirror, _ = pair
    workload(core, core_clock)
    entries = capture.take(10_000)
    bad = Entry(entries[-1].seq + 1, 0.0, [(False, "INSERT INTO no_such_table VALUES (1)", ())])
    log = Backlog(mirror.path, 0, sync=False)
    log.accept([*entries, bad])
    with pytest.raises(Exception, match="no_such_table"):
        log.drain(mirror.db)
    assert held(mirror) == 0 and log.applied_seq == 0  # rolled back, all of it
    assert len(log.pending) == len(entries) + 1
    log.close()


def test_the_backlog_is_bounded_and_a_rebuild_empties_it(pair, core_clock, monkeypatch):
    monkeypatch.setattr(backlogs, "MOST_ENTRIES", 3)
    core, capture, mirror, _ = pair
    entries, log = logged(pair, core_clock)
    log.accept(entries[:2])
    assert not log.full()
    log.accept(entries[2:3])
    assert log.full()
    log.reset(capture.seq)  # rebuilt from a snapshot at the principal's number
    assert not log.pending and not log.full() and log.received == log.applied_seq == capture.seq
    assert read_log(log.path) == []
    log.close()


def test_what_is_held_waits_briefly_to_be_applied_with_what_follows(pair, core_clock, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(backlogs.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(backlogs, "MOST_ENTRIES", 4)
    entries, log = logged(pair, core_clock)
    assert len(entries) >= 6
    assert log.apply_wait(now[0]) == 0.0  # nothing waits: nothing to wait for
    log.accept(entries[:1])
    assert log.apply_wait(now[0]) == pytest.approx(backlogs.APPLY_AFTER_S)
    now[0] += backlogs.APPLY_AFTER_S / 2
    log.accept(entries[1:2])  # a later one does not put the first one's apply off
    assert log.apply_wait(now[0]) == pytest.approx(backlogs.APPLY_AFTER_S / 2)
    now[0] += backlogs.APPLY_AFTER_S / 2
    assert log.apply_wait(now[0]) == 0.0  # the first one has waited its time
    taken = log.take()
    log.accept(entries[2:3])  # held while the two are applied: it waits from now
    log.apply(pair[2].db, taken)
    log.applied(taken)
    assert log.apply_wait(now[0]) == pytest.approx(backlogs.APPLY_AFTER_S)
    log.accept(entries[3:6])  # a full backlog: applied without waiting
    assert len(log.pending) == 4 and log.apply_wait(now[0]) == 0.0
    log.drain(pair[2].db)
    assert held(pair[2]) == entries[5].seq
    log.close()


def test_a_full_backlog_is_applied_without_waiting(pair, core_clock, monkeypatch):
    monkeypatch.setattr(backlogs, "MOST_ENTRIES", 2)
    entries, log = logged(pair, core_clock)
    log.accept(entries[:2])
    assert log.full() and log.apply_wait(0.0) == 0.0
    log.close()


def test_at_full_durability_each_hold_is_synced_before_it_is_answered(
    pair, core_clock, monkeypatch
):
    synced = []
    monkeypatch.setattr(backlogs.os, "fdatasync", lambda fd: synced.append(fd))
    core, capture, mirror, _ = pair
    workload(core, core_clock)
    entries = capture.take(10_000)
    log = Backlog(mirror.path, 0, sync=True)
    log.accept(entries[:2])
    log.accept(entries[2:])
    assert len(synced) == 2
    Backlog(mirror.path + "-other", 0, sync=False).accept(entries[:1])
    assert len(synced) == 2  # at normal durability the file is written, not synced


def test_an_old_releases_log_held_then_recovered_from_the_file_makes_the_principals_store(tmp_path):
    entries = old_log()  # captured by release e4b58cb (tests/data/make_mirror_log_v1.py)
    path = str(tmp_path / "m.sqlite")
    shutil.copyfile(DATA / "mirror-log-v1-start.sqlite", path)
    log = Backlog(path, 0, sync=False)
    for i in range(0, len(entries), 4):  # ships of four
        log.accept(entries[i : i + 4])
    log.close()  # the process stops before applying any of it
    db = sqlite3.connect(path, isolation_level=None)  # as the channel test's mirror: the file as is
    try:
        assert recover(path, db, 0) == entries[-1].seq
    finally:
        db.close()
    assert tables(path) == tables(DATA / "mirror-log-v1-end.sqlite")  # row for row


def test_a_write_that_fails_part_way_is_cut_off_and_nothing_of_it_held(
    pair, core_clock, monkeypatch
):
    core, capture, mirror, _ = pair
    entries, log = logged(pair, core_clock)
    log.accept(entries[:2])
    size = os.path.getsize(log.path)
    write = os.write

    def half_then_full(fd, data):  # the disk fills half way through the next ship
        write(fd, bytes(data[: len(data) // 2]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(backlogs.os, "write", half_then_full)
    with pytest.raises(OSError, match="No space"):
        log.accept(entries[2:5])
    assert os.path.getsize(log.path) == size and log.received == entries[1].seq
    assert len(log.pending) == 2
    monkeypatch.setattr(backlogs.os, "write", write)
    assert log.accept(entries[2:]) == capture.seq  # the ship again, once there is room
    assert [e.seq for e in read_log(log.path)] == [e.seq for e in entries]
    log.drain(mirror.db)
    assert dump(mirror) == dump(core.store)
    log.close()
