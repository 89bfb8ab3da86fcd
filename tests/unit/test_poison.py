"""Poison-message detection: `limit` rollbacks in a row on one queue disable it."""

from __future__ import annotations

from actors.core.poison import PoisonCounter


def _roll_back(counter: PoisonCounter, queue: str, limit: int, times: int) -> list[bool]:
    return [counter.rolled_back(queue, limit) for _ in range(times)]


def test_a_queue_reaches_its_limit_on_exactly_the_limit_th_rollback_in_a_row():
    assert _roll_back(PoisonCounter(), "Q", 3, 3) == [False, False, True]


def test_rollbacks_past_the_limit_keep_reporting_the_limit_reached():
    counter = PoisonCounter()
    _roll_back(counter, "Q", 2, 2)
    assert counter.rolled_back("Q", 2) is True


def test_a_limit_of_one_is_reached_on_the_first_rollback():
    assert PoisonCounter().rolled_back("Q", 1) is True


def test_a_queue_with_poison_limit_zero_is_never_disabled():
    assert not any(_roll_back(PoisonCounter(), "Q", 0, 1000))


def test_a_commit_resets_the_count_so_the_limit_needs_rollbacks_in_a_row_again():
    counter = PoisonCounter()
    _roll_back(counter, "Q", 3, 2)
    counter.committed("Q")
    assert counter.count("Q") == 0
    assert _roll_back(counter, "Q", 3, 3) == [False, False, True]


def test_reset_clears_the_count():
    counter = PoisonCounter()
    _roll_back(counter, "Q", 5, 4)
    counter.reset("Q")
    assert counter.count("Q") == 0
    assert counter.rolled_back("Q", 5) is False


def test_count_tells_how_many_rollbacks_in_a_row_a_queue_has():
    counter = PoisonCounter()
    assert counter.count("Q") == 0
    _roll_back(counter, "Q", 10, 4)
    assert counter.count("Q") == 4


def test_queues_are_counted_separately():
    counter = PoisonCounter()
    _roll_back(counter, "A", 3, 2)
    assert counter.rolled_back("B", 3) is False
    counter.committed("B")
    assert counter.count("A") == 2
    assert counter.rolled_back("A", 3) is True


def test_committing_or_resetting_a_queue_never_rolled_back_is_harmless():
    counter = PoisonCounter()
    counter.committed("Q")
    counter.reset("Q")
    assert counter.count("Q") == 0
