"""Conversation-group locking: the ready index of one queue, and the leases on locked groups."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from actors.core.locks import Lock, LockTable, QueueIndex
from tests.fakes import FakeClock

# --- QueueIndex ------------------------------------------------------------------------------


def _drain(idx: QueueIndex) -> list[tuple[int, int]]:
    out = []
    while (popped := idx.pop_ready()) is not None:
        out.append(popped)
    return out


def test_an_empty_index_has_no_ready_group_and_depth_zero():
    idx = QueueIndex()
    assert idx.pop_ready() is None
    assert idx.depth == 0


def test_messages_for_an_unlocked_group_make_it_ready_at_its_first_position():
    idx = QueueIndex()
    idx.add(7, first_id=42, count=3, locked=False)
    assert idx.is_ready(7)
    assert idx.pending == {7: 3}
    assert idx.pop_ready() == (42, 7)


def test_messages_for_a_locked_group_are_counted_but_do_not_make_it_ready():
    idx = QueueIndex()
    idx.add(7, first_id=1, count=2, locked=True)
    assert not idx.is_ready(7)
    assert idx.depth == 2
    assert idx.pop_ready() is None


def test_pop_ready_hands_out_groups_oldest_first():
    idx = QueueIndex()
    idx.add(1, first_id=30, count=1, locked=False)
    idx.add(2, first_id=10, count=1, locked=False)
    idx.add(3, first_id=20, count=1, locked=False)
    assert _drain(idx) == [(10, 2), (20, 3), (30, 1)]


def test_more_messages_for_a_waiting_group_keep_its_place_by_its_oldest_message():
    idx = QueueIndex()
    idx.add(1, first_id=10, count=1, locked=False)
    idx.add(2, first_id=20, count=1, locked=False)
    idx.add(1, first_id=30, count=2, locked=False)
    assert idx.pending[1] == 3
    assert _drain(idx) == [(10, 1), (20, 2)]


def test_a_popped_group_is_no_longer_ready_but_its_messages_still_count():
    idx = QueueIndex()
    idx.add(1, first_id=5, count=2, locked=False)
    idx.pop_ready()
    assert not idx.is_ready(1)
    assert idx.depth == 2
    assert idx.pop_ready() is None


def test_take_removes_a_ready_group_and_returns_its_key():
    idx = QueueIndex()
    idx.add(1, first_id=5, count=1, locked=False)
    idx.add(2, first_id=6, count=1, locked=False)
    assert idx.take(1) == 5
    assert not idx.is_ready(1)
    assert _drain(idx) == [(6, 2)]


def test_take_of_a_group_that_is_not_ready_returns_none():
    idx = QueueIndex()
    idx.add(1, first_id=5, count=1, locked=True)
    assert idx.take(1) is None
    assert idx.take(99) is None


def test_make_ready_puts_a_taken_group_back_at_its_old_place():
    idx = QueueIndex()
    idx.add(1, first_id=5, count=1, locked=False)
    idx.add(2, first_id=6, count=1, locked=False)
    key = idx.take(1)
    idx.make_ready(1, key)
    assert _drain(idx) == [(5, 1), (6, 2)]


def test_make_ready_ignores_a_group_with_nothing_waiting():
    idx = QueueIndex()
    idx.make_ready(1, 5)
    assert not idx.is_ready(1)
    assert idx.pop_ready() is None


def test_make_ready_keeps_the_key_of_a_group_that_is_already_ready():
    idx = QueueIndex()
    idx.add(1, first_id=5, count=1, locked=False)
    idx.make_ready(1, 1)
    assert _drain(idx) == [(5, 1)]


def test_removing_some_messages_of_a_group_keeps_it_ready():
    idx = QueueIndex()
    idx.add(1, first_id=5, count=3, locked=False)
    idx.remove(1, 2)
    assert idx.pending == {1: 1}
    assert idx.is_ready(1)


def test_removing_all_messages_of_a_group_forgets_it():
    idx = QueueIndex()
    idx.add(1, first_id=5, count=3, locked=False)
    idx.add(2, first_id=6, count=1, locked=False)
    idx.remove(1, 3)
    assert 1 not in idx.pending
    assert not idx.is_ready(1)
    assert _drain(idx) == [(6, 2)]


def test_removing_more_messages_than_are_counted_forgets_the_group():
    idx = QueueIndex()
    idx.add(1, first_id=5, count=1, locked=False)
    idx.remove(1, 4)
    assert idx.pending == {}
    assert idx.depth == 0


def test_a_group_emptied_and_refilled_is_ready_at_its_new_position_only():
    idx = QueueIndex()
    idx.add(1, first_id=1, count=1, locked=False)
    idx.remove(1, 1)
    idx.add(1, first_id=10, count=1, locked=False)
    idx.add(2, first_id=5, count=1, locked=False)
    assert _drain(idx) == [(5, 2), (10, 1)]


def test_depth_counts_every_waiting_message_of_every_group():
    idx = QueueIndex()
    idx.add(1, first_id=1, count=2, locked=False)
    idx.add(2, first_id=3, count=5, locked=True)
    idx.remove(2, 1)
    assert idx.depth == 6


_groups = st.integers(0, 7)
_keys = st.integers(0, 50)
_counts = st.integers(1, 4)
_index_ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), _groups, _keys, _counts, st.booleans()),
        st.tuples(st.just("make_ready"), _groups, _keys),
        st.tuples(st.just("take"), _groups),
        st.tuples(st.just("remove"), _groups, _counts),
        st.tuples(st.just("pop")),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(_index_ops)
def test_pop_ready_always_yields_the_ready_group_with_the_smallest_key(ops):
    idx = QueueIndex()
    pending: dict[int, int] = {}
    ready: dict[int, int] = {}  # the model: group -> key of every live ready group
    for op in ops:
        name, args = op[0], op[1:]
        if name == "add":
            g, first_id, count, locked = args
            before = pending.get(g, 0)
            pending[g] = before + count
            if before == 0 and not locked and g not in ready:
                ready[g] = first_id
            idx.add(g, first_id, count, locked)
        elif name == "make_ready":
            g, key = args
            if pending.get(g, 0) > 0 and g not in ready:
                ready[g] = key
            idx.make_ready(g, key)
        elif name == "take":
            (g,) = args
            assert idx.take(g) == ready.pop(g, None)
        elif name == "remove":
            g, count = args
            if pending.get(g, 0) - count > 0:
                pending[g] -= count
            else:
                pending.pop(g, None)
                ready.pop(g, None)
            idx.remove(g, count)
        else:
            popped = idx.pop_ready()
            if not ready:
                assert popped is None
                continue
            assert popped is not None
            key, g = popped
            assert key == min(ready.values())
            assert ready.pop(g) == key
        assert idx.depth == sum(pending.values())
        assert {g for g in pending if idx.is_ready(g)} == set(ready)
    assert [g for _, g in _drain(idx)] == sorted(ready, key=lambda g: (ready[g], g))


# --- LockTable -------------------------------------------------------------------------------


def _acquire(
    table: LockTable,
    group: int,
    now: float,
    owner: str | None = "reader-1",
    lease_s: float | None = None,
) -> Lock:
    return table.acquire(
        group, "Q", owner, now, lease_s, ready_key=group * 10, first_id=1, last_id=0, count=0
    )


def test_acquire_records_the_lock_under_its_id_and_its_group():
    table, clock = LockTable(), FakeClock()
    lock = table.acquire(3, "Q", "r", clock(), 10.0, ready_key=7, first_id=8, last_id=9, count=2)
    assert table.get(lock.lock_id) is lock
    assert table.by_group[3] is lock
    assert table.is_locked(3)
    assert (lock.group, lock.queue, lock.owner) == (3, "Q", "r")
    assert (lock.ready_key, lock.first_id, lock.last_id, lock.count) == (7, 8, 9, 2)
    assert lock.received_at == clock()
    assert lock.audit == []


def test_a_lock_expires_its_lease_after_acquire():
    table, clock = LockTable(), FakeClock()
    assert _acquire(table, 1, clock(), lease_s=12.5).expires_at == clock() + 12.5


def test_a_lock_without_a_lease_gets_the_default_lease():
    table, clock = LockTable(default_lease_s=7.0), FakeClock()
    assert _acquire(table, 1, clock()).expires_at == clock() + 7.0


def test_lock_ids_are_unique_within_a_table():
    table, clock = LockTable(), FakeClock()
    ids = [_acquire(table, g, clock()).lock_id for g in range(100)]
    assert len(set(ids)) == 100


def test_lock_ids_differ_across_lock_tables_as_across_broker_restarts():
    clock = FakeClock()
    before_restart = _acquire(LockTable(), 1, clock()).lock_id
    after_restart = _acquire(LockTable(), 1, clock()).lock_id
    assert before_restart != after_restart


def test_an_unknown_lock_id_is_not_found():
    assert LockTable().get("no-such-lock") is None


def test_release_frees_the_group_and_forgets_the_lock():
    table, clock = LockTable(), FakeClock()
    lock = _acquire(table, 1, clock())
    table.release(lock)
    assert table.get(lock.lock_id) is None
    assert not table.is_locked(1)
    assert _acquire(table, 1, clock()).lock_id != lock.lock_id


def test_releasing_a_lock_twice_is_harmless():
    table, clock = LockTable(), FakeClock()
    lock = _acquire(table, 1, clock())
    other = _acquire(table, 2, clock())
    table.release(lock)
    table.release(lock)
    assert table.by_id == {other.lock_id: other}


def test_renew_extends_the_lease_from_now():
    table, clock = LockTable(default_lease_s=30.0), FakeClock()
    lock = _acquire(table, 1, clock())
    clock.advance(20)
    table.renew(lock, clock(), 5.0)
    assert lock.expires_at == clock() + 5.0
    table.renew(lock, clock())
    assert lock.expires_at == clock() + 30.0


def test_expired_lists_the_locks_whose_lease_has_run_out_by_now():
    table, clock = LockTable(), FakeClock()
    short = _acquire(table, 1, clock(), lease_s=5)
    _acquire(table, 2, clock(), lease_s=10)
    assert table.expired(clock()) == []
    clock.advance(4.5)
    assert table.expired(clock()) == []
    clock.advance(0.5)
    assert table.expired(clock()) == [short]


def test_a_renewed_lock_does_not_expire_at_its_old_time():
    table, clock = LockTable(), FakeClock()
    lock = _acquire(table, 1, clock(), lease_s=5)
    clock.advance(4)
    table.renew(lock, clock(), 5)
    clock.advance(2)
    assert table.expired(clock()) == []


def test_held_by_lists_only_that_owners_locks():
    table, clock = LockTable(), FakeClock()
    a1 = _acquire(table, 1, clock(), owner="a")
    _acquire(table, 2, clock(), owner="b")
    a3 = _acquire(table, 3, clock(), owner="a")
    assert table.held_by("a") == [a1, a3]
    assert table.held_by("nobody") == []


def test_owners_lists_every_named_owner_but_not_anonymous_receivers():
    table, clock = LockTable(), FakeClock()
    _acquire(table, 1, clock(), owner="a")
    _acquire(table, 2, clock(), owner="a")
    _acquire(table, 3, clock(), owner="b")
    _acquire(table, 4, clock(), owner=None)
    assert table.owners() == {"a", "b"}


def test_next_expiry_is_the_earliest_lease_end_or_none_without_locks():
    table, clock = LockTable(), FakeClock()
    assert table.next_expiry() is None
    _acquire(table, 1, clock(), lease_s=10)
    soon = _acquire(table, 2, clock(), lease_s=3)
    assert table.next_expiry() == clock() + 3
    table.release(soon)
    assert table.next_expiry() == clock() + 10


def test_the_random_part_of_each_lock_id_is_a_fresh_token():
    table = LockTable()
    ids = [table.acquire(g, "q", None, 0.0, None, g, g, g, 1).lock_id for g in range(600)]
    assert len({i.rsplit("-", 1)[1] for i in ids}) == len(ids)
