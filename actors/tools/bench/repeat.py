"""Every `raybroker bench` scenario measured the same way: a warm-up run at a tenth of the load
(none for a smoke test, `--quick`), then `repeats` runs, each row the median of its runs (with
every run's figure and the spread), and a run whose driver process was above BUSY of a core
flagged in its rows: the harness, not the system, may have set that run's pace."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import psutil

from actors.errors import InvalidArgument
from actors.tools.bench.report import Load, Progress, Report, median_report

BUSY = 0.9
REPEATS = 3


def check_repeats(repeats: object) -> None:
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise InvalidArgument(f"--repeats must be a whole number of 1 or more, not {repeats!r}")


def repeated(
    scenario: Callable[..., Report],
    load: Load,
    repeats: int,
    progress: Progress,
    busy: float = BUSY,
    warm_up: bool = True,
) -> Report:
    check_repeats(repeats)
    if warm_up:
        warm = replace(load, messages=max(load.batch, load.messages // 10))
        progress(f"warm-up run ({warm.messages:,} messages)")
        scenario(warm, progress=progress)
    reports = []
    for i in range(repeats):
        progress(f"run {i + 1} of {repeats}")
        me = psutil.Process()
        cpu0, t0 = sum(me.cpu_times()[:2]), time.perf_counter()
        report = scenario(load, progress=progress)
        share = (sum(me.cpu_times()[:2]) - cpu0) / (time.perf_counter() - t0)
        if share > busy:
            for row in report.rows:
                row.notes += f"; driver process at {share:.0%} of a core in run {i + 1}"
        reports.append(report)
    return median_report(reports)
