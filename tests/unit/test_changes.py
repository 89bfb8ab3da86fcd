"""`Changes`, what one unit of work gathers: the groups it has queued messages for, kept up as
arrivals come and after some are taken back (plain Python, no store)."""

from __future__ import annotations

from actors.core.changes import Arrived, Changes


def _arrive(w: Changes, group: int, endpoint: int) -> None:
    w.arrivals.append(Arrived("Q", group, 1, 1, len(w.messages), 10))
    w.messages.append((1, group, endpoint, 0, "M", [b"x"], 0, 0.0, 0.0))


def test_the_queued_groups_follow_the_arrivals_and_a_take_back():
    w = Changes(0.0)
    assert w.queued_groups() == set()
    _arrive(w, 7, endpoint=1)
    assert w.queued_groups() == {7}
    _arrive(w, 8, endpoint=2)
    _arrive(w, 7, endpoint=3)
    assert w.queued_groups() == {7, 8}
    w.take_back(2)  # endpoint 2 ended in this unit: its run goes, and with it group 8's arrival
    assert w.queued_groups() == {7}
    _arrive(w, 9, endpoint=4)
    assert w.queued_groups() == {7, 9}
