"""The read cache: receive serves what was just sent from memory, and never serves stale rows."""

from __future__ import annotations

from actors.calls.envelope import Begin, Send
from actors.core import Limits
from actors.core.readcache import ReadCache
from actors.model.catalog import Queue, Service


def row(i: int, group: int = 1, body: bytes = b"x") -> tuple:
    return (i, group, 7, i, "T", body, 0, 1.0, 1.0)


def test_a_group_is_cached_only_from_a_moment_it_had_nothing_waiting():
    cache = ReadCache(1 << 20)
    cache.arrived(1, [row(1)], 65, was_empty=False)
    assert 1 not in cache and cache.take(1, 0, None) is None
    cache.arrived(1, [row(2)], 65, was_empty=True)
    cache.arrived(1, [row(3)], 65, was_empty=False)
    assert [r[0] for r in cache.take(1, 0, None)] == [2, 3]


def test_take_skips_and_limits_and_consumed_removes_the_oldest():
    cache = ReadCache(1 << 20)
    cache.arrived(1, [row(i) for i in range(5)], 5 * 65, was_empty=True)
    assert [r[0] for r in cache.take(1, 1, 2)] == [1, 2]
    cache.consumed(1, 2)
    assert [r[0] for r in cache.take(1, 0, None)] == [2, 3, 4]
    cache.consumed(1, 3)
    assert 1 not in cache and cache.bytes == 0


def test_a_group_that_would_overflow_the_cache_is_dropped_not_half_cached():
    cache = ReadCache(200)
    cache.arrived(1, [row(1)], 100, was_empty=True)
    cache.arrived(1, [row(2)], 150, was_empty=False)
    assert 1 not in cache and cache.bytes == 0
    cache.arrived(2, [row(3, 2)], 250, was_empty=True)
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
