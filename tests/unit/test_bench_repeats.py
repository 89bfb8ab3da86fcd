"""Every bench scenario's rows are medians of several runs after a warm-up (no Ray: a scenario
here is a function returning a report, as each scenario's `run` does)."""

from __future__ import annotations

import time

import pytest

from actors.errors import InvalidArgument
from actors.tools.bench.repeat import repeated
from actors.tools.bench.report import Load, Report, Row, median_report, median_row


def test_the_median_run_is_the_row_with_every_run_and_the_spread():
    runs = [Row("s", "v", rate, p50_ms=rate / 1000, notes="n") for rate in (900.0, 1200.0, 1000.0)]
    row = median_row(runs)
    assert row.messages_per_s == 1000.0 and row.p50_ms == 1.0  # that run's own figures
    assert row.runs == [900.0, 1200.0, 1000.0]
    assert row.notes == "n; median of 3 runs (900, 1,200, 1,000 msg/s; spread 30%)"


def test_a_failed_run_counts_and_its_reason_is_kept():
    runs = [Row("s", "v", 0.0, notes="failed: TimeoutError"), Row("s", "v", 50.0),
            Row("s", "v", 70.0)]  # fmt: skip
    row = median_row(runs)
    assert row.messages_per_s == 50.0 and "failed: TimeoutError" in row.notes
    assert median_row([Row("s", "v", 0.0), Row("s", "v", 0.0), Row("s", "v", 0.0)]).runs == [0] * 3


def test_reports_merge_row_by_row_in_the_first_reports_order():
    def report(a: float, b: float) -> Report:
        return Report("x", {"m": 1}, [Row("one", "v", a), Row("two", "v", b, durability="full")])

    merged = median_report([report(1, 10), report(3, 30), report(2, 20)])
    assert [(r.system, r.messages_per_s, r.runs) for r in merged.rows] == [
        ("one", 2, [1, 3, 2]),
        ("two", 20, [10, 30, 20]),
    ]
    assert merged.params == {"m": 1, "repeats": 3}


def test_a_rows_ratio_is_the_ratio_of_the_medians_not_of_the_median_runs_own_figures():
    """Secured beside unsecured, three runs: the secured median run (66) had a slow unsecured
    partner (64), so its own ratio (1.03x) says more than the medians do (66 / 71 = 0.93x)."""
    base, secured = "two brokers", "two brokers, secured"
    runs = [(71, 65), (64, 66), (73, 69)]
    reports = [
        Report(
            "remote",
            {},
            [
                Row("raybroker", base, plain, vs=[["raybroker", "one broker", "one broker"]]),
                Row(
                    "raybroker",
                    secured,
                    sealed,
                    notes="crypto",
                    vs=[["raybroker", base, "unsecured"]],
                ),
                Row("raybroker", "one broker", 200),
            ],
        )  # fmt: skip
        for plain, sealed in runs
    ]
    rows = {r.variant: r for r in median_report(reports).rows}
    assert rows[secured].messages_per_s == 66 and rows[base].messages_per_s == 71
    assert rows[secured].notes.startswith("0.93x unsecured; crypto; median of 3 runs")
    assert rows[base].notes.startswith("0.35x one broker; median of 3 runs")
    assert rows["one broker"].notes.startswith("median of 3 runs")  # no baseline, no ratio
    assert rows[secured].vs == [["raybroker", base, "unsecured"]]  # kept in the JSON


def test_a_scenario_runs_a_warm_up_then_its_repeats_and_reports_their_median():
    loads: list[int] = []
    rates = iter([5.0, 100.0, 300.0, 200.0])  # the warm-up's figure is not among the runs

    def scenario(load: Load, progress) -> Report:
        loads.append(load.messages)
        return Report("x", {}, [Row("s", "v", next(rates))])

    progress: list[str] = []
    report = repeated(scenario, Load(messages=20_000), 3, progress.append)
    assert loads == [2_000, 20_000, 20_000, 20_000]
    assert report.rows[0].messages_per_s == 200.0 and report.rows[0].runs == [100, 300, 200]
    assert progress == ["warm-up run (2,000 messages)", "run 1 of 3", "run 2 of 3", "run 3 of 3"]

    loads.clear()  # a smoke test's run (--quick): the repeats alone
    progress.clear()
    rates = iter([7.0, 9.0])
    report = repeated(scenario, Load(messages=20_000), 2, progress.append, warm_up=False)
    assert loads == [20_000, 20_000] and report.rows[0].runs == [7, 9]
    assert progress == ["run 1 of 2", "run 2 of 2"]


def test_a_run_whose_driver_is_busy_is_flagged_in_its_rows():
    def working(load: Load, progress) -> Report:
        end = time.process_time() + 0.05
        while time.process_time() < end:  # the driver itself works
            pass
        return Report("x", {}, [Row("s", "v", 1.0)])

    def waiting(load: Load, progress) -> Report:
        time.sleep(0.2)  # the driver waits on the system
        return Report("x", {}, [Row("s", "v", 1.0)])

    # the threshold lowered, so the check does not depend on how loaded this machine is
    row = repeated(working, Load(messages=1000), 1, lambda s: None, busy=0.01).rows[0]
    assert "driver process at" in row.notes and "of a core in run 1" in row.notes
    row = repeated(waiting, Load(messages=1000), 1, lambda s: None, busy=0.5).rows[0]
    assert "driver process" not in row.notes


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_repeats_must_be_a_whole_number_of_one_or_more(bad):
    with pytest.raises(InvalidArgument, match="--repeats"):
        repeated(lambda load, progress: Report("x", {}), Load(), bad, print)


def test_the_table_shows_the_servers_own_cpu_only_when_a_row_measured_it():
    plain = Report("x", {}, [Row("s", "v", 1.0, cpu_s_per_1k=0.004)]).table()
    assert "server s/1k" not in plain
    peers = Report(
        "peers",
        {},
        [
            Row("raybroker", "v", 1.0, cpu_s_per_1k=0.0065, server_cpu_s_per_1k=0.0031),
            Row("raw-sqlite", "v", 1.0, cpu_s_per_1k=0.005),  # no server process of its own
        ],
    ).table()
    head, _, broker, raw = peers.splitlines()[1:]
    assert head.split()[7:10] == ["cpu", "s/1k", "server"]
    assert broker.split()[5:7] == ["0.0065", "0.0031"]
    assert raw.split()[5:7] == ["0.0050", "-"]
