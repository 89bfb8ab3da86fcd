"""`raybroker bench local`: one broker, N messages over K dialogs, sent in batches, received by
conversation group, committed, durable (a SQLite file in WAL mode). Beside it, in the same run and
process, the raw SQLite work the broker cannot avoid: the same rows inserted in the same batches
into the same table and index, then selected by group and deleted. And a producer whose every
call sends on every dialog, serial and then pipelined: the broker applies one client's calls in
the order issued (actors.ordering), and the ratio of the two rows is what pipelining still buys.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import tempfile
import time
import uuid
from dataclasses import asdict

import psutil

from .. import Begin, Queue, Send, Service, start_broker
from ..audit import read_all
from ..remote.client import Broker
from ..remote.runtime import ensure_ray
from ..store import SCHEMA
from .report import DEFAULT_LOAD, Load, Progress, Report, Row, percentile

REPEATS = 3  # the end-to-end figure is the median run


def run(
    load: Load = DEFAULT_LOAD,
    body_bytes: int = 100,
    max_groups: int = 16,
    readers: int = 1,
    inflight: int = 4,
    progress: Progress = print,
) -> Report:
    messages, dialogs, batch = load.messages, load.dialogs, load.batch
    options = {"body_bytes": body_bytes, "max_groups": max_groups, "readers": readers}
    report = Report("local", {**asdict(load), **options, "inflight": inflight})
    body = os.urandom(body_bytes)
    with tempfile.TemporaryDirectory(prefix="raybroker-bench-") as tmp:
        ensure_ray()
        broker = start_broker(f"bench-local-{uuid.uuid4().hex[:8]}", os.path.join(tmp, "b.sqlite"))
        try:
            handles = _setup(broker, dialogs)
            warm = max(batch, messages // 10 // batch * batch)
            progress(f"raybroker: warm-up ({warm:,} messages)")
            asyncio.run(
                _pipelined(broker, handles, warm, batch, body, max_groups, readers, inflight)
            )
            progress(
                f"raybroker: {messages:,} messages, pipelined send and receive+commit "
                f"(median of {REPEATS} runs)"
            )
            runs = sorted(
                asyncio.run(
                    _pipelined(
                        broker, handles, messages, batch, body, max_groups, readers, inflight
                    )
                )
                for _ in range(REPEATS)
            )
            e2e, p50, p99, cpu = runs[len(runs) // 2]
            report.rows.append(
                Row(
                    "raybroker",
                    "end-to-end: send || receive+commit",
                    e2e,
                    p50,
                    p99,
                    cpu,
                    f"median of {REPEATS} runs; latency = send to commit, under full load",
                )
            )
            progress("raybroker: send only, then receive+commit only")
            send_rate, recv_rate = asyncio.run(
                _phases(broker, handles, messages, batch, body, max_groups, readers, inflight)
            )
            report.rows.append(Row("raybroker", "send only", send_rate))
            report.rows.append(Row("raybroker", "receive+commit only", recv_rate))
            progress("raybroker: a producer on shared dialogs, serial, then pipelined")
            serial, piped = (
                asyncio.run(_shared(broker, handles, messages, batch, body, n, max_groups, readers))
                for n in (1, inflight)
            )
            note = "send only; every call sends on every dialog, applied in the order issued"
            report.rows.append(
                Row("raybroker", "serial producer (1 in flight)", serial, notes=note)
            )
            report.rows.append(
                Row(
                    "raybroker",
                    f"producer pipelined on shared dialogs ({inflight} in flight)",
                    piped,
                    notes=f"{piped / serial:.2f}x serial; {note}",
                )
            )
        finally:
            broker.stop()
        progress("raw-sqlite: the same rows, inserted, selected by group, deleted")
        raw = raw_sqlite(
            os.path.join(tmp, "raw.sqlite"), messages, dialogs, batch, body, max_groups
        )
        report.rows += raw
    raw_e2e = raw[0].messages_per_s
    report.rows[0].notes += f"; {e2e / raw_e2e:.2f}x raw-sqlite end-to-end"
    report.rows[1].notes = f"{send_rate / raw[1].messages_per_s:.2f}x raw-sqlite insert"
    report.rows[2].notes = f"{recv_rate / raw[2].messages_per_s:.2f}x raw-sqlite select+delete"
    return report


def _setup(broker: Broker, dialogs: int) -> list[str]:
    broker.create(Queue("InitiatorQueue"))
    broker.create(Queue("TargetQueue"))
    broker.create(Service("Initiator", "InitiatorQueue"))
    broker.create(Service("Target", "TargetQueue", ["DEFAULT"]))
    return broker.apply([Begin("Initiator", "Target") for _ in range(dialogs)])["handles"]


class _Cpu:
    """CPU seconds used by this process and the broker's."""

    def __init__(self, broker: Broker) -> None:
        self.procs = [psutil.Process(), psutil.Process(broker.info()["pid"])]
        self.start = self._now()

    def _now(self) -> float:
        return sum(p.cpu_times().user + p.cpu_times().system for p in self.procs)

    def per_1k(self, messages: int) -> float:
        return (self._now() - self.start) / (messages / 1000)


async def send_all(
    broker: Broker,
    handles: list[str],
    messages: int,
    batch: int,
    body: bytes,
    inflight: int,
    message_type: str = "DEFAULT",
) -> None:
    """`messages` in calls of `batch`, each call to the next handle in turn, `inflight` at once."""
    gate = asyncio.Semaphore(inflight)
    bodies = [body] * batch

    async def one(i: int) -> None:
        async with gate:
            await broker.aio.apply([Send(handles[i % len(handles)], message_type, bodies)])

    await asyncio.gather(*(one(i) for i in range(messages // batch)))


async def receive_all(
    broker: Broker, messages: int, max_groups: int, readers: int, queue: str = "TargetQueue"
) -> None:
    done = 0

    async def reader() -> None:
        nonlocal done
        groups: list = []
        while done < messages:
            # commit the previous turn's groups and receive the next ones in one call
            groups = await broker.aio.receive(queue, max_groups=max_groups, wait=0.2, commit=groups)
            done += sum(len(g) for g in groups)
        if groups:
            await broker.aio.commit(groups)

    await asyncio.gather(*(reader() for _ in range(readers)))


async def _pipelined(broker, handles, messages, batch, body, max_groups, readers, inflight):
    _, audit_from = read_all(broker.audit)
    cpu = _Cpu(broker)
    t0 = time.perf_counter()
    await asyncio.gather(
        send_all(broker, handles, messages, batch, body, inflight),
        receive_all(broker, messages, max_groups, readers),
    )
    elapsed = time.perf_counter() - t0
    per_1k = cpu.per_1k(messages)
    records, _ = read_all(broker.audit, audit_from)
    lat = sorted((r["committed_at"] - r["sent_at"]) * 1000 for r in records)
    return messages / elapsed, percentile(lat, 0.5), percentile(lat, 0.99), per_1k


async def _phases(broker, handles, messages, batch, body, max_groups, readers, inflight):
    t0 = time.perf_counter()
    await send_all(broker, handles, messages, batch, body, inflight)
    t1 = time.perf_counter()
    await receive_all(broker, messages, max_groups, readers)
    t2 = time.perf_counter()
    return messages / (t1 - t0), messages / (t2 - t1)


async def _shared(broker, handles, messages, batch, body, inflight, max_groups, readers) -> float:
    """Send-only rate of one producer whose calls (`inflight` at a time) each send on every
    dialog, so calls in flight share dialogs; the queue is drained afterwards, untimed."""
    per = max(1, batch // len(handles))  # bodies per dialog per call: `batch` messages a call
    calls = max(1, messages // (per * len(handles)))
    gate = asyncio.Semaphore(inflight)
    bodies = [body] * per

    async def one() -> None:
        async with gate:
            await broker.aio.apply([Send(handles, "DEFAULT", bodies)])

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(calls)))
    rate = calls * per * len(handles) / (time.perf_counter() - t0)
    await receive_all(broker, calls * per * len(handles), max_groups, readers)
    return rate


def raw_sqlite(
    path: str, messages: int, dialogs: int, batch: int, body: bytes, max_groups: int
) -> list[Row]:
    """Plain sqlite3, same table, index, durability and batch sizes; no broker logic."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.executescript(SCHEMA)
    now = time.time()
    next_id = 1
    t0 = time.perf_counter()
    for i in range(messages // batch):
        g = i % dialogs + 1
        rows = [(next_id + j, g, g, j, "DEFAULT", body, 0, now, now) for j in range(batch)]
        next_id += batch
        db.execute("BEGIN IMMEDIATE")
        db.executemany("INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        db.execute("COMMIT")
    t1 = time.perf_counter()
    groups = list(range(1, min(dialogs, messages // batch) + 1))  # the groups that got rows
    got = 0
    for i in range(0, len(groups), max_groups):
        db.execute("BEGIN IMMEDIATE")
        for g in groups[i : i + max_groups]:
            rows = db.execute(
                "SELECT id, endpoint_no, seq, type, body, sent_at, arrived_at FROM messages "
                "WHERE group_no=? AND status=0 ORDER BY id",
                (g,),
            ).fetchall()
            got += len(rows)
            db.execute(
                "DELETE FROM messages WHERE group_no=? AND id BETWEEN ? AND ?",
                (g, rows[0][0], rows[-1][0]),
            )
        db.execute("COMMIT")
    t2 = time.perf_counter()
    db.close()
    assert got == messages, (got, messages)
    return [
        Row("raw-sqlite", "insert, then select+delete", messages / (t2 - t0)),
        Row("raw-sqlite", "insert only", messages / (t1 - t0)),
        Row("raw-sqlite", "select+delete only", messages / (t2 - t1)),
    ]
