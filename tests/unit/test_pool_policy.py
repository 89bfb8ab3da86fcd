"""The reader-pool policy without Ray: when a queue's pool starts readers, looks again, keeps a
spare actor and backs off after a failure, on the fake clock."""

from __future__ import annotations

import pytest

from actors.activation import Decision, PoolPolicy
from actors.model.catalog import Activation
from actors.model.limits import Limits
from tests.fakes import FakeClock

COUNT = "actors.activation.handlers:count_in_order"
TUNABLES = Limits()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def policy(clock) -> PoolPolicy:
    return PoolPolicy(clock)


def pool(max_readers: int = 4, **fields) -> Activation:
    return Activation(COUNT, max_readers=max_readers, **fields)


def test_the_tunables_default_to_half_a_second_five_seconds_and_a_two_second_backlog():
    assert (TUNABLES.growth_check_s, TUNABLES.failed_start_backoff_s) == (0.5, 5.0)
    assert TUNABLES.backlog_target_s == 2.0


def test_one_reader_starts_when_messages_wait_and_none_runs(policy):
    assert policy.decide("Q", pool(), depth=3, removed=0, running=0).start == 1


def test_no_reader_starts_on_an_empty_queue_but_a_pool_queue_still_gets_a_spare(policy):
    assert policy.decide("Q", pool(), depth=0, removed=0, running=0) == Decision(make_spare=True)


def test_a_running_pool_grows_only_once_the_growth_check_interval_has_passed(policy, clock):
    assert policy.decide("Q", pool(), depth=5, removed=0, running=0).start == 1

    clock.advance(TUNABLES.growth_check_s / 2)
    assert policy.decide("Q", pool(), depth=50, removed=0, running=1).start == 0

    clock.advance(TUNABLES.growth_check_s / 2)
    assert policy.decide("Q", pool(), depth=50, removed=0, running=1).start == 1


def test_before_the_growth_check_the_depth_it_saw_is_not_taken_as_the_last_one(policy, clock):
    policy.decide("Q", pool(), depth=5, removed=0, running=0)
    clock.advance(0.1)
    policy.decide("Q", pool(), depth=50, removed=0, running=1)  # too early: not looked at

    assert policy.state("Q").last_depth == 5


def test_a_steady_queue_that_drains_within_the_backlog_target_does_not_grow(policy, clock):
    policy.decide("Q", pool(), depth=20, removed=0, running=0)
    clock.advance(TUNABLES.growth_check_s)

    # 20 removed in 0.5 s is 40/s: 20 waiting drain in 0.5 s, well within 2 s
    assert policy.decide("Q", pool(), depth=20, removed=20, running=1).start == 0


def test_a_steady_queue_that_drains_too_slowly_grows(policy, clock):
    policy.decide("Q", pool(), depth=20, removed=0, running=0)
    clock.advance(TUNABLES.growth_check_s)

    # 1 removed in 0.5 s is 2/s: 20 waiting would take 10 s
    assert policy.decide("Q", pool(), depth=20, removed=1, running=1).start == 1


def test_the_backlog_target_is_a_tunable(clock):
    policy = PoolPolicy(clock, Limits(backlog_target_s=20.0))
    policy.decide("Q", pool(), depth=20, removed=0, running=0)
    clock.advance(TUNABLES.growth_check_s)

    assert policy.decide("Q", pool(), depth=20, removed=1, running=1).start == 0


def test_a_pool_never_grows_past_max_readers(policy, clock):
    policy.decide("Q", pool(max_readers=2), depth=10, removed=0, running=0)
    for depth in (20, 40, 80):
        clock.advance(TUNABLES.growth_check_s)
        decision = policy.decide("Q", pool(max_readers=2), depth=depth, removed=0, running=2)
        assert decision.start == 0


def test_the_started_count_adds_up_the_readers_the_policy_started(policy, clock):
    policy.decide("Q", pool(), depth=10, removed=0, running=0)
    clock.advance(TUNABLES.growth_check_s)
    policy.decide("Q", pool(), depth=20, removed=0, running=1)

    assert policy.state("Q").started == 2


def test_a_spare_is_made_only_when_no_readers_run_and_placement_is_pool(policy):
    assert policy.decide("A", pool(), depth=0, removed=0, running=0).make_spare
    assert not policy.decide("B", pool(), depth=0, removed=0, running=1).make_spare
    internal = pool(placement="internal")
    assert not policy.decide("C", internal, depth=0, removed=0, running=0).make_spare


def test_a_second_spare_is_not_made_while_the_first_one_waits(policy, clock):
    policy.decide("Q", pool(), depth=0, removed=0, running=0)
    clock.advance(1.0)

    assert not policy.decide("Q", pool(), depth=0, removed=0, running=0).make_spare


def test_once_a_reader_takes_the_spare_a_new_one_is_made_when_no_reader_runs(policy):
    policy.decide("Q", pool(), depth=0, removed=0, running=0)
    policy.spare_taken("Q")

    assert policy.decide("Q", pool(), depth=0, removed=0, running=0).make_spare


def test_after_a_failed_start_no_reader_or_spare_starts_until_the_back_off_has_passed(
    policy, clock
):
    policy.decide("Q", pool(), depth=1, removed=0, running=0)
    policy.spare_taken("Q")
    policy.reader_failed("Q")

    clock.advance(TUNABLES.failed_start_backoff_s - 0.01)
    assert policy.decide("Q", pool(), depth=1, removed=0, running=0) == Decision()

    clock.advance(0.01)
    assert policy.decide("Q", pool(), depth=1, removed=0, running=0) == Decision(
        start=1, make_spare=True
    )


def test_the_back_off_after_a_failed_start_is_a_tunable(clock):
    policy = PoolPolicy(clock, Limits(failed_start_backoff_s=1.0))
    policy.reader_failed("Q")
    clock.advance(1.0)

    assert policy.decide("Q", pool(), depth=1, removed=0, running=0).start == 1


def test_a_failed_start_on_one_queue_does_not_hold_back_another(policy):
    policy.reader_failed("A")

    assert policy.decide("B", pool(), depth=1, removed=0, running=0).start == 1


def test_an_idle_readers_actor_becomes_the_spare_when_there_is_none_and_activation_is_on(policy):
    policy.decide("Q", pool(), depth=2, removed=0, running=0)  # a spare, and a reader
    policy.spare_taken("Q")  # the reader runs in the spare

    assert policy.reader_ended("Q", pool())
    assert not policy.decide("Q", pool(), depth=0, removed=0, running=0).make_spare


def test_an_idle_readers_actor_is_not_kept_when_a_spare_already_waits(policy):
    policy.decide("Q", pool(), depth=0, removed=0, running=0)

    assert not policy.reader_ended("Q", pool())


def test_an_idle_readers_actor_is_not_kept_when_activation_is_off(policy):
    assert not policy.reader_ended("Q", None)


def test_a_reader_actor_that_died_or_failed_never_becomes_the_spare(policy):
    assert not policy.reader_ended("Q", pool(), warm=False)


def test_turning_activation_off_drops_the_spare_and_starts_nothing(policy):
    policy.decide("Q", pool(), depth=0, removed=0, running=0)

    assert policy.decide("Q", None, depth=5, removed=0, running=0) == Decision(drop_spare=True)
    assert policy.decide("Q", None, depth=5, removed=0, running=0) == Decision()


def test_switching_placement_to_internal_drops_the_spare_and_starts_internal_readers(policy):
    policy.decide("Q", pool(), depth=0, removed=0, running=0)

    decision = policy.decide("Q", pool(placement="internal"), depth=3, removed=0, running=0)

    assert decision == Decision(start=1, drop_spare=True)


def test_turning_activation_off_during_a_back_off_still_drops_the_spare(policy):
    policy.decide("Q", pool(), depth=0, removed=0, running=0)
    policy.reader_failed("Q")

    assert policy.decide("Q", None, depth=0, removed=0, running=0).drop_spare


def test_shutting_down_forgets_the_spare(policy):
    policy.decide("Q", pool(), depth=0, removed=0, running=0)
    policy.spare_gone("Q")

    assert policy.decide("Q", pool(), depth=0, removed=0, running=0).make_spare
