"""The core's pieces for exactly-once bulk sends (the Spark bridge's ingest): BEGIN ... IF ABSENT
with a caller-chosen conversation id, SEND ... AT a sequence number, and the audit cursor saying
how many commits its bound dropped before they were read. No Ray."""

from __future__ import annotations

import pytest

from actors.calls.envelope import Begin, End, Send, Timer, pack_ops, unpack_ops
from actors.errors import ConversationEnded, InvalidArgument
from actors.model.catalog import END_DIALOG
from actors.model.limits import Limits

from .test_core_dialogs import receive_all


def test_begin_if_absent_begins_the_dialog_once_and_keeps_the_chosen_conversation_id(core):
    op = Begin("Init", "Target", "C", handle="ingest/k1", conversation_id="conv-k1", if_absent=True)

    core.apply([op, Send(op.handle, "Req", [b"a"], at=0)])
    again = core.apply([op, Send(op.handle, "Req", [b"a"], at=0)])

    assert again == {"handles": [op.handle], "sent": 0}
    (ep,) = [e for e in core.endpoints_view() if e["conversation_handle"] == "ingest/k1"]
    assert ep["conversation_id"] == "conv-k1"
    assert [m.body for m in receive_all(core, "TargetQ")] == [b"a"]


def test_begin_if_absent_on_a_handle_of_another_dialog_is_refused(core):
    core.apply([Begin("Init", "Target", "C", handle="h")])

    with pytest.raises(InvalidArgument, match="not the one this Begin names"):
        core.apply([Begin("Init", "Target", "C", handle="h", conversation_id="x", if_absent=True)])


def test_a_conversation_id_in_use_is_refused_and_changes_nothing(core, snapshot):
    core.apply([Begin("Init", "Target", "C", handle="a", conversation_id="same")])
    before = snapshot(core)

    with pytest.raises(InvalidArgument, match="already a dialog"):
        core.apply([Begin("Init", "Target", "C", handle="b", conversation_id="same")])

    assert snapshot(core) == before


def test_send_at_skips_the_bodies_already_sent_and_sends_the_rest_in_order(core):
    op = Begin("Init", "Target", "C", handle="h")
    core.apply([op, Send("h", "Req", [b"0", b"1"], at=0)])

    # a retry of a batch that overlaps what was sent: only 2 and 3 are new
    result = core.apply([Send("h", "Req", [b"1", b"2", b"3"], at=1)])

    assert result["sent"] == 2
    got = receive_all(core, "TargetQ")
    assert [(m.sequence_number, m.body) for m in got] == [(i, str(i).encode()) for i in range(4)]


def test_send_at_beyond_the_next_sequence_number_is_refused_and_sends_nothing(core):
    core.apply([Begin("Init", "Target", "C", handle="h"), Send("h", "Req", [b"0"], at=0)])

    with pytest.raises(InvalidArgument, match="never sent"):
        core.apply([Send("h", "Req", [b"2"], at=2)])

    assert [m.body for m in receive_all(core, "TargetQ")] == [b"0"]


@pytest.mark.parametrize("at", [-1, True, 1.5, "0"])
def test_send_at_must_be_a_whole_number(at):
    with pytest.raises(InvalidArgument, match="send at"):
        Send("h", "Req", [b""], at=at)


def test_the_new_fields_cross_the_wire():
    ops = [
        Begin("I", "T", "C", handle="h", conversation_id="c", if_absent=True),
        Send("h", "Req", [b"x"], at=3),
    ]
    assert unpack_ops(pack_ops(ops)) == ops


def test_the_audit_cursor_counts_commits_dropped_by_its_bound(make_core, core_clock):
    core = make_core(limits=Limits(audit_rows=2, prune_every_s=1.0))
    op = Begin("Init", "Target", "C")
    core.apply([op])
    for i in range(5):  # five commits
        core.apply([Send(op.handle, "Req", [b"%d" % i])])
        receive_all(core, "TargetQ")
    assert core.audit(0)["missed"] == 0

    core_clock.advance(2.0)
    core.tick()  # prunes to the newest 2 commits

    got = core.audit(0)
    assert got["missed"] == 3
    assert [r["sequence_number"] for r in got["records"]] == [3, 4]
    assert core.audit(got["next"])["missed"] == 0  # a reader that kept up missed nothing


def test_a_rerun_after_the_target_ended_the_dialog_sends_nothing_and_raises_nothing(core):
    """An ingest run again (BEGIN IF ABSENT, SEND AT 0) once the target has ended the dialog:
    every message it carries was sent before, so it sends nothing, rather than failing the
    whole batch with ConversationEnded; a message not sent before is still refused."""
    op = Begin("Init", "Target", "C", handle="ingest/k2", conversation_id="conv-k2", if_absent=True)
    core.apply([op, Send(op.handle, "Req", [b"a", b"b"], at=0)])
    got = receive_all(core, "TargetQ")
    core.apply([End(got[0].conversation_handle)])  # the target ends it
    assert [m.message_type for m in receive_all(core, "InitQ")] == [END_DIALOG]

    again = core.apply([op, Send(op.handle, "Req", [b"a", b"b"], at=0)])

    assert again == {"handles": [op.handle], "sent": 0}
    assert receive_all(core, "TargetQ") == []
    with pytest.raises(ConversationEnded):
        core.apply([Send(op.handle, "Req", [b"a", b"b", b"c"], at=0)])  # "c" is new
    assert [m.body for m in got] == [b"a", b"b"]


def _both_ends_gone(core, core_clock, op: Begin, bodies: list[bytes], cleanup: bool = False):
    """Run an ingest's dialog on one broker to its end: sent, taken and ended by the target,
    ended by the initiator (or cleaned up), then purged at both ends."""
    core.apply([op, Send(op.handle, "Req", bodies, at=0)])
    got = [m for m in receive_all(core, "TargetQ") if m.conversation_id == op.conversation_id]
    target = got[0].conversation_handle
    core.apply([End(target)])
    receive_all(core, "InitQ")  # the target's EndDialog
    core.apply([End(op.handle, cleanup=cleanup)])
    if cleanup:  # no EndDialog reached the target, which cleans up too
        core.apply([End(target, cleanup=True)])
    core_clock.advance(Limits().closed_retention_s + 1)
    core.tick()
    assert [e for e in core.endpoints_view() if e["conversation_id"] == op.conversation_id] == []
    return got


INGEST = Begin("Init", "Target", "C", handle="ingest/k3", conversation_id="conv-k3", if_absent=True)


@pytest.mark.parametrize("cleanup", [False, True], ids=["ended", "cleaned-up"])
def test_a_rerun_after_both_ends_went_sends_nothing_again(core, core_clock, cleanup):
    """Initiator and target on one broker, both ends ended and purged (or cleaned up): a re-run
    of the same Begin ... if absent and Send ... AT begins nothing and sends nothing."""
    got = _both_ends_gone(core, core_clock, INGEST, [b"a", b"b"], cleanup)

    again = core.apply([INGEST, Send(INGEST.handle, "Req", [b"a", b"b"], at=0)])

    assert again == {"handles": [INGEST.handle], "sent": 0}
    assert receive_all(core, "TargetQ") == [] and [m.body for m in got] == [b"a", b"b"]
    assert core.endpoints_view() == []  # no dialog begun again


def test_a_rerun_with_rows_never_sent_on_an_ended_dialog_is_refused_and_changes_nothing(
    core, core_clock, snapshot
):
    _both_ends_gone(core, core_clock, INGEST, [b"a", b"b"])
    before = snapshot(core)

    with pytest.raises(ConversationEnded, match="ended after sending 2 messages.*1 it never sent"):
        core.apply([INGEST, Send(INGEST.handle, "Req", [b"a", b"b", b"c"], at=0)])
    with pytest.raises(InvalidArgument, match="not the one this Begin names"):
        core.apply([Begin("Init", "Target", "C", handle=INGEST.handle, conversation_id="other",
                          if_absent=True)])  # fmt: skip

    assert snapshot(core) == before


def test_the_trace_of_a_rerunnable_dialog_survives_a_restart_live_and_ended(
    tmp_path, make_core, core_clock
):
    path = tmp_path / "b.sqlite"
    core = make_core(path)
    live = Begin("Init", "Target", "C", handle="ingest/live", conversation_id="c-live",
                 if_absent=True)  # fmt: skip
    core.apply([live, Send(live.handle, "Req", [b"x"], at=0)])
    _both_ends_gone(core, core_clock, INGEST, [b"a"])
    core.store.close()

    again = make_core(path, catalog=False)  # a restart: the dialog begun if absent, then ends
    receive_all(again, "TargetQ")
    again.apply([Send(live.handle, "Req", [b"y"], at=1), End(live.handle, cleanup=True)])
    assert [m.body for m in receive_all(again, "TargetQ")] == [b"y"]

    for op, bodies in ((live, [b"x", b"y"]), (INGEST, [b"a"])):
        assert again.apply([op, Send(op.handle, "Req", bodies, at=0)])["sent"] == 0
    assert receive_all(again, "TargetQ") == []


def test_once_the_trace_is_pruned_a_rerun_begins_the_dialog_again(make_core, core_clock):
    """What the docs say happens after ended_retention_s (and with it 0: at once)."""
    for limits in (Limits(ended_retention_s=0), Limits(ended_retention_s=120)):
        core = make_core(limits=limits)
        _both_ends_gone(core, core_clock, INGEST, [b"a"])
        core_clock.advance(limits.ended_retention_s + limits.prune_every_s + 1)
        core.tick()

        again = core.apply([INGEST, Send(INGEST.handle, "Req", [b"a"], at=0)])

        assert again["sent"] == 1 and [m.body for m in receive_all(core, "TargetQ")] == [b"a"]


@pytest.mark.parametrize("error", [None, 50001], ids=["end", "end-with-error"])
def test_when_the_initiator_ended_first_its_notice_is_not_counted_as_a_row_sent(
    core, core_clock, error
):
    """END (or END WITH ERROR) on the initiator takes the dialog's next sequence number for its
    EndDialog or Error: a re-run with a row beyond those sent is refused, never skipped, while
    the dialog lingers and once both ends have gone."""
    core.apply([INGEST, Send(INGEST.handle, "Req", [b"a", b"b"], at=0)])
    core.apply([End(INGEST.handle, error, "cancelled" if error else "")])
    three = [INGEST, Send(INGEST.handle, "Req", [b"a", b"b", b"c"], at=0)]
    with pytest.raises(ConversationEnded):
        core.apply(three)  # still there: ended on this side
    got = receive_all(core, "TargetQ")  # two rows, then the notice
    assert [m.body for m in got[:2]] == [b"a", b"b"] and len(got) == 3
    core.apply([End(got[0].conversation_handle)])  # the target ends on the EndDialog or Error
    receive_all(core, "InitQ")
    core_clock.advance(Limits().closed_retention_s + 1)
    core.tick()
    assert core.endpoints_view() == []

    with pytest.raises(ConversationEnded, match="ended after sending 2 messages.*1 it never sent"):
        core.apply(three)
    assert core.apply([INGEST, Send(INGEST.handle, "Req", [b"a", b"b"], at=0)])["sent"] == 0


def test_other_verbs_on_the_handle_of_a_dialog_that_went_say_it_ended(core, core_clock, snapshot):
    """A re-run's Begin answers with the handle of the dialog that ended and went; a plain Send,
    an End or a timer on it is refused as ended (not as a handle never seen), changing nothing."""
    _both_ends_gone(core, core_clock, INGEST, [b"a"])
    before = snapshot(core)
    for op in (Send(INGEST.handle, "Req", [b"more"]), End(INGEST.handle), Timer(INGEST.handle, 5)):
        with pytest.raises(ConversationEnded, match="ended and its endpoint is gone"):
            core.apply([INGEST, op])
    assert snapshot(core) == before


def test_a_plain_begin_on_the_handle_of_a_dialog_that_went_drops_what_was_remembered(
    core, core_clock
):
    _both_ends_gone(core, core_clock, INGEST, [b"a"])
    plain = Begin("Init", "Target", "C", handle=INGEST.handle, conversation_id="plain")
    core.apply([plain, Send(plain.handle, "Req", [b"p"])])  # a new dialog on the same handle
    receive_all(core, "TargetQ")
    core.apply([End(plain.handle, cleanup=True)])

    # what went last on the handle is the plain dialog, of which nothing is remembered
    again = core.apply([INGEST, Send(INGEST.handle, "Req", [b"a"], at=0)])

    assert again["sent"] == 1 and [m.body for m in receive_all(core, "TargetQ")] == [b"a"]


def test_the_rerunnable_view_lists_dialogs_begun_if_absent_live_and_ended_in_handle_order(
    core, core_clock
):
    live = Begin("Init", "Target", "C", handle="ingest/k1", conversation_id="c1", if_absent=True)
    core.apply([live, Send(live.handle, "Req", [b"x"], at=0)])
    core.apply([Begin("Init", "Target", "C", handle="ingest/plain")])  # not begun if absent
    _both_ends_gone(core, core_clock, INGEST, [b"a"])

    rows = core.rerunnable_view()

    assert [r["conversation_handle"] for r in rows] == ["ingest/k1", "ingest/k3"]
    assert rows[0]["ended_at"] is None and rows[1]["ended_at"] == pytest.approx(core_clock())
    assert [r["conversation_handle"] for r in core.rerunnable_view(after="ingest/k1")] == [
        "ingest/k3"
    ]
    assert core.rerunnable_view(limit=1) == rows[:1]
    with pytest.raises(InvalidArgument, match="after must be a conversation handle"):
        core.rerunnable_view(after=3)
