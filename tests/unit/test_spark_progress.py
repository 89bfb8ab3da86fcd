"""An ingest sender's progress reports (spark_bridge.progress.Tally): the first at once, then at
most one per interval, and whatever is left at the end; nothing counted twice or lost. No Ray."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from spark_bridge.progress import Tally, line


def test_the_first_report_goes_at_once_then_one_per_interval_and_the_rest_at_the_end():
    told: list[tuple[int, int]] = []
    tally = Tally(lambda rows, messages: told.append((rows, messages)), every_s=0.5)
    tally.add(10, 10, now=100.0)  # the board shows the sender from its first call
    tally.add(10, 9, now=100.1)
    tally.add(10, 10, now=100.4)
    assert told == [(10, 10)]
    tally.add(5, 5, now=100.5)  # an interval after the last report: all that waited
    assert told == [(10, 10), (25, 24)]
    tally.add(3, 3, now=100.6)
    tally.flush(now=100.7)
    tally.flush(now=100.8)  # nothing left: no empty report
    assert told == [(10, 10), (25, 24), (3, 3)]


@given(st.lists(st.tuples(st.integers(0, 500), st.floats(0, 2)), max_size=60))
def test_the_reports_add_up_to_what_was_sent_and_come_no_closer_than_the_interval(calls):
    told: list[tuple[float, int]] = []
    now = 0.0
    tally = Tally(lambda rows, _messages: told.append((now, rows)), every_s=0.5)
    for rows, gap in calls:
        now += gap
        tally.add(rows, rows, now)
    now += 0.01
    tally.flush(now)
    assert sum(r for _, r in told) == sum(r for r, _ in calls)
    times = [t for t, _ in told[:-1]]  # the last may be the flush at the end
    assert all(b - a >= 0.5 for a, b in zip(times, times[1:], strict=False))


def test_the_progress_line_shows_the_share_only_when_the_total_is_known():
    view = {"rows": 2_500, "total": 10_000, "rows_per_s": 1234.4}

    assert line(view) == "2,500/10,000 rows (25%), 1,234 rows/s"
    assert line(view | {"total": None}) == "2,500 rows, 1,234 rows/s"
