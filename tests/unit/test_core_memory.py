"""Memory that does not leak: what a broker holds per timer, dialog and group is released when
they end, in memory and in the store. No Ray: BrokerCore on a :memory: store, fake clock."""

from __future__ import annotations

from actors.calls.envelope import Begin, End, Send, Timer
from actors.model.catalog import DIALOG_TIMER

TABLES = ("endpoints", "endpoint_seqs", "groups", "segments", "transmission_runs")


def rows(core) -> dict[str, int]:
    db = core.store.db
    return {t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}


def held(core) -> dict[str, int]:
    st = core.state
    return {
        "timer entries": len(st.timers),
        "endpoints": len(st.endpoints),
        "handles": len(st.endpoints._handles),
        "groups": len(st.groups),
        "group ids": len(st.groups._ids),
        "cached groups": len(st.cache._runs),
    }


def test_rearming_a_timer_many_times_keeps_the_schedule_bounded(core, core_clock, open_dialog):
    d = open_dialog(core, lifetime=3600)
    before = held(core)

    for i in range(5_000):
        core.apply([Timer(d.init, 60 + i % 7)])
        core_clock.advance(0.001)
        core.tick()

    after = held(core)
    assert after["timer entries"] <= before["timer entries"] + 2 * 3 + 64
    assert {k: v for k, v in after.items() if k != "timer entries"} == {
        k: v for k, v in before.items() if k != "timer entries"
    }


def test_the_last_rearm_is_the_one_that_fires(core, core_clock, open_dialog):
    d = open_dialog(core)
    for timeout in (50, 10, 30):
        core.apply([Timer(d.init, timeout)])

    core_clock.advance(29)
    core.tick()
    assert core.receive("InitQ") == []
    core_clock.advance(1)
    core.tick()

    (got,) = core.receive("InitQ")
    assert [m.message_type for m in got.messages] == [DIALOG_TIMER]


def test_dialogs_ended_with_cleanup_in_a_loop_leave_nothing_behind(core, core_clock, open_dialog):
    open_dialog(core)  # one dialog that stays, so the baseline is not empty
    before_rows, before_held = rows(core), held(core)

    for i in range(500):
        op = Begin("Init", "Target", "C", related_group=f"order-{i}", lifetime=600)
        core.apply([op, Send(op.handle, "Req", b"x"), Timer(op.handle, 30)])
        (got,) = core.receive("TargetQ", max_groups=1)
        target = got.messages[0].conversation_handle
        core.settle(commit=[got.lock_id], ops=[End(target, cleanup=True)])
        core.apply([End(op.handle, cleanup=True)])
        core_clock.advance(0.01)
        core.tick()

    assert rows(core) == before_rows
    after = held(core)
    assert after["timer entries"] <= before_held["timer entries"] + 64 + 2 * 4
    assert {k: v for k, v in after.items() if k != "timer entries"} == {
        k: v for k, v in before_held.items() if k != "timer entries"
    }


def test_a_group_goes_only_with_its_last_conversation(core, open_dialog):
    d1 = open_dialog(core, related_group="shared")
    d2 = open_dialog(core, related_group="shared")

    core.apply([End(d1.init, cleanup=True)])
    assert core.state.groups.by_id("shared") is not None

    core.apply([End(d2.init, cleanup=True)])
    assert core.state.groups.by_id("shared") is None
    assert core.store.db.execute(
        "SELECT count(*) FROM groups WHERE group_id='shared'"
    ).fetchone() == (0,)
