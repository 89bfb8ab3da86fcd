"""The read cache: receive serves what was just sent from memory, and never serves stale rows."""

from __future__ import annotations

from actors.calls.envelope import Begin, Send
from actors.core import Limits
from actors.core.readcache import ReadCache
from actors.model.catalog import Queue, Service
from actors.runs import rows_of


def run(first: int, n: int = 1, group: int = 1, body: bytes = b"x") -> tuple:
    """A send's run of `n` messages (actors.store.segments), ids and sequence from `first`."""
    return (first, group, 7, first, "T", [body] * n, 0, 1.0, 1.0)


def take(cache, group, skip, limit):
    """What `cache.take` answers, a row per message."""
    runs = cache.take(group, skip, limit)
    return None if runs is None else rows_of(runs)


def test_a_group_is_cached_only_from_a_moment_it_had_nothing_waiting():
    cache = ReadCache(1 << 20)
    cache.arrived(1, run(1), 65, was_empty=False)
    assert 1 not in cache and take(cache, 1, 0, None) is None
    cache.arrived(1, run(2), 65, was_empty=True)
    cache.arrived(1, run(3), 65, was_empty=False)
    assert [r[0] for r in take(cache, 1, 0, None)] == [2, 3]
    assert take(cache, 1, 0, None)[0] == (2, 7, 2, "T", b"x", 1.0, 1.0)  # a receive row
    # by the run: a send's messages are one run, whatever their number, its bodies a
    # tuple (what a receive hands out cannot change what the cache holds)
    assert cache.take(1, 0, None) == [
        (2, 7, 2, "T", (b"x",), 1.0, 1.0),
        (3, 7, 3, "T", (b"x",), 1.0, 1.0),
    ]


def test_a_take_answers_a_run_per_send_sliced_at_its_skip_and_limit():
    cache = ReadCache(1 << 20)
    cache.arrived(1, run(1, 4), 4 * 65, was_empty=True)
    cache.arrived(1, run(5, 3), 3 * 65, was_empty=False)
    assert cache.take(1, 0, None) == [(1, 7, 1, "T", (b"x",) * 4, 1.0, 1.0),
                                      (5, 7, 5, "T", (b"x",) * 3, 1.0, 1.0)]  # fmt: skip
    assert cache.take(1, 2, 3) == [(3, 7, 3, "T", (b"x",) * 2, 1.0, 1.0),
                                   (5, 7, 5, "T", (b"x",), 1.0, 1.0)]  # fmt: skip
    cache.arrived(1, (8, 1, 7, -1, "EndDialog", [b""], 0, 2.0, 2.0), 64, was_empty=False)
    assert cache.take(1, 7, None) == [(8, 7, -1, "EndDialog", (b"",), 2.0, 2.0)]


def test_take_skips_and_limits_and_consumed_removes_the_oldest():
    cache = ReadCache(1 << 20)
    cache.arrived(1, run(0, 5), 5 * 65, was_empty=True)
    assert [r[0] for r in take(cache, 1, 1, 2)] == [1, 2]
    cache.consumed(1, 2)
    assert [r[0] for r in take(cache, 1, 0, None)] == [2, 3, 4]
    assert cache.bytes == 3 * 65
    cache.consumed(1, 3)
    assert 1 not in cache and cache.bytes == 0


def test_takes_and_consumption_cross_the_runs_of_several_sends():
    cache = ReadCache(1 << 20)
    for first, n in ((0, 3), (3, 1), (4, 4)):
        cache.arrived(1, run(first, n), n * 65, was_empty=first == 0)
    assert [r[0] for r in take(cache, 1, 2, 3)] == [2, 3, 4]
    cache.consumed(1, 4)  # the first two runs
    assert [r[0] for r in take(cache, 1, 0, None)] == [4, 5, 6, 7]
    cache.consumed(1, 1)  # one of the last run's
    assert [r[0] for r in take(cache, 1, 1, None)] == [6, 7] and cache.bytes == 3 * 65
    assert [(r[0], r[2]) for r in take(cache, 1, 0, 1)] == [(5, 5)]


def test_a_group_that_would_overflow_the_cache_is_dropped_not_half_cached():
    cache = ReadCache(200)
    cache.arrived(1, run(1), 100, was_empty=True)
    cache.arrived(1, run(2), 150, was_empty=False)
    assert 1 not in cache and cache.bytes == 0
    cache.arrived(2, run(3, group=2), 250, was_empty=True)
    assert 2 not in cache


def test_a_commit_whose_sends_land_in_the_committed_group_keeps_only_the_new_messages(make_core):
    core = make_core()
    core.create(Queue("SelfQ"))
    core.create(Service("Self", "SelfQ", ("C",)))
    first = Begin("Self", "Self", "C")
    core.apply([first, Send(first.handle, "Req", b"one")])
    [g] = core.receive("SelfQ")
    target = g.messages[0].conversation_handle
    initiator_group = next(
        e["conversation_group_id"]
        for e in core.endpoints_view()
        if e["conversation_handle"] == first.handle
    )
    core.settle(rollback=[g.lock_id])
    core.move_conversation(target, initiator_group)  # both ends of the dialog in one group
    [g] = core.receive("SelfQ")
    core.settle(commit=[g.lock_id], ops=[Send(first.handle, "Req", b"two")])
    [g] = core.receive("SelfQ")
    assert [m.body for m in g.messages] == [b"two"]


def test_receive_reads_the_store_when_the_cache_is_off_or_full(make_core):
    for limits in (Limits(read_cache_bytes=0), Limits()):
        core = make_core(limits=limits)
        h = Begin("Init", "Target", "C")
        core.apply([h, Send(h.handle, "Req", [b"a", b"b", b"c"])])
        [g] = core.receive("TargetQ", top=2)
        [more] = core.receive("TargetQ", lock_id=g.lock_id)
        assert [m.body for m in g.messages + more.messages] == [b"a", b"b", b"c"]
        core.settle(commit=[g.lock_id])
        assert core.receive("TargetQ") == []


def test_waiting_counts_a_cached_groups_messages_through_arrivals_and_commits():
    cache = ReadCache(1 << 20)
    assert cache.waiting(1) is None  # not cached
    cache.arrived(1, run(1, n=3), 3 * 65, was_empty=True)
    cache.arrived(1, run(4, n=2), 2 * 65, was_empty=False)
    assert cache.waiting(1) == 5
    cache.consumed(1, 2)  # the first run's first two
    assert cache.waiting(1) == 3
    cache.consumed(1, 2)  # the first run's last, the second's first
    assert cache.waiting(1) == 1
    assert [r[0] for r in take(cache, 1, 0, None)] == [5]
    cache.arrived(1, run(6), 65, was_empty=False)
    assert cache.waiting(1) == 2
    cache.consumed(1, 2)  # all of it: the group leaves the cache
    assert cache.waiting(1) is None and 1 not in cache
