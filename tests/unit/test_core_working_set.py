"""The working set: a broker keeps the endpoints and groups in use in memory, up to
`Limits.endpoint_cache`, and reads the rest from its store by key when they are used. Evicted
dialogs behave exactly as cached ones: undo, timers, lifetimes, restarts and poison counts.
No Ray: BrokerCore on a file store, fake clock."""

from __future__ import annotations

import pytest

from actors.calls.envelope import Begin, End, Send, Timer
from actors.core import Limits
from actors.core.changes import Group
from actors.core.working_set import Groups
from actors.errors import BrokerError, QueueDisabled

SMALL = Limits(endpoint_cache=6)  # a few dialogs' worth: most of a test's dialogs are evicted


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "broker.db")


def dialogs(core, n: int, to: str = "Target") -> list[str]:
    """Begin `n` dialogs, one message each; their initiators' handles."""
    handles = []
    for i in range(n):
        op = Begin("Init", to, "C")
        core.apply([op, Send(op.handle, "Req", b"m%d" % i)])
        handles.append(op.handle)
    return handles


def cached(core, handle: str) -> bool:
    return handle in core.state.endpoints._handles


def by_handle(core) -> list[dict]:
    return sorted(core.endpoints_view(), key=lambda e: e["conversation_handle"])


def test_memory_holds_at_most_the_cache_but_those_in_use_and_the_store_holds_all(make_core, path):
    core = make_core(path, SMALL)
    handles = dialogs(core, 40)

    assert len(core.state.endpoints) <= SMALL.endpoint_cache
    assert len(core.state.groups) <= SMALL.endpoint_cache
    assert core.state.endpoints.evicted > 0
    assert len(core.endpoints_view()) == 80  # the views read the store: every endpoint
    assert not cached(core, handles[0])
    core.apply([Send(handles[0], "Req", b"again")])  # read back by its handle
    assert cached(core, handles[0])
    got = []
    while batch := core.receive("TargetQ", max_groups=5):
        got += [(m.body, m.sequence_number) for g in batch for m in g.messages]
        core.settle(commit=[g.lock_id for g in batch])
    assert sorted(got) == sorted([(b"m%d" % i, 0) for i in range(40)] + [(b"again", 1)])


def test_a_failed_verb_on_an_evicted_endpoint_is_undone_in_memory_and_in_the_store(
    make_core, path, snapshot
):
    core = make_core(path, SMALL)
    first, *_ = dialogs(core, 20)
    assert not cached(core, first)
    before = snapshot(core)

    with pytest.raises(BrokerError):  # the second op fails: the first, applied, is undone
        core.apply([Send(first, "Req", b"x"), Send(first, "NoSuchType", b"y")])

    assert cached(core, first)  # read back for the verb, changed, and restored
    assert snapshot(core) == before
    core.apply([Send(first, "Req", b"x")])  # its next sequence number is the one it had
    seqs = [e["send_sequence"] for e in core.endpoints_view() if e["conversation_handle"] == first]
    assert seqs == [2]


def test_a_timer_fires_on_an_evicted_dialog(make_core, core_clock, path):
    core = make_core(path, SMALL)
    first, *_ = dialogs(core, 1)
    core.apply([Timer(first, 30)])
    dialogs(core, 20)
    assert not cached(core, first)

    core_clock.advance(29)
    core.tick()
    assert core.receive("InitQ") == []
    core_clock.advance(1)
    core.tick()

    (got,) = core.receive("InitQ")
    assert [(m.message_type, m.conversation_handle) for m in got.messages] == [
        ("DialogTimer", first)
    ]


def test_a_timer_beyond_the_horizon_is_found_in_the_store_when_it_comes_near(
    make_core, core_clock, path
):
    core = make_core(path, SMALL)
    core.tick()  # the schedule holds what falls due in the next minute
    first, *_ = dialogs(core, 1)
    core.apply([Timer(first, 3600)])  # an hour: left in the store
    dialogs(core, 20)
    assert core.state.timers == []

    for _ in range(60):
        core_clock.advance(60)
        core.tick()

    (got,) = core.receive("InitQ")
    assert [m.message_type for m in got.messages] == ["DialogTimer"]


def test_a_lifetime_expires_on_an_evicted_dialog(make_core, core_clock, path):
    core = make_core(path, SMALL)
    op = Begin("Init", "Target", "C", lifetime=30)
    core.apply([op, Send(op.handle, "Req", b"m")])
    dialogs(core, 20)
    assert not cached(core, op.handle)

    core_clock.advance(31)
    core.tick()

    ends = [
        (m.message_type, m.conversation_handle)
        for g in core.receive("InitQ", max_groups=50)
        for m in g.messages
    ]
    assert ends == [("Error", op.handle)]
    state = [e["state"] for e in core.endpoints_view() if e["conversation_handle"] == op.handle]
    assert state == ["ERROR"]


def test_a_restart_reads_no_endpoint_until_one_is_used(make_core, core_clock, path):
    core = make_core(path, SMALL)
    handles = dialogs(core, 30)
    core.apply([Timer(handles[3], 10)])
    views = by_handle(core)
    core.store.close()  # as a crash leaves it: what committed is in the file

    again = make_core(path, SMALL, catalog=False)

    assert len(again.state.endpoints) == 0 and len(again.state.groups) == 0
    assert by_handle(again) == views
    (got,) = again.receive("TargetQ", max_groups=1)  # the oldest group, read back on use
    assert [m.body for m in got.messages] == [b"m0"]
    again.settle(commit=[got.lock_id], ops=[End(got.messages[0].conversation_handle)])
    core_clock.advance(10)
    again.tick()
    fired = [m for g in again.receive("InitQ", max_groups=50) for m in g.messages]
    assert sorted((m.message_type, m.conversation_handle) for m in fired) == sorted(
        [("DialogTimer", handles[3]), ("EndDialog", handles[0])]
    )
    assert len(again.state.endpoints) <= SMALL.endpoint_cache


def test_a_small_store_is_read_whole_at_start_and_asks_the_store_no_more(make_core, path):
    core = make_core(path)
    dialogs(core, 3)
    core.store.close()

    again = make_core(path, catalog=False)

    assert again.state.endpoints.complete and len(again.state.endpoints) == 6
    assert again.state.endpoints.by_handle("no-such-handle") is None
    assert again.state.endpoints.misses == 0


def test_poison_counts_survive_the_eviction_of_the_dialog_rolled_back(make_core, path):
    core = make_core(path, SMALL)
    dialogs(core, 1, to="Poison")
    for _ in range(2):
        (got,) = core.receive("PoisonQ")
        core.settle(rollback=[got.lock_id])
        dialogs(core, 20)  # the poison dialog's endpoints and group are evicted between turns
        assert core.state.endpoints.evicted > 0
        assert not any(g.queue == "PoisonQ" for g in core.state.groups.cached())

    (got,) = core.receive("PoisonQ")
    core.settle(rollback=[got.lock_id])  # the third rollback in a row: the queue stops

    with pytest.raises(QueueDisabled):
        core.receive("PoisonQ")


def test_what_a_receive_holds_is_not_evicted_while_it_holds_it(make_core, path):
    core = make_core(path, SMALL)
    dialogs(core, 3)
    held = core.receive("TargetQ", max_groups=3)
    numbers = {core.state.group_no(g.group_id) for g in held}

    dialogs(core, 20)

    assert numbers <= {g.no for g in core.state.groups.cached()}
    core.settle(commit=[g.lock_id for g in held])
    dialogs(core, 20)
    assert not numbers & {g.no for g in core.state.groups.cached()}


def test_a_group_read_back_counts_its_conversations_and_goes_with_the_last(make_core, path):
    core = make_core(path, SMALL)
    ops = []
    for _ in range(2):
        op = Begin("Init", "Target", "C", related_group="order-1")
        ops += [op, Send(op.handle, "Req", b"x")]
    core.apply(ops)
    a, b = ops[0].handle, ops[2].handle
    dialogs(core, 20)
    no = core.state.groups.by_id("order-1")
    assert no is not None and core.state.groups.peek(no) is None  # evicted

    core.apply([End(a, cleanup=True)])
    assert core.state.groups.by_id("order-1") == no  # one conversation left: it stays
    dialogs(core, 20)
    core.apply([End(b, cleanup=True)])
    assert core.state.groups.by_id("order-1") is None


def test_a_working_set_evicts_the_least_recently_used_first_and_skips_the_pinned():
    store = {n: Group(n, f"g-{n}", "Q") for n in range(1, 11)}
    reads = []

    def load(no):
        reads.append(no)
        return store.get(no)

    groups = Groups(4, load, lambda gid: None)
    for n in (1, 2, 3, 4):
        groups.add(store[n])
    assert groups.get(1) is store[1]  # 1 used: 2 is now the least recent
    groups.add(store[5])
    groups.trim(pinned=lambda no: no == 2)

    assert sorted(g.no for g in groups.cached()) == [1, 2, 4, 5]  # 3 went; 2 is pinned
    assert groups.get(3) is store[3] and reads == [3]
    assert groups.get(99) is None and groups.misses == 1


def test_dialogs_are_counted_by_state_in_the_store_and_a_count_is_reused_briefly(
    make_core, core_clock, path
):
    core = make_core(path, SMALL)
    first, *_ = dialogs(core, 20)  # 40 endpoints, most of them evicted
    core.apply([End(first)])

    counts = core.dialogs_view()
    ended = {"DISCONNECTED_OUTBOUND": 1, "DISCONNECTED_INBOUND": 1}  # its far side heard
    assert counts["by_state"] == {"CONVERSING": 38, **ended}
    assert counts["secured"] == 0 and counts["counted_at"] == core_clock()
    dialogs(core, 1)
    assert core.dialogs_view() == counts  # counted a moment ago: the same count
    core_clock.advance(20 * core.state.dialog_counts.took + 0.001)
    assert core.dialogs_view()["by_state"] == {"CONVERSING": 40, **ended}
