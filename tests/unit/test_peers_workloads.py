"""The peers bench's workloads (sizes, batch shapes, bodies) and its driver, which runs the
producer and consumers in processes of their own: here on the raw SQLite peer (a real SQLite file,
no Ray, no servers), with faults injected into what a consumer acknowledges to show they reach
the row's counts."""

from __future__ import annotations

import sqlite3
from collections import Counter

import pytest

from actors.tools.bench.peers import driver
from actors.tools.bench.peers.checker import check
from actors.tools.bench.peers.raw_sqlite import RawSqlite, RawSqliteClient
from actors.tools.bench.peers.workloads import (
    BODY_BYTES,
    CLIENTS,
    PROCESSES,
    Workload,
    batches,
    decode,
    encode,
    expected,
    plan,
)
from actors.tools.bench.report import Load


def by_variant(load: Load) -> dict[str, Workload]:
    return {w.variant: w for w in plan(load)}


def test_a_body_is_100_bytes_and_carries_conversation_seq_and_send_time():
    body = encode(42, 7, 123.25)
    assert len(body) == BODY_BYTES
    assert decode(body) == (42, 7, 123.25)


def test_sizes_follow_the_load():
    w = by_variant(Load(messages=200_000))
    assert w["bulk-one-conversation"].messages == w["bulk-spread"].messages == 200_000
    assert w["many-clients"].messages == 20_000 and w["many-clients"].clients == CLIENTS
    assert w["paced"].messages == 50_000 and w["paced"].rate == 10_000
    small = by_variant(Load(messages=1000))
    assert small["many-clients"].messages == 200  # at least two per client
    assert small["paced"].messages == 200


def test_one_conversation_batches_each_hold_one_conversation_in_sequence():
    w = by_variant(Load(messages=5000, dialogs=3, batch=1000))["bulk-one-conversation"]
    calls = list(batches(w))
    assert [len(c) for c in calls] == [1000] * 5
    assert [{conv for conv, _ in c} for c in calls] == [{0}, {1}, {2}, {0}, {1}]
    assert calls[3][0] == (0, 1000) and calls[3][-1] == (0, 1999)  # conversation 0 continues
    assert expected(w) == {0: 2000, 1: 2000, 2: 1000}


def test_spread_batches_hold_every_conversation_evenly():
    w = by_variant(Load(messages=2000))["bulk-spread"]
    calls = list(batches(w))
    assert len(calls) == 2
    for n, call in enumerate(calls):
        assert Counter(conv for conv, _ in call) == {c: 10 for c in range(100)}
        assert [seq for conv, seq in call if conv == 5] == list(range(10 * n, 10 * n + 10))


def test_many_clients_send_one_message_per_call_on_their_own_conversation():
    w = by_variant(Load(messages=2000))["many-clients"]
    calls = list(batches(w))
    assert len(calls) == 200 and all(len(c) == 1 for c in calls)
    assert expected(w) == {c: 2 for c in range(CLIENTS)}
    assert w.per_call == 1 and w.consumers == CLIENTS


class FaultyClient(RawSqliteClient):
    """The raw SQLite client whose consumer mis-acknowledges: its `fault` rewrites the first
    list of two messages or more it confirms (run in the consumer's process)."""

    def __init__(self, params: dict) -> None:
        super().__init__(params)
        self.fault, self.done = params["fault"], False

    def take(self, one: bool) -> list[driver.Received]:
        got = super().take(one)
        if got and not self.done and len(got) >= 2:
            self.done = True
            if self.fault == "lose":
                got = got[1:]
            elif self.fault == "double":
                got = [got[0], *got]
            elif self.fault == "invert":
                got = [got[1], got[0], *got[2:]]
        return got


class Faulty(RawSqlite):
    client = f"{__name__}:FaultyClient"

    def __init__(self, workdir: str, fault: str) -> None:
        super().__init__(workdir)
        self.fault = fault

    def open(self, w: Workload) -> dict:
        return {**super().open(w), "fault": self.fault}


@pytest.fixture(scope="module")
def pool():
    with driver.Pool() as p:
        yield p


def measure(system: RawSqlite, w: Workload, pool: driver.Pool) -> driver.Measurement:
    params = system.open(w)
    try:
        return driver.drive(w, system, params, pool)
    finally:
        system.close(w)


@pytest.mark.parametrize("variant", ["bulk-one-conversation", "bulk-spread", "paced"])
def test_the_driver_runs_a_workload_in_processes_of_its_own_on_raw_sqlite(tmp_path, variant, pool):
    w = by_variant(Load(messages=3000))[variant]
    m = measure(RawSqlite(str(tmp_path)), w, pool)
    assert len(m.acked) == w.messages and not m.stalled
    assert check(expected(w), m.acked).clean
    assert len(m.latencies_ms) == w.messages and min(m.latencies_ms) >= 0
    assert m.elapsed_s > 0 and m.cpu_s > 0  # the producer's and consumer's processes' CPU
    if w.rate:  # held to the rate: no faster than messages / rate
        assert m.elapsed_s >= (w.messages - w.batch) / w.rate


def test_many_clients_run_in_several_processes_and_their_logs_merge_in_order(tmp_path, pool):
    w = by_variant(Load(messages=2000))["many-clients"]
    producers, consumers = driver.layout(w, CLIENTS)
    assert len(producers) == len(consumers) == PROCESSES
    assert sorted(c for share in producers for c in share) == list(range(CLIENTS))
    assert sorted(c for share in consumers for c in share) == list(range(CLIENTS))
    m = measure(RawSqlite(str(tmp_path), "power-safe"), w, pool)
    assert check(expected(w), m.acked).clean and len(m.acked) == 200


def test_a_bulk_workload_runs_one_producer_and_a_process_per_consumer():
    w = by_variant(Load(messages=2000))["bulk-spread"]
    assert driver.layout(w, 4) == ([[-1]], [[0], [1], [2], [3]])


@pytest.mark.parametrize(
    "fault, counts", [("lose", (1, 0, 0)), ("double", (0, 1, 0)), ("invert", (0, 0, 1))]
)
def test_a_consumer_that_loses_doubles_or_inverts_is_caught(tmp_path, monkeypatch, fault, counts):
    monkeypatch.setattr(driver, "STALL_S", 1.0)  # the lost message never comes: stop waiting
    w = by_variant(Load(messages=2000))["bulk-one-conversation"]
    with driver.Pool() as own:  # a run that stalls ends with its processes mid-task
        m = measure(Faulty(str(tmp_path), fault), w, own)
    verdict = check(expected(w), m.acked)
    assert (verdict.lost, verdict.doubled, verdict.out_of_order) == counts
    assert m.stalled == (fault == "lose")


@pytest.mark.parametrize("durability, level", [("default", 1), ("power-safe", 2)])
def test_raw_sqlite_reports_the_synchronous_level_it_runs_at(tmp_path, durability, level):
    settings = RawSqlite(str(tmp_path), durability).settings()
    assert settings["synchronous"] == level and settings["journal_mode"] == "wal"
    assert settings["secure_delete"] == 2  # FAST, as the broker's store
    assert settings["sqlite"] == sqlite3.sqlite_version


def test_a_run_of_three_repeats_reports_three_runs_and_their_median_per_row():
    from actors.tools.bench.peers.run import run

    progress: list[str] = []
    report = run(Load(messages=1000), progress.append, systems=["raw-sqlite"], repeats=3)
    assert report.params["repeats"] == 3
    assert [(r.durability, r.variant) for r in report.rows] == [
        (d, w.variant) for w in plan(Load(messages=1000)) for d in ("default", "power-safe")
    ]
    for row in report.rows:
        assert len(row.runs) == 3 and row.messages_per_s == sorted(row.runs)[1], row
        assert "median of 3 runs" in row.notes and (row.lost, row.doubled) == (0, 0)
    assert sum("warm-up" in line for line in progress) == len(report.rows)
    assert sum("run 3/3" in line for line in progress) == len(report.rows)

    progress.clear()  # a smoke test's run (--quick): the repeats alone
    report = run(
        Load(messages=1000), progress.append, systems=["raw-sqlite"], repeats=1, warm_up=False
    )
    assert not any("warm-up" in line for line in progress)
    assert sum("run 1/1" in line for line in progress) == len(report.rows)
