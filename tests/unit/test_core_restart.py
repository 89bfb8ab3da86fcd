"""BrokerCore: a restart (a second BrokerCore on the same store file) keeps what was committed and
rolls back what was not. No Ray."""

from __future__ import annotations

import pytest

from actors.calls.envelope import Begin, End, Send, Timer
from actors.errors import LockNotHeld
from actors.model.catalog import Service


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "broker.db")


def restart(make_core, core, path):
    core.store.close()
    return make_core(path, catalog=False)


def by_handle(core):
    return sorted(core.endpoints_view(), key=lambda e: e["conversation_handle"])


def test_a_restarted_broker_keeps_its_broker_id_and_catalog(make_core, path):
    core = make_core(path)
    broker_id, definitions = core.broker_id, core.definitions()

    again = restart(make_core, core, path)

    assert again.broker_id == broker_id
    assert again.definitions() == definitions
    assert again.queues_view().keys() == core.queues_view().keys()


def test_a_restarted_broker_keeps_endpoints_and_queued_messages(make_core, path, open_dialog):
    core = make_core(path)
    d = open_dialog(core, bodies=[b"a", b"b"])
    core.apply([Send(d.target, "Reply", b"r"), Timer(d.init, 30)])
    endpoints, rows = by_handle(core), {q: core.queue_view(q) for q in ("InitQ", "TargetQ")}

    again = restart(make_core, core, path)

    assert by_handle(again) == endpoints
    assert {q: again.queue_view(q) for q in ("InitQ", "TargetQ")} == rows
    (got,) = again.receive("TargetQ")
    assert [(m.sequence_number, m.body) for m in got.messages] == [(0, b"a"), (1, b"b")]


def test_a_restarted_broker_continues_sequence_numbers_where_they_were(
    make_core, path, open_dialog
):
    core = make_core(path)
    d = open_dialog(core, bodies=[b"a", b"b"])
    (got,) = core.receive("TargetQ")
    core.settle(commit=[got.lock_id])

    again = restart(make_core, core, path)
    again.apply([Send(d.init, "Req", b"c")])

    (got,) = again.receive("TargetQ")
    assert [(m.sequence_number, m.body) for m in got.messages] == [(2, b"c")]


def test_a_restart_rolls_back_an_open_receive_and_its_messages_are_receivable_again(
    make_core, path, open_dialog
):
    core = make_core(path)
    open_dialog(core, bodies=[b"a", b"b"])
    (held,) = core.receive("TargetQ")

    again = restart(make_core, core, path)

    assert [r["status"] for r in again.queue_view("TargetQ")] == ["waiting", "waiting"]
    with pytest.raises(LockNotHeld):
        again.settle(commit=[held.lock_id])
    (got,) = again.receive("TargetQ")
    assert got.group_id == held.group_id
    assert [m.body for m in got.messages] == [b"a", b"b"]


def test_a_restart_keeps_group_state_committed_before_it(make_core, path, open_dialog):
    core = make_core(path)
    d = open_dialog(core)
    (got,) = core.receive("TargetQ")
    core.settle(commit=[got.lock_id], states={got.group_id: b"saved"})

    again = restart(make_core, core, path)
    again.apply([Send(d.init, "Req", b"next")])

    assert again.receive("TargetQ")[0].state == b"saved"


def test_a_timer_set_before_a_restart_fires_after_it(make_core, core_clock, path, open_dialog):
    core = make_core(path)
    d = open_dialog(core)
    core.apply([Timer(d.init, 30)])

    again = restart(make_core, core, path)
    core_clock.advance(30)
    again.tick()

    (got,) = again.receive("InitQ")
    assert [m.message_type for m in got.messages] == ["DialogTimer"]


def test_a_dialog_waiting_for_its_service_before_a_restart_is_delivered_after_it(make_core, path):
    core = make_core(path)
    begin = Begin("Init", "Later", "C")
    core.apply([begin, Send(begin.handle, "Req", [b"a", b"b"])])

    again = restart(make_core, core, path)
    again.apply([Send(begin.handle, "Req", b"c")])
    again.create(Service("Later", "TargetQ", ("C",)))

    (got,) = again.receive("TargetQ")
    assert [(m.sequence_number, m.body) for m in got.messages] == [(0, b"a"), (1, b"b"), (2, b"c")]


def test_a_request_id_applied_before_a_restart_is_not_applied_again_after_it(
    make_core, path, open_dialog
):
    core = make_core(path)
    d = open_dialog(core)
    ops = [Send(d.init, "Req", b"once")]
    core.apply(ops, request_id="r-1")

    again = restart(make_core, core, path)
    again.apply(ops, request_id="r-1")

    assert [r["sequence_number"] for r in again.queue_view("TargetQ")] == [0, 1]


def test_a_group_commit_keeps_each_units_changes_to_one_endpoint_across_a_restart(
    make_core, path, open_dialog
):
    """Units of one group (alone and sharing a unit) change the same endpoints: a timer and an
    end beside sends, and a dialog begun and sent on in the same group. The endpoint rows and
    their sequence numbers, written once at the group's end, come back as they were."""
    core = make_core(path)
    d, e = open_dialog(core), open_dialog(core)
    begun = Begin("Init", "Target", "C")
    with core.uow.group():
        core.apply([Timer(d.init, 30)])  # a setting of d's initiator...
        core.uow.shared(  # ...then its sequence numbers, in a unit shared with another send
            [
                lambda: core.apply([Send(d.init, "Req", [b"1", b"2"])]),
                lambda: core.apply([Send(e.target, "Reply", b"r")]),
            ]
        )
        core.apply([End(e.init)])  # a setting of an endpoint whose numbers changed before
        core.apply([begun, Send(begun.handle, "Req", b"x")])
        core.apply([Send(begun.handle, "Req", b"y"), Timer(begun.handle, 5)])
    endpoints = by_handle(core)

    again = restart(make_core, core, path)

    assert by_handle(again) == endpoints
    sent = {ep["conversation_handle"]: ep["send_sequence"] for ep in endpoints}
    assert (sent[d.init], sent[begun.handle]) == (3, 2)  # hello, 1, 2 / x, y
