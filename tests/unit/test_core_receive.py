"""BrokerCore: RECEIVE, commit, rollback, group state, GET CONVERSATION GROUP, MOVE CONVERSATION,
poison messages, leases, retention and the audit trail. No Ray: the core runs on a :memory: store
with a fake clock."""

from __future__ import annotations

import pytest

from actors.calls.envelope import Begin, End, Send
from actors.errors import (
    ContractViolation,
    GroupLocked,
    InvalidArgument,
    LockNotHeld,
    QueueDisabled,
)


def bodies(group):
    return [m.body for m in group.messages]


# --- receive ---------------------------------------------------------------------------------


def test_receive_returns_all_waiting_messages_of_exactly_one_group_and_locks_it(core, open_dialog):
    d1 = open_dialog(core, bodies=[b"a", b"b"])
    open_dialog(core, bodies=[b"x"])

    (got,) = core.receive("TargetQ")

    assert bodies(got) == [b"a", b"b"]
    assert {m.conversation_handle for m in got.messages} == {d1.target}
    locked = [g for g in core.groups_view("TargetQ") if g["locked_by"]]
    assert [(g["conversation_group_id"], g["locked_by"]) for g in locked] == [
        (got.group_id, got.lock_id)
    ]


def test_receive_returns_one_conversations_messages_before_the_next_each_in_sequence(
    core, open_dialog
):
    d1 = open_dialog(core, related_group="orders-1")
    d2 = open_dialog(core, related_group="orders-1")
    core.apply(
        [Send(t, "Reply", body) for t, body in [(d2.target, b"b1"), (d1.target, b"a1")]]
        + [Send(t, "Reply", body) for t, body in [(d2.target, b"b2"), (d1.target, b"a2")]]
    )

    (got,) = core.receive("InitQ")

    convs = [m.conversation_handle for m in got.messages]
    assert convs == [d2.init, d2.init, d1.init, d1.init]  # first to arrive goes first
    assert bodies(got) == [b"b1", b"b2", b"a1", b"a2"]
    assert core.settle(commit=[got.lock_id])["committed"] == 4
    assert core.depth("InitQ") == (0, 4)


def test_receive_top_n_takes_only_the_first_n_messages_and_the_rest_come_after_commit(
    core, open_dialog
):
    open_dialog(core, bodies=[b"a", b"b", b"c"])

    (first,) = core.receive("TargetQ", top=2)
    core.settle(commit=[first.lock_id])
    (rest,) = core.receive("TargetQ")

    assert bodies(first) == [b"a", b"b"]
    assert bodies(rest) == [b"c"]


def _segment_statements(core):
    """The store's statements that cut a segment (mark its first messages received) or delete
    whole ones, as they run."""
    seen: list[str] = []
    core.store.db.set_trace_callback(seen.append)
    return lambda kind: [s for s in seen if s.startswith(kind)]


CUTS, DELETES = "UPDATE segments SET taken_to", "DELETE FROM segments"


@pytest.mark.parametrize("cached", [True, False])
def test_a_commit_of_all_that_waited_deletes_whole_segments_and_cuts_none(
    make_core, open_dialog, tmp_path, cached
):
    # two sends in one call on one dialog are one segment; the late send is another
    core = make_core(tmp_path / "b.db")
    d = open_dialog(core, bodies=[b"a"])
    core.apply([Send(d.init, "Req", [b"b", b"c"]), Send(d.init, "Req", b"d")])
    if not cached:  # a restart: the receive reads the store, not the read cache
        core.store.close()
        core = make_core(tmp_path / "b.db", catalog=False)
    statements = _segment_statements(core)
    (got,) = core.receive("TargetQ")
    core.apply([Send(d.init, "Req", b"late")])

    core.settle(commit=[got.lock_id])

    assert bodies(got) == [b"a", b"b", b"c", b"d"]
    assert statements(CUTS) == [] and statements(DELETES) != []
    (after,) = core.receive("TargetQ")
    assert bodies(after) == [b"late"]


@pytest.mark.parametrize("top", [2, 3])
def test_a_commit_of_part_of_a_segment_cuts_it_and_its_other_messages_come_next(
    core, open_dialog, top
):
    d = open_dialog(core, bodies=[b"a"])
    core.apply([Send(d.init, "Req", [b"b", b"c"])])  # one segment: b, c
    statements = _segment_statements(core)
    (first,) = core.receive("TargetQ", top=top)  # 2: a and b; 3: all there is

    core.settle(commit=[first.lock_id])

    assert bodies(first) == [b"a", b"b", b"c"][:top]
    assert (statements(CUTS) != []) is (top == 2)
    rest = core.receive("TargetQ")
    assert [bodies(g) for g in rest] == ([[b"c"]] if top == 2 else [])


def test_a_lock_whose_last_receive_took_the_rest_of_a_cut_segment_deletes_it_whole(
    core, open_dialog
):
    d = open_dialog(core, bodies=[b"a"])
    core.apply([Send(d.init, "Req", [b"b", b"c", b"e"])])
    group_id, lock_id = core.get_conversation_group("TargetQ")
    (part,) = core.receive("TargetQ", lock_id=lock_id, top=2)
    (rest,) = core.receive("TargetQ", lock_id=lock_id)
    statements = _segment_statements(core)

    assert core.settle(commit=[lock_id])["committed"] == 4

    assert bodies(part) + bodies(rest) == [b"a", b"b", b"c", b"e"]
    assert statements(CUTS) == []
    assert core.receive("TargetQ") == []
    assert core.store.db.execute("SELECT COUNT(*) FROM segments").fetchone() == (0,)


def test_a_second_receive_skips_the_locked_group_and_takes_the_next(core, open_dialog):
    open_dialog(core, bodies=[b"first"])
    open_dialog(core, bodies=[b"second"])

    (g1,) = core.receive("TargetQ")
    (g2,) = core.receive("TargetQ")

    assert bodies(g1) == [b"first"]
    assert bodies(g2) == [b"second"]
    assert g1.group_id != g2.group_id
    assert core.receive("TargetQ") == []


def test_receive_with_max_groups_returns_several_groups_each_with_its_own_lock(core, open_dialog):
    for body in (b"1", b"2", b"3"):
        open_dialog(core, bodies=[body])

    got = core.receive("TargetQ", max_groups=2)

    assert [bodies(g) for g in got] == [[b"1"], [b"2"]]
    assert len({g.lock_id for g in got}) == 2
    assert len({g.group_id for g in got}) == 2
    assert core.queues_view()["TargetQ"]["locked_groups"] == 2


def test_receive_by_group_id_takes_that_group_even_when_it_is_not_the_oldest(core, open_dialog):
    open_dialog(core, bodies=[b"old"])
    d2 = open_dialog(core, bodies=[b"new"])
    gid = next(
        e["conversation_group_id"]
        for e in core.endpoints_view()
        if e["conversation_handle"] == d2.target
    )

    (got,) = core.receive("TargetQ", group_id=gid)

    assert got.group_id == gid
    assert bodies(got) == [b"new"]


def test_receive_by_handle_takes_the_group_of_that_conversation(core, open_dialog):
    open_dialog(core, bodies=[b"old"])
    d2 = open_dialog(core, bodies=[b"new"])

    (got,) = core.receive("TargetQ", handle=d2.target)

    assert [m.conversation_handle for m in got.messages] == [d2.target]
    assert bodies(got) == [b"new"]


def test_receive_on_an_empty_queue_returns_an_empty_list(core):
    assert core.receive("TargetQ") == []
    assert core.queues_view()["TargetQ"]["locked_groups"] == 0


# --- commit and rollback -----------------------------------------------------------------------


def test_commit_removes_only_the_received_messages_and_ones_arriving_while_locked_come_next(
    core, open_dialog
):
    d = open_dialog(core, bodies=[b"a", b"b"])
    (got,) = core.receive("TargetQ")
    core.apply([Send(d.init, "Req", b"late")])
    assert core.receive("TargetQ") == []  # the group is locked

    result = core.settle(commit=[got.lock_id])
    (after,) = core.receive("TargetQ")

    assert result["committed"] == 2
    assert bodies(after) == [b"late"]
    assert [m.sequence_number for m in after.messages] == [2]


def test_rollback_returns_the_messages_to_the_queue_in_the_same_order(core, open_dialog):
    open_dialog(core, bodies=[b"a", b"b", b"c"])
    (got,) = core.receive("TargetQ")
    first = [(m.queuing_order, m.sequence_number, m.body) for m in got.messages]

    core.settle(rollback=[got.lock_id])
    (again,) = core.receive("TargetQ")

    assert [(m.queuing_order, m.sequence_number, m.body) for m in again.messages] == first
    assert again.group_id == got.group_id
    assert again.lock_id != got.lock_id


def test_a_rolled_back_group_is_received_before_younger_groups(core, open_dialog):
    open_dialog(core, bodies=[b"older"])
    open_dialog(core, bodies=[b"younger"])
    (got,) = core.receive("TargetQ")

    core.settle(rollback=[got.lock_id])

    assert bodies(core.receive("TargetQ")[0]) == [b"older"]


def test_commit_with_reply_and_end_ops_and_state_applies_them_all(core, open_dialog):
    d = open_dialog(core, bodies=[b"q"])
    (got,) = core.receive("TargetQ")

    core.settle(
        commit=[got.lock_id],
        ops=[Send(d.target, "Reply", b"answer"), End(d.target)],
        states={got.group_id: b"done"},
    )

    (reply,) = core.receive("InitQ")
    assert [(m.message_type, m.body) for m in reply.messages] == [
        ("Reply", b"answer"),
        ("EndDialog", b""),
    ]
    assert core.queue_view("TargetQ") == []
    state = {g["conversation_group_id"]: g["state"] for g in core.groups_view("TargetQ")}
    assert state[got.group_id] == b"done"


def test_commit_with_a_bad_op_applies_nothing_and_keeps_the_lock(core, open_dialog, snapshot):
    d = open_dialog(core, bodies=[b"q"])
    (got,) = core.receive("TargetQ")
    before = snapshot(core)

    with pytest.raises(ContractViolation):
        core.settle(
            commit=[got.lock_id],
            ops=[Send(d.target, "Reply", b"ok"), Send(d.target, "Req", b"not the target's")],
            states={got.group_id: b"never"},
        )

    assert snapshot(core) == before
    assert core.receive("InitQ") == []
    assert core.settle(commit=[got.lock_id])["committed"] == 1  # the lock is still held


def test_group_state_written_at_commit_is_returned_by_the_next_receive_of_that_group(
    core, open_dialog
):
    d = open_dialog(core, bodies=[b"1"])
    (got,) = core.receive("TargetQ")
    assert got.state is None

    core.settle(commit=[got.lock_id], states={got.group_id: b"step-1"})
    core.apply([Send(d.init, "Req", b"2")])
    (again,) = core.receive("TargetQ")

    assert again.group_id == got.group_id
    assert again.state == b"step-1"


# --- related conversations -------------------------------------------------------------------


def _reply_in_order(core, replies):
    """Receive every waiting group on TargetQ; commit them with `replies` (handle, body)."""
    got = core.receive("TargetQ", max_groups=10)
    core.settle(commit=[g.lock_id for g in got], ops=[Send(h, "Reply", b) for h, b in replies])


def test_conversations_begun_with_related_conversation_share_a_group_received_by_conversation(
    core, open_dialog
):
    d1 = open_dialog(core)
    d2 = open_dialog(core, related_conversation=d1.init)
    _reply_in_order(core, [(d2.target, b"2a"), (d1.target, b"1a"), (d2.target, b"2b")])

    got = core.receive("InitQ", max_groups=10)

    assert len(got) == 1
    assert [(m.conversation_handle, m.body) for m in got[0].messages] == [
        (d2.init, b"2a"),
        (d2.init, b"2b"),
        (d1.init, b"1a"),
    ]


def test_conversations_begun_with_the_same_related_group_id_share_that_group(core, open_dialog):
    d1 = open_dialog(core, related_group="my-group")
    d2 = open_dialog(core, related_group="my-group")
    _reply_in_order(core, [(d1.target, b"1"), (d2.target, b"2")])

    got = core.receive("InitQ", max_groups=10)

    assert [g.group_id for g in got] == ["my-group"]
    assert [(m.conversation_handle, m.body) for m in got[0].messages] == [
        (d1.init, b"1"),
        (d2.init, b"2"),
    ]


# --- get conversation group --------------------------------------------------------------------


def test_get_conversation_group_locks_a_group_without_taking_its_messages(core, open_dialog):
    open_dialog(core, bodies=[b"a", b"b"])

    gid, lock_id = core.get_conversation_group("TargetQ")

    assert core.receive("TargetQ") == []  # locked for everyone else
    rows = core.queue_view("TargetQ")
    assert [r["status"] for r in rows] == ["waiting", "waiting"]
    assert {g["conversation_group_id"]: g["locked_by"] for g in core.groups_view("TargetQ")}[
        gid
    ] == lock_id


def test_receive_with_the_lock_id_of_get_conversation_group_takes_its_messages(core, open_dialog):
    open_dialog(core, bodies=[b"a", b"b"])
    gid, lock_id = core.get_conversation_group("TargetQ")

    (got,) = core.receive("TargetQ", lock_id=lock_id)
    core.settle(commit=[lock_id])

    assert (got.group_id, got.lock_id) == (gid, lock_id)
    assert bodies(got) == [b"a", b"b"]
    assert core.queue_view("TargetQ") == []


def test_get_conversation_group_on_an_empty_queue_returns_none(core):
    assert core.get_conversation_group("TargetQ") is None


# --- move conversation -------------------------------------------------------------------------


def _group_of(core, handle):
    return next(
        e["conversation_group_id"]
        for e in core.endpoints_view()
        if e["conversation_handle"] == handle
    )


def test_move_conversation_moves_its_messages_into_the_other_group(core, open_dialog):
    d1 = open_dialog(core, bodies=[b"1"])
    d2 = open_dialog(core, bodies=[b"2a", b"2b"])
    g1 = _group_of(core, d1.target)

    core.move_conversation(d2.target, g1)
    got = core.receive("TargetQ", max_groups=10)

    assert _group_of(core, d2.target) == g1
    assert [g.group_id for g in got] == [g1]
    assert bodies(got[0]) == [b"1", b"2a", b"2b"]


def test_move_conversation_into_a_locked_group_is_refused(core, open_dialog, snapshot):
    d1 = open_dialog(core)
    d2 = open_dialog(core)
    (got,) = core.receive("TargetQ", handle=d1.target)
    before = snapshot(core)

    with pytest.raises(GroupLocked):
        core.move_conversation(d2.target, got.group_id)

    assert snapshot(core) == before


def test_move_conversation_out_of_a_locked_group_is_refused(core, open_dialog):
    d1 = open_dialog(core)
    d2 = open_dialog(core)
    core.receive("TargetQ", handle=d2.target)

    with pytest.raises(GroupLocked):
        core.move_conversation(d2.target, _group_of(core, d1.target))


def test_move_conversation_to_a_group_of_another_queue_is_invalid(core, open_dialog):
    d = open_dialog(core)

    with pytest.raises(InvalidArgument):
        core.move_conversation(d.target, _group_of(core, d.init))  # InitQ vs TargetQ

    assert _group_of(core, d.target) != _group_of(core, d.init)


# --- poison messages -------------------------------------------------------------------------


def _receive_and_roll_back(core, queue, times):
    for _ in range(times):
        (got,) = core.receive(queue)
        core.settle(rollback=[got.lock_id])


def test_poison_limit_rollbacks_in_a_row_disable_the_queue(core, open_dialog):
    open_dialog(core, to="Poison")

    _receive_and_roll_back(core, "PoisonQ", 3)

    with pytest.raises(QueueDisabled):
        core.receive("PoisonQ")
    assert core.queues_view()["PoisonQ"]["enabled"] is False
    assert [(e["kind"], e["subject"]) for e in core.events_view()] == [("QueueDisabled", "PoisonQ")]


def test_messages_given_back_return_to_the_queue_without_counting_toward_poison(core, open_dialog):
    open_dialog(core, to="Poison", bodies=[b"m"])
    for _ in range(5):  # PoisonQ's limit is 3: rollbacks this many times would disable it
        (got,) = core.receive("PoisonQ")
        assert core.give_back([got.lock_id]) == 1

    assert core.queues_view()["PoisonQ"]["enabled"] is True
    assert core.queues_view()["PoisonQ"]["rollbacks_in_a_row"] == 0
    (got,) = core.receive("PoisonQ")
    assert bodies(got) == [b"m"]  # the same message, waiting again
    core.settle(commit=[got.lock_id])
    # a lock no longer held (committed, or never handed out) is passed over, not an error
    assert core.give_back([got.lock_id, "no-such-lock", 7]) == 0


def test_a_commit_between_rollbacks_resets_the_poison_count(core, open_dialog):
    d = open_dialog(core, to="Poison", bodies=[b"bad"])
    _receive_and_roll_back(core, "PoisonQ", 2)
    (got,) = core.receive("PoisonQ")
    core.settle(commit=[got.lock_id])
    core.apply([Send(d.init, "Req", b"bad again")])

    _receive_and_roll_back(core, "PoisonQ", 2)

    assert core.queues_view()["PoisonQ"]["enabled"] is True
    assert core.queues_view()["PoisonQ"]["rollbacks_in_a_row"] == 2
    assert len(core.receive("PoisonQ")) == 1


def test_altering_a_poisoned_queue_to_enabled_makes_it_receivable_again(core, open_dialog):
    open_dialog(core, to="Poison", bodies=[b"m"])
    _receive_and_roll_back(core, "PoisonQ", 3)

    core.alter("queue", "PoisonQ", {"enabled": True})

    assert core.queues_view()["PoisonQ"]["rollbacks_in_a_row"] == 0
    (got,) = core.receive("PoisonQ")
    assert bodies(got) == [b"m"]


def _rollbacks(core):
    return core.queues_view()["PoisonQ"]["rollbacks_in_a_row"]


def test_a_multi_group_receive_rolled_back_counts_as_one_failed_turn(core, open_dialog):
    for _ in range(8):
        open_dialog(core, to="Poison")

    for turn in (1, 2):
        got = core.receive("PoisonQ", max_groups=8)
        assert len(got) == 8
        core.settle(rollback=[g.lock_id for g in got])
        assert _rollbacks(core) == turn  # not 8 per turn: the limit is 3

    assert core.queues_view()["PoisonQ"]["enabled"] is True


def test_a_multi_group_turn_rolled_back_in_pieces_still_counts_once(core, open_dialog):
    for _ in range(4):
        open_dialog(core, to="Poison")
    got = core.receive("PoisonQ", max_groups=4)

    for g in got:
        core.settle(rollback=[g.lock_id])

    assert _rollbacks(core) == 1


def test_a_multi_group_lease_that_lapses_counts_once(core, core_clock, open_dialog):
    for _ in range(8):
        open_dialog(core, to="Poison")
    core.receive("PoisonQ", max_groups=8, lease_s=5)

    core_clock.advance(5)
    core.tick()

    assert _rollbacks(core) == 1
    assert len(core.receive("PoisonQ", max_groups=8)) == 8


def test_a_dead_holder_of_many_groups_counts_once(core, open_dialog):
    for _ in range(8):
        open_dialog(core, to="Poison")
    core.receive("PoisonQ", max_groups=8, owner="reader-1")

    assert core.release_owner("reader-1") == 8

    assert _rollbacks(core) == 1
    assert core.queues_view()["PoisonQ"]["enabled"] is True


def test_separate_receives_rolled_back_count_separately_up_to_the_limit(core, open_dialog):
    for _ in range(3):
        open_dialog(core, to="Poison")
    turns = [core.receive("PoisonQ") for _ in range(3)]

    core.settle(rollback=[g.lock_id for (g,) in turns])

    assert core.queues_view()["PoisonQ"]["enabled"] is False


def test_lock_ids_are_not_guessable_from_one_another(core, open_dialog):
    for _ in range(2):
        open_dialog(core)
    a, b = core.receive("TargetQ", max_groups=2)
    guess = a.lock_id.rsplit("-", 1)[0][:-1] + "2"  # the next counter, without the random part

    assert b.lock_id.startswith(guess + "-")  # same prefix and counter ...
    assert b.lock_id != guess  # ... but the counter alone is not the id
    with pytest.raises(LockNotHeld):
        core.settle(commit=[guess])
    assert core.settle(commit=[b.lock_id])["committed"] == 1


# --- leases and owners -------------------------------------------------------------------------


def test_after_the_lease_runs_out_the_group_is_receivable_again(core, core_clock, open_dialog):
    open_dialog(core, bodies=[b"m"])
    (got,) = core.receive("TargetQ", lease_s=5)

    core_clock.advance(5)
    core.tick()
    (again,) = core.receive("TargetQ")

    assert again.group_id == got.group_id
    assert bodies(again) == [b"m"]


def test_committing_a_lock_whose_lease_ran_out_raises_lock_not_held(core, core_clock, open_dialog):
    open_dialog(core, bodies=[b"m"])
    (got,) = core.receive("TargetQ", lease_s=5)
    core_clock.advance(5)
    core.tick()

    with pytest.raises(LockNotHeld):
        core.settle(commit=[got.lock_id])

    assert [r["status"] for r in core.queue_view("TargetQ")] == ["waiting"]


def test_a_lease_still_running_keeps_the_lock(core, core_clock, open_dialog):
    open_dialog(core, bodies=[b"m"])
    (got,) = core.receive("TargetQ", lease_s=5)

    core_clock.advance(4.9)
    core.tick()

    assert core.receive("TargetQ") == []
    assert core.settle(commit=[got.lock_id])["committed"] == 1


def test_release_owner_rolls_back_every_lock_of_that_owner_only(core, open_dialog):
    for body in (b"1", b"2", b"3"):
        open_dialog(core, bodies=[body])
    dead = core.receive("TargetQ", max_groups=2, owner="worker-1")
    (alive,) = core.receive("TargetQ", owner="worker-2")

    assert core.release_owner("worker-1") == 2

    again = core.receive("TargetQ", max_groups=10)
    assert [bodies(g) for g in again] == [[b"1"], [b"2"]]
    assert {g.group_id for g in again} == {g.group_id for g in dead}
    assert core.settle(commit=[alive.lock_id])["committed"] == 1


# --- retention and audit -----------------------------------------------------------------------


def test_a_retention_queue_keeps_committed_messages_as_received_until_the_conversation_ends(
    core, open_dialog
):
    d = open_dialog(core, to="Retain", bodies=[b"a", b"b"])
    (got,) = core.receive("RetainQ")
    core.settle(commit=[got.lock_id])

    assert [(r["status"], r["sequence_number"]) for r in core.queue_view("RetainQ")] == [
        ("received", 0),
        ("received", 1),
    ]
    assert core.receive("RetainQ") == []
    assert core.queues_view()["RetainQ"]["depth"] == 0

    core.apply([End(d.target)])

    assert core.queue_view("RetainQ") == []


@pytest.mark.parametrize("retention", [True, False], ids=["turned-off", "turned-on"])
def test_altering_retention_applies_to_what_is_received_after_and_keeps_what_was(
    core, open_dialog, retention
):
    # the four messages are one of the store's segments; its first two are received before
    core.alter("queue", "RetainQ", {"retention": retention})
    open_dialog(core, to="Retain", bodies=[b"a", b"b", b"c", b"d"])
    (got,) = core.receive("RetainQ", top=2)
    core.settle(commit=[got.lock_id])
    core.alter("queue", "RetainQ", {"retention": not retention})
    (got,) = core.receive("RetainQ", top=1)
    assert [m.body for m in got.messages] == [b"c"]
    core.settle(commit=[got.lock_id])

    kept = [0, 1] if retention else [2]
    assert [(r["status"], r["sequence_number"]) for r in core.queue_view("RetainQ")] == [
        *(("received", n) for n in kept),
        ("waiting", 3),
    ]
    (got,) = core.receive("RetainQ")
    assert [m.body for m in got.messages] == [b"d"]


def test_one_settle_of_a_cut_retention_group_and_a_whole_plain_group_keeps_each_rule(
    core, open_dialog
):
    open_dialog(core, to="Retain", bodies=[b"a", b"b", b"c"])  # one segment
    open_dialog(core, bodies=[b"x"])
    (kept,) = core.receive("RetainQ", top=2)  # part of its segment
    (plain,) = core.receive("TargetQ")  # all of its

    core.settle(commit=[plain.lock_id, kept.lock_id])

    assert [(r["status"], r["sequence_number"]) for r in core.queue_view("RetainQ")] == [
        ("received", 0),
        ("received", 1),
        ("waiting", 2),
    ]
    (rest,) = core.receive("RetainQ")
    assert bodies(rest) == [b"c"]
    assert core.receive("TargetQ") == []


def test_audit_view_has_one_record_per_committed_message_with_conversation_and_sequence(
    core, open_dialog
):
    d1 = open_dialog(core, bodies=[b"a", b"b"])
    d2 = open_dialog(core, bodies=[b"c"])
    got = core.receive("TargetQ", max_groups=2)
    core.settle(commit=[got[0].lock_id], rollback=[got[1].lock_id])

    audit = core.audit()["records"]

    assert [(a["conversation_id"], a["sequence_number"]) for a in audit] == [
        (d1.conversation_id, 0),
        (d1.conversation_id, 1),
    ]
    assert all(a["queue"] == "TargetQ" and a["from_initiator"] for a in audit)
    assert all(a["broker_id"] == core.broker_id for a in audit)

    (rest,) = core.receive("TargetQ")
    core.settle(commit=[rest.lock_id])
    assert [(a["conversation_id"], a["sequence_number"]) for a in core.audit()["records"]][2:] == [
        (d2.conversation_id, 0)
    ]


def test_a_begin_in_commit_ops_can_send_on_the_new_dialog_in_the_same_batch(core, open_dialog):
    open_dialog(core)
    (got,) = core.receive("TargetQ")
    new = Begin("Init", "Target", "C")

    result = core.settle(commit=[got.lock_id], ops=[new, Send(new.handle, "Req", b"fresh")])

    assert result["handles"] == [new.handle]
    assert bodies(core.receive("TargetQ")[0]) == [b"fresh"]


def test_naming_the_same_lock_twice_in_one_settle_is_refused_and_changes_nothing(core, open_dialog):
    d = open_dialog(core, bodies=[b"a", b"b"])
    (got,) = core.receive("TargetQ", top=1)
    core.apply([Send(d.init, "Req", b"c")])

    with pytest.raises(InvalidArgument):
        core.settle(commit=[got.lock_id, got.lock_id])

    assert core.queues_view()["TargetQ"]["depth"] == len(core.queue_view("TargetQ")) == 3
    assert core.audit()["records"] == []
    core.settle(commit=[got.lock_id])  # the lock is still held
    assert core.queues_view()["TargetQ"]["depth"] == 2


def test_receive_with_a_lock_id_of_another_queue_is_invalid(core, open_dialog):
    open_dialog(core, to="Retain", bodies=[b"retain"])
    _, lock_id = core.get_conversation_group("RetainQ")

    with pytest.raises(InvalidArgument):
        core.receive("TargetQ", lock_id=lock_id)
