"""A count reused for SHARE times as long as it took (actors.core.recount)."""

from __future__ import annotations

from actors.core.recount import SHARE, Recount


def test_a_count_is_made_again_only_once_it_is_older_than_share_times_what_it_took():
    clock = [0.0]  # the timer: each count takes 0.5 s of it
    counted: list[float] = []

    def count() -> int:
        clock[0] += 0.5
        counted.append(clock[0])
        return len(counted)

    recount: Recount[int] = Recount(timer=lambda: clock[0])
    assert recount.get(100.0, count) == 1 and recount.took == 0.5
    assert recount.get(100.0 + SHARE * 0.5, count) == 1  # not older than SHARE x 0.5 s yet
    assert recount.get(100.0 + SHARE * 0.5 + 0.01, count) == 2
    assert recount.at == 100.0 + SHARE * 0.5 + 0.01 and len(counted) == 2


def test_a_count_that_took_no_time_is_made_again_as_soon_as_time_moves():
    recount: Recount[str] = Recount(timer=lambda: 0.0)
    answers = iter("ab")
    assert recount.get(1.0, lambda: next(answers)) == "a"
    assert recount.get(1.0, lambda: next(answers)) == "a"
    assert recount.get(1.5, lambda: next(answers)) == "b"
