"""Activation without Ray: the reader policy, the handler context and outcome, the reader loop
(`read_until_idle`) over a port backed by a real BrokerCore on a :memory: store with the fake
clock, and the activation definition's checks in the catalog."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import json
import math
import sys
from typing import Any

import pytest

from actors.activation import (
    HandlerContext,
    Outcome,
    read_until_idle,
    readers_to_start,
    run_handler,
)
from actors.activation.handlers import count_in_order, discard, slow_count, stamp_first_call
from actors.calls.envelope import Begin, End, ReceivedGroup, Send, Timer
from actors.errors import (
    BrokerError,
    ContractViolation,
    InvalidArgument,
    InvalidDefinition,
    LockNotHeld,
    ReaderRetired,
)
from actors.model.catalog import (
    ROUTER_HANDLER,
    Activation,
    Catalog,
    Queue,
    from_record,
    to_record,
)
from actors.model.code_names import check_code_name, handler_path, import_code, resolve_handler
from actors.model.limits import Limits
from tests.unit import activation_handlers

COUNT = "actors.activation.handlers:count_in_order"
TESTS = ("tests",)  # the code_modules these tests' brokers allow: their handlers are in tests


# --- a reader port over a real BrokerCore ------------------------------------------------------


class CorePort:
    """What the broker actor offers a reader, over a BrokerCore: receive settles the previous
    turn first (a failed settle is marked `during = "settle"`), and an empty receive stands for
    the broker's wait by moving the fake clock on by `wait`."""

    def __init__(self, core, clock, retire_after: int | None = None) -> None:
        self.core = core
        self.clock = clock
        self.retire_after = retire_after  # the broker stops wanting the reader after n receives
        self.receives = 0
        self.idle_waits: list[float] = []
        self.readers: set[str | None] = set()
        self.received: dict[str, list[bytes]] = {}  # lock id -> bodies received under it
        self.settles: list[tuple[list[str], list[str], type | None]] = []

    def _settle(self, commit, rollback, ops, states) -> dict[str, Any]:
        try:
            result = self.core.settle(commit, rollback, ops, states)
        except BrokerError as exc:
            self.settles.append((list(commit), list(rollback), type(exc)))
            raise
        self.settles.append((list(commit), list(rollback), None))
        return result

    async def receive(
        self, queue, *, max_groups, wait, lease, reader, commit, rollback, ops, states
    ) -> list[ReceivedGroup]:
        if commit or rollback:
            try:
                self._settle(commit, rollback, ops, states)
            except BrokerError as exc:
                exc.during = "settle"
                raise
        self.readers.add(reader)
        self.receives += 1
        if self.retire_after is not None and self.receives > self.retire_after:
            raise ReaderRetired(f"reader {reader} of queue {queue!r} is no longer wanted")
        groups = self.core.receive(queue, max_groups=max_groups, lease_s=lease)
        for g in groups:
            self.received[g.lock_id] = [m.body for m in g.messages]
        if not groups:
            self.clock.advance(wait)
            self.idle_waits.append(wait)
        return groups

    async def settle(self, *, commit, rollback, ops, states) -> dict[str, Any]:
        return self._settle(commit, rollback, ops, states)


def read(port: CorePort, queue: str, act: Activation, handler, reader_id: str = "r1"):
    return asyncio.run(read_until_idle(port, queue, act, handler, port.clock, reader_id))


def state_of(core, group_id: str) -> dict | None:
    (g,) = [g for g in core.groups_view() if g["conversation_group_id"] == group_id]
    return json.loads(g["state"]) if g["state"] is not None else None


def target_group(core, handle: str) -> str:
    (ep,) = [e for e in core.endpoints_view() if e["conversation_handle"] == handle]
    return ep["conversation_group_id"]


def rows(core, queue: str) -> list[tuple[str, str]]:
    return [(r["message_type"], r["status"]) for r in core.queue_view(queue)]


def received_bodies(core, queue: str) -> list[bytes]:
    """Take (and commit) everything on `queue`; the bodies in queue order."""
    out = []
    while groups := core.receive(queue):
        (g,) = groups
        out += [m.body for m in g.messages]
        core.settle(commit=[g.lock_id])
    return out


def make_group(gid: str, bodies: list[bytes], state: bytes | None = None) -> ReceivedGroup:
    """A received group as the broker hands it out: one conversation "h-<gid>"."""
    eps = {1: (f"h-{gid}", f"c-{gid}", "Target", "Init", "C")}
    return ReceivedGroup(gid, f"lock-{gid}", state, eps, [(1, 1, 0, "Req", list(bodies), 1.0, 2.0)])


# --- readers_to_start --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("depth", "last_depth", "running", "max_readers", "drained_per_s", "expected"),
    [
        pytest.param(1, 0, 0, 4, 0.0, 1, id="messages wait and no reader runs: start one"),
        pytest.param(50, 50, 0, 4, 100.0, 1, id="no reader runs, backlog small: still one"),
        pytest.param(10, 3, 1, 4, 100.0, 1, id="queue grows under a reader: one more"),
        pytest.param(10, 3, 3, 4, 100.0, 1, id="queue grows, one below the maximum: one more"),
        pytest.param(10, 3, 4, 4, 0.0, 0, id="queue grows at the maximum: none"),
        pytest.param(10, 3, 6, 4, 0.0, 0, id="more running than the maximum: none"),
        pytest.param(10, 10, 1, 4, 10.0, 0, id="steady, drains within the target: none"),
        pytest.param(20, 20, 1, 4, 10.0, 0, id="steady, drains in exactly the target: none"),
        pytest.param(21, 21, 1, 4, 10.0, 1, id="steady, drains slower than the target: one"),
        pytest.param(5, 10, 2, 4, 10.0, 0, id="shrinking fast enough: none"),
        pytest.param(50, 60, 2, 4, 10.0, 1, id="shrinking too slowly: one more"),
        pytest.param(10, 10, 1, 4, 0.0, 1, id="nothing drained yet: one more"),
        pytest.param(0, 0, 0, 4, 0.0, 0, id="empty queue, no reader: none"),
        pytest.param(0, 5, 2, 4, 0.0, 0, id="queue drained: none"),
        pytest.param(3, 0, 0, 1, 0.0, 1, id="max_readers 1, none running: one"),
        pytest.param(9, 3, 1, 1, 0.0, 0, id="max_readers 1, one running: none"),
    ],
)
def test_readers_to_start_follows_the_policy_table(
    depth, last_depth, running, max_readers, drained_per_s, expected
):
    assert readers_to_start(depth, last_depth, running, max_readers, drained_per_s) == expected


def test_readers_to_start_without_a_drain_rate_grows_while_messages_wait():
    assert readers_to_start(10, 10, 1, 4) == 1
    assert readers_to_start(10, 10, 4, 4) == 0
    assert readers_to_start(0, 10, 1, 4) == 0


# --- HandlerContext -------------------------------------------------------------------------------


def test_handler_context_collects_send_send_many_end_begin_and_timer_as_ops_in_call_order():
    ctx = HandlerContext(make_group("g", [b"x"]))

    ctx.send("h1", "Reply", b"one")
    ctx.send(["h1", "h2"], "Reply")
    ctx.send_many("h1", "Reply", [b"a", b"b"])
    ctx.end("h1")
    ctx.end("h2", error=7, description="bad order")
    ctx.end("h3", cleanup=True)
    new = ctx.begin("Target", "Retain", "C", related_conversation="h1", lifetime=60.0)
    ctx.timer(new, 2.5)

    begin = ctx.ops[6]
    assert ctx.ops == [
        Send("h1", "Reply", b"one"),
        Send(("h1", "h2"), "Reply", b""),
        Send("h1", "Reply", [b"a", b"b"]),
        End("h1", None, "", False),
        End("h2", 7, "bad order", False),
        End("h3", None, "", True),
        Begin("Target", "Retain", "C", new, None, "h1", None, 60.0),
        Timer(new, 2.5),
    ]
    assert isinstance(begin, Begin) and begin.handle == new


def test_each_begin_in_a_handler_gets_its_own_fresh_handle():
    ctx = HandlerContext(make_group("g", [b"x"]))

    handles = {ctx.begin("Target", "Retain", "C") for _ in range(3)}

    assert len(handles) == 3 and all(handles)


def test_handler_context_state_is_the_committed_state_until_set_and_set_state_marks_a_change():
    ctx = HandlerContext(make_group("g", [b"x"], state=b"before"))
    assert (ctx.state, ctx.state_changed, ctx.ops) == (b"before", False, [])

    ctx.set_state(b"after")
    assert (ctx.state, ctx.state_changed) == (b"after", True)

    ctx.set_state(None)
    assert (ctx.state, ctx.state_changed) == (None, True)


# --- Outcome --------------------------------------------------------------------------------------


def test_an_outcome_is_true_only_when_it_commits_or_rolls_back_something():
    assert not Outcome()
    assert not Outcome(ops=[Send("h", "Reply", b"")], states={"g": b"s"}, handled=3)
    assert Outcome(commit=["l1"])
    assert Outcome(rollback=["l1"])


def test_settle_args_are_the_commit_rollback_ops_and_states_to_settle_in_one_call():
    ops = [Send("h", "Reply", b"r")]
    out = Outcome(commit=["l1"], rollback=["l2"], ops=ops, states={"g1": b"s"})

    assert out.settle_args() == {
        "commit": ["l1"],
        "rollback": ["l2"],
        "ops": ops,
        "states": {"g1": b"s"},
    }


def test_one_by_one_settles_each_committed_group_with_its_own_ops_and_state_then_the_rollbacks():
    ops1, ops3 = [Send("h1", "Reply", b"1")], [End("h3")]
    out = Outcome(
        commit=["l1", "l3"],
        rollback=["l2", "l4"],
        ops=ops1 + ops3,
        states={"g1": b"s1"},
        per_group={"l1": (ops1, {"g1": b"s1"}), "l3": (ops3, {})},
    )

    assert out.one_by_one() == [
        {"commit": ["l1"], "rollback": [], "ops": ops1, "states": {"g1": b"s1"}},
        {"commit": ["l3"], "rollback": [], "ops": ops3, "states": {}},
        {"commit": [], "rollback": ["l2", "l4"], "ops": [], "states": {}},
    ]


def test_one_by_one_without_rollbacks_has_no_rollback_settle():
    out = Outcome(commit=["l1"], per_group={"l1": ([], {})})

    assert out.one_by_one() == [{"commit": ["l1"], "rollback": [], "ops": [], "states": {}}]


# --- run_handler ----------------------------------------------------------------------------------


def reply_unless_boom(group: ReceivedGroup, ctx: HandlerContext) -> None:
    for m in group.messages:
        ctx.send(m.conversation_handle, "Reply", b"re:" + m.body)
    ctx.set_state(b"seen %d" % len(group))
    if any(m.body == b"boom" for m in group.messages):
        raise RuntimeError("boom")


def test_run_handler_commits_good_groups_with_their_ops_and_states_and_rolls_back_failing_ones():
    g1 = make_group("g1", [b"a", b"b"])
    g2 = make_group("g2", [b"x", b"boom"])
    g3 = make_group("g3", [b"c"])

    out = run_handler(reply_unless_boom, [g1, g2, g3])

    ops1 = [Send("h-g1", "Reply", b"re:a"), Send("h-g1", "Reply", b"re:b")]
    ops3 = [Send("h-g3", "Reply", b"re:c")]
    assert out.commit == ["lock-g1", "lock-g3"]
    assert out.rollback == ["lock-g2"]
    assert out.ops == ops1 + ops3
    assert out.states == {"g1": b"seen 2", "g3": b"seen 1"}
    assert out.per_group == {
        "lock-g1": (ops1, {"g1": b"seen 2"}),
        "lock-g3": (ops3, {"g3": b"seen 1"}),
    }
    assert (out.handled, out.failed) == (3, 1)


def test_run_handler_leaves_state_out_when_the_handler_does_not_set_it():
    out = run_handler(discard, [make_group("g1", [b"a"], state=b"kept")])

    assert (out.commit, out.rollback, out.ops, out.states) == (["lock-g1"], [], [], {})
    assert out.per_group == {"lock-g1": ([], {})}
    assert out.handled == 1


def test_run_handler_sends_a_state_cleared_to_none_with_the_commit():
    def clear(group, ctx):
        ctx.set_state(None)

    out = run_handler(clear, [make_group("g1", [b"a"], state=b"old")])

    assert out.states == {"g1": None}


def test_run_handler_with_a_handler_that_always_raises_rolls_back_every_group():
    groups = [make_group("g1", [b"a"]), make_group("g2", [b"b", b"c"])]

    out = run_handler(activation_handlers.always_fail, groups)

    assert (out.commit, out.rollback) == ([], ["lock-g1", "lock-g2"])
    assert (out.ops, out.states, out.per_group) == ([], {}, {})
    assert (out.handled, out.failed) == (0, 2)


def test_the_benchmark_handlers_run_on_a_group():
    g = make_group("g1", [b"a", b"b"])

    counted = run_handler(count_in_order, [g])
    slow = run_handler(slow_count, [g])
    stamped = run_handler(stamp_first_call, [g])
    already = run_handler(stamp_first_call, [make_group("g2", [b"a"], state=b"1.0")])

    expected = {"count": 2, "last": {"h-g1": 1}, "bad": 0}
    assert json.loads(counted.states["g1"]) == expected
    assert json.loads(slow.states["g1"]) == expected
    assert float(stamped.states["g1"]) > 0
    assert already.states == {}


# --- handler output commits with the receive, atomically ---------------------------------------


def test_handler_sends_end_begin_and_state_show_only_after_the_commit_and_then_all_together(
    core, open_dialog, snapshot
):
    d = open_dialog(core, bodies=[b"a", b"b"])
    groups = core.receive("TargetQ")
    before = snapshot(core)

    out = run_handler(activation_handlers.reply_end_and_forward, groups)
    assert snapshot(core) == before  # the handler itself changes nothing

    core.settle(**out.settle_args())

    assert rows(core, "TargetQ") == []
    assert rows(core, "InitQ") == [
        ("Reply", "waiting"),
        ("Reply", "waiting"),
        ("EndDialog", "waiting"),
    ]
    assert rows(core, "RetainQ") == [("Req", "waiting"), ("Req", "waiting")]
    states = {(e["service"], e["far_service"], e["state"]) for e in core.endpoints_view()}
    assert states == {
        ("Init", "Target", "DISCONNECTED_INBOUND"),
        ("Target", "Init", "DISCONNECTED_OUTBOUND"),
        ("Target", "Retain", "CONVERSING"),
        ("Retain", "Target", "CONVERSING"),
    }
    assert state_of(core, target_group(core, d.target))["count"] == 2
    assert received_bodies(core, "RetainQ") == [b"fwd:a", b"fwd:b"]


def test_a_refused_handler_output_applies_none_of_it_and_keeps_the_lock(
    core, open_dialog, snapshot
):
    open_dialog(core, bodies=[b"ok", b"bad"])
    (g,) = core.receive("TargetQ")
    out = run_handler(activation_handlers.reply_or_misbehave, [g])
    before = snapshot(core)

    with pytest.raises(ContractViolation):
        core.settle(**out.settle_args())

    assert snapshot(core) == before
    assert [x["locked_by"] for x in core.groups_view("TargetQ")] == [g.lock_id]


# --- read_until_idle ------------------------------------------------------------------------------


def test_a_reader_handles_everything_then_stops_idle_exactly_idle_timeout_after_the_last_batch(
    core, core_clock, open_dialog
):
    d1 = open_dialog(core, bodies=[b"a", b"b"])
    d2 = open_dialog(core, bodies=[b"c"])
    act = Activation(COUNT, idle_timeout=2.5)
    handled_at = []

    def handler(group, ctx):
        handled_at.append(core_clock())
        count_in_order(group, ctx)

    port = CorePort(core, core_clock)
    stats = read(port, "TargetQ", act, handler, reader_id="reader-7")

    assert stats.reason == "idle"
    assert core_clock() - handled_at[-1] == 2.5
    assert port.idle_waits == [1.0, 1.0, 0.5]
    assert port.readers == {"reader-7"}
    assert core.queues_view()["TargetQ"]["depth"] == 0
    assert core.queues_view()["TargetQ"]["locked_groups"] == 0
    assert state_of(core, target_group(core, d1.target))["count"] == 2
    assert state_of(core, target_group(core, d2.target))["count"] == 1


def test_a_reader_on_an_empty_queue_stops_idle_after_idle_timeout_without_calling_the_handler(
    core, core_clock
):
    calls = []
    start = core_clock()
    port = CorePort(core, core_clock)

    stats = read(port, "TargetQ", Activation(COUNT, idle_timeout=3), lambda g, c: calls.append(g))

    assert (stats.reason, stats.turns, stats.handled, stats.failed) == ("idle", 3, 0, 0)
    assert core_clock() - start == 3
    assert calls == [] and port.settles == []


def test_reader_stats_count_turns_and_every_handled_message(core, core_clock, open_dialog):
    for bodies in ([b"a", b"b"], [b"c"], [b"d", b"e", b"f"]):
        open_dialog(core, bodies=bodies)
    act = Activation(COUNT, max_groups=1, idle_timeout=2)

    stats = read(CorePort(core, core_clock), "TargetQ", act, count_in_order)

    assert (stats.reason, stats.handled, stats.failed) == ("idle", 6, 0)
    assert stats.turns == 3 + 2  # one per group, then two empty ones until idle


def test_a_reader_takes_up_to_max_groups_per_receive_and_commits_them_with_the_next(
    core, core_clock, open_dialog
):
    for body in (b"a", b"b", b"c", b"d", b"e"):
        open_dialog(core, bodies=[body])
    port = CorePort(core, core_clock)

    stats = read(port, "TargetQ", Activation(COUNT, max_groups=2, idle_timeout=1), count_in_order)

    assert [len(commit) for commit, _, _ in port.settles] == [2, 2, 1]
    assert all(rollback == [] and err is None for _, rollback, err in port.settles)
    assert (stats.handled, stats.turns) == (5, 4)


def test_a_reader_handler_output_commits_with_the_next_receive(core, core_clock, open_dialog):
    d = open_dialog(core, bodies=[b"a"])
    handler = resolve_handler("tests.unit.activation_handlers:reply_end_and_forward", TESTS)

    stats = read(CorePort(core, core_clock), "TargetQ", Activation(COUNT, idle_timeout=1), handler)

    assert stats.reason == "idle"
    assert received_bodies(core, "InitQ") == [b"re:a", b""]  # the Reply, then EndDialog
    assert received_bodies(core, "RetainQ") == [b"fwd:a"]
    assert state_of(core, target_group(core, d.target))["count"] == 1
    ends = [e for e in core.endpoints_view() if e["conversation_handle"] == d.target]
    assert ends[0]["state"] == "DISCONNECTED_OUTBOUND"


def test_a_handler_that_always_raises_poisons_the_queue_and_the_reader_stops_queue_disabled(
    core, core_clock, open_dialog
):
    d = open_dialog(core, to="Poison", bodies=[b"a", b"b"])
    act = Activation("tests.unit.activation_handlers:always_fail", idle_timeout=30)
    port = CorePort(core, core_clock)

    stats = read(port, "PoisonQ", act, resolve_handler(act.handler, TESTS))

    assert stats.reason == "QueueDisabled"
    assert (stats.handled, stats.failed, stats.turns) == (0, 3, 3)
    view = core.queues_view()["PoisonQ"]
    assert (view["enabled"], view["rollbacks_in_a_row"], view["depth"]) == (False, 3, 2)
    assert rows(core, "PoisonQ") == [("Req", "waiting"), ("Req", "waiting")]
    assert rows(core, "InitQ") == []  # the handler's sends never committed
    assert state_of(core, target_group(core, d.target)) is None
    assert [e["kind"] for e in core.events_view() if e["subject"] == "PoisonQ"] == ["QueueDisabled"]
    assert [(len(c), len(r), err) for c, r, err in port.settles] == [(0, 1, None)] * 3


def test_a_group_whose_output_is_refused_rolls_back_while_the_others_of_its_turn_commit(
    core, core_clock, open_dialog
):
    d1 = open_dialog(core, bodies=[b"one"])
    d2 = open_dialog(core, bodies=[b"bad"])
    d3 = open_dialog(core, bodies=[b"three"])
    act = Activation("tests.unit.activation_handlers:reply_or_misbehave", idle_timeout=30)
    port = CorePort(core, core_clock)

    stats = read(port, "TargetQ", act, resolve_handler(act.handler, TESTS))

    # first turn: the joint settle is refused, then group by group
    first, lock_of = port.settles[0], {}
    for lock, bodies in port.received.items():  # the first lock each body was received under
        lock_of.setdefault(bodies[0], lock)
    assert first == ([lock_of[b"one"], lock_of[b"bad"], lock_of[b"three"]], [], ContractViolation)
    assert port.settles[1:5] == [
        ([lock_of[b"one"]], [], None),
        ([lock_of[b"bad"]], [], ContractViolation),
        ([], [lock_of[b"bad"]], None),
        ([lock_of[b"three"]], [], None),
    ]
    # the good groups' replies and states committed once; the bad one kept coming back
    assert received_bodies(core, "InitQ") == [b"re:one", b"re:three"]
    assert state_of(core, target_group(core, d1.target))["count"] == 1
    assert state_of(core, target_group(core, d3.target))["count"] == 1
    assert state_of(core, target_group(core, d2.target)) is None
    assert stats.reason == "QueueDisabled" and stats.failed == 0
    view = core.queues_view()["TargetQ"]
    assert (view["enabled"], view["depth"], view["locked_groups"]) == (False, 1, 0)


def test_a_settle_refused_for_an_expired_lease_drops_the_outcome_and_the_messages_count_once(
    core, core_clock, open_dialog
):
    d = open_dialog(core, bodies=[b"a", b"b", b"c"])
    act = Activation(COUNT, lease=2, idle_timeout=10)
    calls = []

    def handler(group, ctx):
        calls.append(group.lock_id)
        if len(calls) == 1:  # the first call runs past its lease; the broker's clock ticks
            core_clock.advance(act.lease + 1)
            core.tick()
        count_in_order(group, ctx)

    port = CorePort(core, core_clock)
    stats = read(port, "TargetQ", act, handler)

    assert len(calls) == 2 and calls[0] != calls[1]
    assert port.settles[0] == ([calls[0]], [], LockNotHeld)
    assert port.settles[1] == ([calls[1]], [], None)
    assert state_of(core, target_group(core, d.target)) == {
        "count": 3,
        "last": {d.target: 2},
        "bad": 0,
    }
    assert stats.reason == "idle"
    view = core.queues_view()["TargetQ"]
    assert (view["depth"], view["locked_groups"], view["rollbacks_in_a_row"]) == (0, 0, 0)


def test_a_counting_reader_over_many_dialogs_keeps_each_conversation_in_order(
    core, core_clock, open_dialog
):
    dialogs = [open_dialog(core, bodies=[b"%d-0" % i, b"%d-1" % i]) for i in range(4)]
    sent = {d.target: 2 for d in dialogs}
    calls = []

    def handler(group, ctx):
        calls.append(group.group_id)
        if len(calls) <= 6:  # more arrives on every dialog while groups are locked
            for i, d in enumerate(dialogs):
                n = sent[d.target]
                core.apply([Send(d.init, "Req", [b"%d-%d" % (i, n), b"%d-%d" % (i, n + 1)])])
                sent[d.target] = n + 2
        count_in_order(group, ctx)

    act = Activation(COUNT, max_groups=2, idle_timeout=2)
    stats = read(CorePort(core, core_clock), "TargetQ", act, handler)

    assert stats.reason == "idle"
    assert stats.handled == sum(sent.values())
    for d in dialogs:
        state = state_of(core, target_group(core, d.target))
        assert state == {"count": sent[d.target], "last": {d.target: sent[d.target] - 1}, "bad": 0}
    assert core.queues_view()["TargetQ"]["depth"] == 0


def test_a_counting_reader_keeps_order_across_dialogs_sharing_one_group(
    core, core_clock, open_dialog
):
    first = open_dialog(core, bodies=[b"a0"])
    group = target_group(core, first.target)
    begins = [Begin("Target", "Retain", "C", related_group=group) for _ in range(3)]
    core.apply([op for b in begins for op in (b, Send(b.handle, "Req", b"q"))])
    answering = [
        e["conversation_handle"] for e in core.endpoints_view() if e["service"] == "Retain"
    ]
    for n in range(2):  # the answers land in `group` on TargetQ, between more of `first`
        core.apply([Send(h, "Reply", b"r%d" % n) for h in answering])
        core.apply([Send(first.init, "Req", b"a%d" % (n + 1))])
    act = Activation(COUNT, max_groups=1, idle_timeout=1)

    stats = read(CorePort(core, core_clock), "TargetQ", act, count_in_order)

    assert stats.handled == 3 + 3 * 2
    last = {first.target: 2} | {b.handle: 1 for b in begins}
    assert state_of(core, group) == {"count": 9, "last": last, "bad": 0}


def test_a_reader_that_the_broker_retires_settles_its_last_turn_and_stops_reader_retired(
    core, core_clock, open_dialog
):
    d = open_dialog(core, bodies=[b"a", b"b"])
    port = CorePort(core, core_clock, retire_after=1)

    stats = read(port, "TargetQ", Activation(COUNT), count_in_order)

    assert (stats.reason, stats.handled, stats.turns) == ("ReaderRetired", 2, 1)
    assert [err for _, _, err in port.settles] == [None]
    assert state_of(core, target_group(core, d.target))["count"] == 2
    assert core.queues_view()["TargetQ"]["depth"] == 0


def test_a_reader_of_a_disabled_queue_stops_queue_disabled_at_once(core, core_clock, open_dialog):
    open_dialog(core, bodies=[b"a"])
    core.alter("queue", "TargetQ", {"enabled": False})
    calls = []

    stats = read(
        CorePort(core, core_clock), "TargetQ", Activation(COUNT), lambda g, c: calls.append(1)
    )

    assert (stats.reason, stats.turns, calls) == ("QueueDisabled", 0, [])


def test_a_reader_of_an_unknown_queue_stops_unknown_queue(core, core_clock):
    stats = read(CorePort(core, core_clock), "NoSuchQ", Activation(COUNT), count_in_order)

    assert (stats.reason, stats.turns) == ("UnknownQueue", 0)


def test_a_reader_raises_a_receive_error_it_cannot_stop_on(core, core_clock):
    act = Activation(COUNT, max_groups=0)  # never checked: the receive refuses it

    with pytest.raises(InvalidArgument):
        read(CorePort(core, core_clock), "TargetQ", act, count_in_order)


def test_a_reader_whose_handler_outlasts_idle_timeout_receives_again_before_it_stops(
    core, core_clock, open_dialog
):
    open_dialog(core, bodies=[b"a"])
    open_dialog(core, bodies=[b"b"])
    act = Activation(COUNT, max_groups=1, idle_timeout=5)

    def slow(group, ctx):
        core_clock.advance(6)  # longer than idle_timeout, well inside the lease
        count_in_order(group, ctx)

    stats = read(CorePort(core, core_clock), "TargetQ", act, slow)

    assert (stats.reason, stats.handled) == ("idle", 2)
    assert core.queues_view()["TargetQ"]["depth"] == 0


# --- the Activation definition ----------------------------------------------------------------


def test_an_activation_given_a_module_level_function_keeps_its_import_path():
    act = Activation(count_in_order)

    assert act.handler == COUNT
    assert resolve_handler(act.handler, ()) is count_in_order
    assert handler_path(activation_handlers.always_fail) == (
        "tests.unit.activation_handlers:always_fail"
    )


def test_a_handler_named_by_its_module_before_the_move_still_resolves():
    # a queue an earlier release stored names the sample handlers' old module
    assert resolve_handler("actors.handlers:count_in_order", ()) is count_in_order
    with pytest.raises(InvalidDefinition, match="does not import"):
        resolve_handler("actors.handlers:no_such_handler", ())


def test_an_activation_has_the_documented_defaults():
    act = Activation(COUNT)

    assert (act.max_readers, act.idle_timeout, act.placement, act.enabled) == (1, 5.0, "pool", True)
    assert (act.max_groups, act.lease) == (8, 30.0)


def _nested():
    def inner(group, ctx):
        pass

    return inner


@pytest.mark.parametrize(
    "fn",
    [
        pytest.param(lambda group, ctx: None, id="lambda"),
        pytest.param(_nested(), id="nested function"),
    ],
)
def test_an_activation_refuses_a_handler_that_is_not_importable_by_name(fn):
    with pytest.raises(InvalidDefinition):
        Activation(fn)


def test_handler_path_refuses_a_function_defined_in_main():
    def fn(group, ctx):
        pass

    fn.__module__, fn.__qualname__ = "__main__", "fn"

    with pytest.raises(InvalidDefinition):
        handler_path(fn)


def test_an_activation_refuses_a_bound_method_handler():
    with pytest.raises(InvalidDefinition):
        Activation(activation_handlers.Counter().handle)


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("actors.activation.handlers", id="no colon"),
        pytest.param("actors:handlers:discard", id="two colons"),
        pytest.param(42, id="not a string"),
        pytest.param("tests.no_such_module_xyz:handler", id="module does not import"),
        pytest.param("actors.activation.handlers:no_such_handler", id="no such function"),
        pytest.param("actors.activation.handlers:", id="empty function name"),
        pytest.param("tests.unit.activation_handlers:NOT_A_FUNCTION", id="not callable"),
    ],
)
def test_resolve_handler_refuses_a_path_that_does_not_give_a_callable(path):
    with pytest.raises(InvalidDefinition):
        resolve_handler(path, TESTS)


def test_resolve_handler_follows_dotted_attributes():
    assert resolve_handler("tests.unit.activation_handlers:Counter.handle", TESTS) is (
        activation_handlers.Counter.handle
    )


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        ("os:system", ()),
        ("subprocess:run", ("tests",)),
        ("tests.unit.activation_handlers:always_fail", ()),  # not allowed by default
        ("tests.unit.activation_handlers:always_fail", ("tests.unit.activation",)),  # a prefix
        ("actors.tools.cli:main", ()),  # the package's own, but not a handler module
        ("testsuite.x:f", ("tests",)),  # a name that only starts like an allowed one
    ],
)
def test_code_is_named_only_in_modules_the_broker_allows_and_checking_imports_nothing(
    path, allowed
):
    with pytest.raises(InvalidDefinition, match="which this broker does not allow"):
        check_code_name(path, allowed)
    with pytest.raises(InvalidDefinition, match="which this broker does not allow"):
        resolve_handler(path, allowed)
    assert check_code_name("tests.unit.activation_handlers:always_fail", ["tests"]) == (
        "tests.unit.activation_handlers"
    )
    # a queue (or a router's classifier in its options) naming it is refused; a file that only
    # names an allowed module is not imported while it is checked
    with pytest.raises(InvalidDefinition, match="does not allow"):
        Catalog(allowed).check_valid(Queue("Q", activation=Activation(path)))
    router = Activation(ROUTER_HANDLER, options={"classifier": path})
    with pytest.raises(InvalidDefinition, match="does not allow"):
        Catalog(allowed).check_valid(Queue("R", activation=router))
    unimported = Activation("tests.never_imported_xyz:f")
    Catalog(["tests"], import_code=False).check_valid(Queue("Q", activation=unimported))
    assert "tests.never_imported_xyz" not in sys.modules


def test_code_is_imported_once_per_path_and_a_failure_is_not_remembered(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    path = "late_classifier_mod:pick"
    with pytest.raises(InvalidDefinition, match="does not import"):
        import_code(path)
    module = tmp_path / "late_classifier_mod.py"
    module.write_text("def pick(*args):\n    return 'X'\n")
    importlib.invalidate_caches()
    try:
        first = import_code(path)  # installed since: found now
        assert first(b"", "T", {}) == "X"
        module.unlink()  # gone, and unloaded: only a path resolved once still answers
        sys.modules.pop("late_classifier_mod", None)
        importlib.invalidate_caches()
        assert import_code(path) is first
    finally:
        sys.modules.pop("late_classifier_mod", None)
        import_code.cache_clear()


def test_a_brokers_code_modules_are_module_names():
    assert Limits.of({"code_modules": ["tests", "my.pkg"]}).code_modules == ("tests", "my.pkg")
    for bad in ("tests", ["no spaces"], [3], ["a..b"]):
        with pytest.raises(InvalidArgument, match="code_modules"):
            Limits.of({"code_modules": bad})


def checked(**fields) -> Queue:
    """A queue with this activation, through Catalog.check_valid (raises if refused)."""
    q = Queue("ActQ", activation=Activation(**{"handler": COUNT, **fields}))
    Catalog(TESTS).check_valid(q)
    return q


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({}, id="defaults"),
        pytest.param({"placement": "internal"}, id="internal placement"),
        pytest.param({"placement": "pool", "max_readers": 16}, id="pool of 16"),
        pytest.param({"idle_timeout": 1, "lease": 0.5}, id="int and small float times"),
        pytest.param({"enabled": False, "max_groups": 1}, id="disabled, one group per receive"),
        pytest.param({"handler": "tests.unit.activation_handlers:Counter.handle"}, id="dotted"),
    ],
)
def test_check_valid_accepts_a_queue_with_a_sound_activation(fields):
    checked(**fields)


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"handler": "tests.no_such_module_xyz:f"}, id="handler does not import"),
        pytest.param({"handler": "os:system"}, id="handler in a module not allowed"),
        pytest.param({"handler": "actors.activation.handlers:missing"}, id="handler missing"),
        pytest.param(
            {"handler": "tests.unit.activation_handlers:NOT_A_FUNCTION"}, id="not callable"
        ),
        pytest.param({"handler": "actors.activation.handlers"}, id="handler without colon"),
        pytest.param({"max_readers": 0}, id="max_readers 0"),
        pytest.param({"max_readers": -1}, id="max_readers negative"),
        pytest.param({"max_readers": 2.0}, id="max_readers float"),
        pytest.param({"max_readers": True}, id="max_readers bool"),
        pytest.param({"max_groups": 0}, id="max_groups 0"),
        pytest.param({"placement": "cluster"}, id="unknown placement"),
        pytest.param({"placement": None}, id="placement None"),
        pytest.param({"idle_timeout": 0}, id="idle_timeout 0"),
        pytest.param({"idle_timeout": -1.5}, id="idle_timeout negative"),
        pytest.param({"idle_timeout": "5"}, id="idle_timeout string"),
        pytest.param({"lease": 0}, id="lease 0"),
        pytest.param({"lease": -30.0}, id="lease negative"),
        pytest.param({"lease": True}, id="lease bool"),
        pytest.param({"enabled": "yes"}, id="enabled not bool"),
    ],
)
def test_check_valid_refuses_a_queue_with_a_bad_activation(fields):
    with pytest.raises(InvalidDefinition):
        checked(**fields)


@pytest.mark.parametrize("name", ["idle_timeout", "lease"])
def test_check_valid_refuses_nan_activation_times(name):
    with pytest.raises(InvalidDefinition):
        checked(**{name: math.nan})


def test_check_valid_refuses_an_activation_that_is_not_an_activation():
    q = Queue("ActQ", activation={"handler": COUNT})

    with pytest.raises(InvalidDefinition):
        Catalog().check_valid(q)


def test_creating_a_queue_with_a_bad_activation_changes_nothing(core, snapshot):
    before = snapshot(core)

    with pytest.raises(InvalidDefinition):
        core.create(Queue("ActQ", activation=Activation("no_such_module_xyz:f")))

    assert snapshot(core) == before
    assert "ActQ" not in core.catalog.queues


def catalog_with(queue: Queue) -> Catalog:
    cat = Catalog()
    cat.check_new(queue)
    cat.add(queue)
    return cat


def test_check_alter_merges_an_activation_dict_into_the_existing_activation():
    old = Activation(COUNT, max_readers=1, idle_timeout=9)
    cat = catalog_with(Queue("ActQ", activation=old))

    new = cat.check_alter(
        "queue", "ActQ", {"activation": {"max_readers": 4, "placement": "internal"}}
    )

    assert new == Queue(
        "ActQ", activation=dataclasses.replace(old, max_readers=4, placement="internal")
    )
    assert new.activation.idle_timeout == 9
    assert cat.queue("ActQ").activation == old  # a check changes nothing


def test_check_alter_with_an_activation_dict_defines_one_on_a_queue_without():
    cat = catalog_with(Queue("ActQ", poison_limit=2))

    new = cat.check_alter(
        "queue",
        "ActQ",
        {"activation": {"handler": "actors.activation.handlers:discard", "max_readers": 3}},
    )

    assert new == Queue(
        "ActQ",
        poison_limit=2,
        activation=Activation("actors.activation.handlers:discard", max_readers=3),
    )


def test_check_alter_takes_a_function_as_the_handler_in_an_activation_dict():
    cat = catalog_with(Queue("ActQ", activation=Activation(COUNT)))

    new = cat.check_alter("queue", "ActQ", {"activation": {"handler": discard}})

    assert new.activation == Activation("actors.activation.handlers:discard")


def test_check_alter_with_activation_none_removes_it():
    cat = catalog_with(Queue("ActQ", activation=Activation(COUNT)))

    assert cat.check_alter("queue", "ActQ", {"activation": None}).activation is None


@pytest.mark.parametrize(
    ("existing", "change"),
    [
        pytest.param(None, {"max_readers": 2}, id="new activation without a handler"),
        pytest.param(Activation(COUNT), {"readers": 2}, id="unknown field"),
        pytest.param(None, {"handler": COUNT, "speed": 1}, id="unknown field on a new one"),
        pytest.param(Activation(COUNT), {"max_readers": 0}, id="merged max_readers 0"),
        pytest.param(Activation(COUNT), {"lease": -1}, id="merged negative lease"),
        pytest.param(Activation(COUNT), {"placement": "gpu"}, id="merged bad placement"),
        pytest.param(Activation(COUNT), {"handler": "no_such_module_xyz:f"}, id="bad handler"),
    ],
)
def test_check_alter_refuses_an_activation_dict_that_gives_a_bad_activation(existing, change):
    cat = catalog_with(Queue("ActQ", activation=existing))

    with pytest.raises(InvalidDefinition):
        cat.check_alter("queue", "ActQ", {"activation": change})

    assert cat.queue("ActQ").activation == existing


def test_a_queue_with_activation_round_trips_through_its_record():
    q = Queue(
        "ActQ",
        retention=True,
        activation=Activation(
            COUNT, max_readers=3, idle_timeout=2.5, placement="internal", lease=9
        ),
    )

    rec = to_record(q)

    assert rec["activation"] == {
        "handler": COUNT,
        "max_readers": 3,
        "idle_timeout": 2.5,
        "placement": "internal",
        "enabled": True,
        "max_groups": 8,
        "lease": 9,
        "options": None,
    }
    assert from_record("queue", json.loads(json.dumps(rec))) == q
    assert from_record("queue", to_record(Queue("Plain"))) == Queue("Plain")


def test_from_record_refuses_an_activation_record_with_unknown_fields():
    rec = to_record(Queue("ActQ", activation=Activation(COUNT)))
    rec["activation"]["speed"] = 3

    with pytest.raises(InvalidDefinition):
        from_record("queue", rec)


def test_a_queue_activation_and_its_alteration_survive_a_broker_restart(make_core, tmp_path):
    path = tmp_path / "broker.db"
    core = make_core(path)
    core.create(Queue("ActQ", activation=Activation(COUNT, max_readers=2)))
    core.alter("queue", "ActQ", {"activation": {"placement": "internal", "idle_timeout": 7}})

    core.store.close()  # a restart: the old broker is gone before the new one opens the file
    reopened = make_core(path, catalog=False)

    assert reopened.catalog.queue("ActQ").activation == Activation(
        COUNT, max_readers=2, placement="internal", idle_timeout=7
    )
