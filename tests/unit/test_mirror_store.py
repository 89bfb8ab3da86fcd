"""The mirror's side of shipping (actors.mirroring.mirror_store), as a partner uses it: ships held
in order and answered, applied just after on a thread; a ship that came before the one it
follows waits for it; a gap that stays is refused; a full backlog makes a ship wait; a caller no
longer in line is refused after a wait; a backlog that cannot be applied leaves the mirror
failed until a rebuild. Real SQLite files and asyncio, no Ray."""

from __future__ import annotations

import asyncio
import os

import pytest

from actors.errors import MirrorBehind, StaleEpoch
from actors.mirroring import backlog as backlogs
from actors.mirroring import mirror_store, replay
from actors.mirroring.backlog import read_log
from actors.mirroring.capture import Entry
from actors.mirroring.mirror_store import MirrorStore
from tests.polling import apoll
from tests.unit.test_mirror_log import dump, workload


async def in_line() -> None:
    return None


def opened(pair, core_clock) -> tuple[list[Entry], MirrorStore]:
    """The workload run on the principal (its log's entries) and its mirror, opened as a partner
    opens it."""
    core, capture, mirror, _ = pair
    workload(core, core_clock)
    mirror.close()  # the partner opens the file itself
    return capture.take(10_000), MirrorStore(mirror.path, "normal", "test-mirror")


def test_ships_are_held_in_order_then_applied_to_the_store(pair, core_clock):
    entries, m = opened(pair, core_clock)
    core = pair[0]

    async def main():
        half = len(entries) // 2
        assert await m.hold(entries[:half], in_line) == entries[half - 1].seq
        assert await m.hold(entries[half:], in_line) == entries[-1].seq
        await apoll(lambda: m.backlog.applied_seq == entries[-1].seq, "all applied")
        await m.quiet()

    asyncio.run(main())
    assert replay.held_seq(m.store) == entries[-1].seq and m.applied_at is not None
    assert os.path.getsize(backlogs.log_path(m.path)) == 0  # all applied: the file emptied
    assert dump(m.store) == dump(core.store)
    m.close()


def test_a_ship_that_came_before_the_one_it_follows_waits_for_it(pair, core_clock):
    entries, m = opened(pair, core_clock)

    asked = []

    async def later_in_line() -> None:
        asked.append(1)

    async def main():
        later = asyncio.ensure_future(m.hold(entries[3:], later_in_line))
        await apoll(lambda: asked, "the later ship to arrive")  # and wait for the first three
        assert not later.done() and m.backlog.received == 0
        assert await m.hold(entries[:3], in_line) == entries[2].seq
        assert await later == entries[-1].seq
        await m.apply_all()

    asyncio.run(main())
    assert replay.held_seq(m.store) == entries[-1].seq
    m.close()


def test_a_gap_that_stays_is_refused_and_nothing_of_it_held(pair, core_clock, monkeypatch):
    monkeypatch.setattr(mirror_store, "GAP_S", 0.05)
    entries, m = opened(pair, core_clock)

    async def main():
        await m.hold(entries[:2], in_line)
        with pytest.raises(MirrorBehind) as refused:
            await m.hold(entries[4:], in_line)
        assert (refused.value.held, refused.value.got) == (entries[1].seq, entries[4].seq)
        await m.apply_all()

    asyncio.run(main())
    assert m.backlog.received == replay.held_seq(m.store) == entries[1].seq
    assert read_log(backlogs.log_path(m.path)) == []
    m.close()


def test_a_ship_that_finds_the_backlog_full_waits_for_it_to_be_applied(
    pair, core_clock, monkeypatch
):
    monkeypatch.setattr(backlogs, "MOST_ENTRIES", 2)
    entries, m = opened(pair, core_clock)

    async def main():
        await m.hold(entries[:2], in_line)
        assert m.backlog.full() and replay.held_seq(m.store) == 0
        assert await m.hold(entries[2:4], in_line) == entries[3].seq
        # it was held only once the two before it were applied
        assert replay.held_seq(m.store) >= entries[1].seq
        await m.apply_all()

    asyncio.run(main())
    assert replay.held_seq(m.store) == entries[3].seq
    m.close()


def test_a_caller_no_longer_in_line_after_a_wait_holds_nothing(pair, core_clock):
    entries, m = opened(pair, core_clock)
    asked = []

    async def stale_after_first() -> None:
        asked.append(1)
        if len(asked) > 1:  # a failover while it waited
            raise StaleEpoch("the principal of epoch 1", 1, 2)

    async def main():
        waiting = asyncio.ensure_future(m.hold(entries[2:], stale_after_first))
        await apoll(lambda: asked, "the later ship to arrive")
        await m.hold(entries[:2], in_line)  # what it waited for came: it asks again
        with pytest.raises(StaleEpoch):
            await waiting
        await m.apply_all()

    asyncio.run(main())
    assert m.backlog.received == replay.held_seq(m.store) == entries[1].seq
    m.close()


def test_a_backlog_that_cannot_be_applied_leaves_the_mirror_failed_until_replaced(pair, core_clock):
    entries, m = opened(pair, core_clock)
    core = pair[0]
    bad = Entry(entries[-1].seq + 1, 0.0, [(False, "INSERT INTO no_such_table VALUES (1)", ())])

    async def main():
        await m.hold([*entries, bad], in_line)  # held (answered for), then not applicable
        await apoll(lambda: m.failed is not None, "the apply's failure")
        await m.apply_all()  # a promotion's: it does not try again, nor clear it

    asyncio.run(main())
    assert "no_such_table" in m.failed and replay.held_seq(m.store) == 0
    snapshot = replay.snapshot(core.store.db)
    m.replace(snapshot, entries[-1].seq)  # a rebuild from the principal
    assert m.failed is None and m.backlog.received == m.backlog.applied_seq == entries[-1].seq
    assert replay.held_seq(m.store) == entries[-1].seq
    assert dump(m.store) == dump(core.store)
    m.close()
