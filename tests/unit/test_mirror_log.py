"""Mirroring's log: every transaction a principal's store commits is captured as statements with
their values; replayed in order on a copy, the copy equals the principal's store, row for row.
A mirror that starts empty or misses a transaction is refused (`MirrorBehind`) and rebuilt from
a snapshot of the principal. Real SQLite files, no Ray."""

from __future__ import annotations

import asyncio

import pytest

from actors.calls.envelope import Begin, End, Send, Timer
from actors.core import BrokerCore, Limits
from actors.errors import ContractViolation, MirrorBehind
from actors.mirroring import replay
from actors.mirroring.capture import attach
from actors.service.group_commit import GroupCommit
from actors.store import seq_journal
from actors.store.database import Store
from tests.unit.conftest import core_snapshot, define_core_catalog, open_core_dialog


def dump(store: Store) -> dict[str, list]:
    """Every table of the store (whatever tables it has), row by row."""
    q = "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"
    tables = [t for (t,) in store.db.execute(q)]
    assert {"endpoints", "segments", "ended", "rerunnable"} <= set(tables)
    return {t: store.db.execute(f"SELECT * FROM {t} ORDER BY rowid").fetchall() for t in tables}


def ship(capture, mirror) -> int:
    held = replay.apply(mirror.db, replay.held_seq(mirror), capture.take(10_000))
    capture.drop_through(held)
    return held


def workload(core: BrokerCore, core_clock) -> None:
    define_core_catalog(core)
    dialogs = [open_core_dialog(core, bodies=[b"a", b"b"]) for _ in range(5)]
    core.apply([Timer(dialogs[0].init, 30)])
    for n in range(2):  # dialogs begun if absent, as an ingest's: one goes, one lives on
        rerun = Begin("Init", "Target", "C", handle=f"rerun/{n}", conversation_id=f"rr{n}",
                      if_absent=True)  # fmt: skip
        core.apply([rerun, Send(rerun.handle, "Req", [b"r0"], at=0)])
    core.apply([End("rerun/0", cleanup=True)])
    groups = core.receive("TargetQ", max_groups=3)
    ops = [Send(groups[0].messages[0].conversation_handle, "Reply", [b"r"])]
    core.settle([groups[0].lock_id], [g.lock_id for g in groups[1:]], ops, {}, "req-1")
    core.apply([End(dialogs[4].init)])
    core_clock.advance(60)
    core.tick()


def test_a_replayed_log_makes_the_mirror_equal_to_the_principal(pair, core_clock):
    core, capture, mirror, _ = pair
    workload(core, core_clock)
    assert capture.seq > 10  # one number per transaction that wrote
    held = ship(capture, mirror)
    assert held == capture.seq and not capture.pending
    assert dump(mirror) == dump(core.store)


def test_a_replayed_log_folds_the_sequence_journal_as_the_principal_did(
    pair, core_clock, tmp_path, monkeypatch
):
    monkeypatch.setattr(seq_journal, "SWEEP_ROWS", 4)  # sweeps end within the workload
    core, capture, mirror, open_store = pair
    workload(core, core_clock)
    ship(capture, mirror)
    assert dump(mirror) == dump(core.store)
    birth = "SELECT COUNT(*) FROM endpoint_seqs WHERE send_seq > 0 OR recv_seq > 0"
    assert mirror.db.execute(birth).fetchone()[0] > 0  # numbers were folded into the table
    mirror.close()
    promoted = BrokerCore(open_store("m.sqlite"), core_clock, Limits())  # as at a failover
    assert _durable(core_snapshot(promoted)) == _durable(core_snapshot(core))


def test_a_group_commits_callers_rolled_back_unit_leaves_nothing_in_the_log(pair, core_clock):
    core, capture, mirror, _ = pair
    define_core_catalog(core)
    ds = [open_core_dialog(core) for _ in range(4)]
    ship(capture, mirror)
    commits = GroupCommit(core.uow, lambda: None)
    bad = Send(ds[1].init, "Reply", [b"the initiator may not send Reply"])

    def change(i, d):
        tail = [bad] if i == 1 else []
        return lambda: core.apply([Send(d.init, "Req", [b"x"]), *tail], None)

    async def together():
        subs = [commits.submit(change(i, d)) for i, d in enumerate(ds)]
        return await asyncio.gather(*subs, return_exceptions=True)

    before = capture.seq
    outcomes = asyncio.run(together())
    assert isinstance(outcomes[1], ContractViolation)
    assert capture.seq == before + 1  # one group commit, one transaction
    assert ship(capture, mirror) == capture.seq
    assert dump(mirror) == dump(core.store)


def test_a_mirror_that_missed_a_transaction_is_refused_then_rebuilt(pair, core_clock, tmp_path):
    core, capture, mirror, open_store = pair
    define_core_catalog(core)
    ship(capture, mirror)
    open_core_dialog(core)
    capture.pending.popleft()  # the mirror never gets this one
    open_core_dialog(core)
    with pytest.raises(MirrorBehind) as info:
        ship(capture, mirror)
    assert info.value.held < info.value.got
    # rebuild: the principal's snapshot replaces the mirror's file
    path = mirror.path
    mirror.close()
    replay.install(path, replay.snapshot(core.store.db))
    capture.pending.clear()
    rebuilt = open_store("m.sqlite")
    assert replay.held_seq(rebuilt) == capture.seq
    open_core_dialog(core)
    assert ship(capture, rebuilt) == capture.seq
    assert dump(rebuilt) == dump(core.store)


def test_an_empty_mirror_is_rebuilt_and_a_core_opened_on_it_resumes(pair, core_clock, tmp_path):
    core, capture, _, open_store = pair
    workload(core, core_clock)
    path = str(tmp_path / "late.sqlite")
    blank = open_store("late.sqlite")
    assert replay.is_blank(blank)
    with pytest.raises(MirrorBehind):
        replay.apply(blank.db, replay.held_seq(blank), capture.take(1_000)[3:])
    blank.close()
    replay.install(path, replay.snapshot(core.store.db))
    promoted = BrokerCore(open_store("late.sqlite"), core_clock, Limits())
    assert promoted.broker_id == core.broker_id
    assert _durable(core_snapshot(promoted)) == _durable(core_snapshot(core))


def _durable(snap: dict) -> dict:
    """What a store holds: failed turns in a row and messages removed are counted in memory
    only (a restart, and so a failover, starts them again)."""
    for q in snap["queues"].values():
        q.pop("rollbacks_in_a_row")
        q.pop("removed")
    return snap


def test_a_ship_retried_after_a_lost_answer_applies_once(pair, core_clock):
    core, capture, mirror, _ = pair
    define_core_catalog(core)
    entries = capture.take(1_000)
    replay.apply(mirror.db, 0, entries)
    assert replay.apply(mirror.db, replay.held_seq(mirror), entries) == capture.seq
    assert dump(mirror) == dump(core.store)


def test_repeated_statements_join_but_never_across_a_rolled_back_savepoint(tmp_path):
    principal, copy = Store(str(tmp_path / "p.sqlite")), str(tmp_path / "c.sqlite")
    replay.install(copy, replay.snapshot(principal.db))
    capture = attach(principal)
    ev = (1.0, "K", "s", "d")
    with principal.tx():
        principal.insert_events([ev, ev])
        principal.insert_events([ev])  # the same statement: joins the one before
        with pytest.raises(RuntimeError), principal.savepoint():
            principal.insert_events([ev])  # same statement, in a savepoint rolled back
            raise RuntimeError("this caller fails")
        principal.insert_events([ev])
    [entry] = capture.pending
    # 2 + 1 joined; the savepoint's row was cut by its rollback; the last joined them after
    assert [len(rows) for _, _, rows in entry.statements] == [4]
    mirror = Store(copy)
    try:
        replay.apply(mirror.db, 0, list(capture.pending))
        assert dump(mirror) == dump(principal)
        assert len(dump(mirror)["events"]) == 4
    finally:
        mirror.close()
        principal.close()


def test_a_rebuilt_store_is_synced_into_its_directory(tmp_path, monkeypatch):
    """The rename that puts a rebuilt mirror store in place is made durable (the directory
    synced) before the rebuild is answered."""
    synced: list[str] = []
    real = replay.sync_directory
    monkeypatch.setattr(replay, "sync_directory", lambda d: (synced.append(d), real(d)))
    path = tmp_path / "m.sqlite"

    replay.install(str(path), b"the rebuilt store")

    assert path.read_bytes() == b"the rebuilt store" and synced == [str(tmp_path)]
