"""The peers bench's workloads (sizes, batch shapes, bodies) and its driver, run on the raw
SQLite peer (a real SQLite file, no Ray, no servers), with faults injected into what a consumer
acknowledges to show they reach the row's counts."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from actors.tools.bench.peers import driver
from actors.tools.bench.peers.checker import check
from actors.tools.bench.peers.raw_sqlite import RawSqlite
from actors.tools.bench.peers.workloads import (
    BODY_BYTES,
    CLIENTS,
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


class Faulty(RawSqlite):
    """The raw SQLite peer whose consumer mis-acknowledges: `fault` rewrites the first
    non-empty list of messages it confirms."""

    def __init__(self, workdir: str, fault: str) -> None:
        super().__init__(workdir)
        self.fault = fault
        self.done = False

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


def measure(peer: RawSqlite, w: Workload) -> driver.Measurement:
    async def go() -> driver.Measurement:
        await peer.open(w)
        try:
            return await driver.drive(w, peer)
        finally:
            await peer.close()

    return asyncio.run(go())


@pytest.mark.parametrize("variant", ["bulk-one-conversation", "bulk-spread", "paced"])
def test_the_driver_runs_a_workload_end_to_end_on_raw_sqlite(tmp_path, variant):
    w = by_variant(Load(messages=3000))[variant]
    m = measure(RawSqlite(str(tmp_path)), w)
    assert len(m.acked) == w.messages and not m.stalled
    assert check(expected(w), m.acked).clean
    assert len(m.latencies_ms) == w.messages and min(m.latencies_ms) >= 0
    assert m.elapsed_s > 0 and m.cpu_s >= 0
    if w.rate:  # held to the rate: no faster than messages / rate
        assert m.elapsed_s >= (w.messages - w.batch) / w.rate


def test_many_clients_run_concurrently_on_raw_sqlite(tmp_path):
    w = by_variant(Load(messages=2000))["many-clients"]
    m = measure(RawSqlite(str(tmp_path)), w)
    assert check(expected(w), m.acked).clean and len(m.acked) == 200


@pytest.mark.parametrize(
    "fault, counts", [("lose", (1, 0, 0)), ("double", (0, 1, 0)), ("invert", (0, 0, 1))]
)
def test_a_consumer_that_loses_doubles_or_inverts_is_caught(tmp_path, monkeypatch, fault, counts):
    monkeypatch.setattr(driver, "STALL_S", 0.5)  # the lost message never comes: stop waiting
    w = by_variant(Load(messages=2000))["bulk-one-conversation"]
    m = measure(Faulty(str(tmp_path), fault), w)
    verdict = check(expected(w), m.acked)
    assert (verdict.lost, verdict.doubled, verdict.out_of_order) == counts
    assert m.stalled == (fault == "lose")
