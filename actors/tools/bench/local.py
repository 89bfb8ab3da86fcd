"""`raybroker bench local`: one broker, N messages over K dialogs, sent in batches, received by
conversation group, committed, durable (a SQLite file in WAL mode). Beside it, in the same run and
process, the raw SQLite work the broker cannot avoid: the same rows inserted in the same batches
into the same table and index, then selected by group and deleted. And a producer whose every
call sends on every dialog, serial and then pipelined: the broker applies one client's calls in
the order issued (actors.calls.ordering), and the ratio of the two rows is what pipelining still
buys. Last, Service Broker's everyday shape: a dialog per message, begun, ended by the target, ended
by the initiator.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict

import psutil

from actors import Begin, End, Queue, Send, Service, start_broker
from actors.calls.envelope import ReceivedGroup
from actors.remote.client import Broker
from actors.remote.runtime import ensure_ray
from actors.store.audit import read_all
from actors.tools.bench.report import DEFAULT_LOAD, Load, Progress, Report, Row, percentile


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
            progress(f"raybroker: {messages:,} messages, pipelined send and receive+commit")
            e2e, p50, p99, cpu = asyncio.run(
                _pipelined(broker, handles, messages, batch, body, max_groups, readers, inflight)
            )
            report.rows.append(
                Row(
                    "raybroker",
                    E2E,
                    e2e,
                    p50,
                    p99,
                    cpu,
                    "latency = send to commit, under full load",
                    vs=[["raw-sqlite", "insert, then select+delete", "raw-sqlite end-to-end"]],
                )
            )
            progress("raybroker: send only, then receive+commit only")
            send_rate, recv_rate = asyncio.run(
                _phases(broker, handles, messages, batch, body, max_groups, readers, inflight)
            )
            report.rows.append(
                Row(
                    "raybroker",
                    "send only",
                    send_rate,
                    vs=[["raw-sqlite", "insert only", "raw-sqlite insert"]],
                )
            )
            report.rows.append(Row("raybroker", "receive+commit only", recv_rate,
                                   vs=[["raw-sqlite", "select+delete only",
                                        "raw-sqlite select+delete"]]))  # fmt: skip
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
                    notes=note,
                    vs=[["raybroker", "serial producer (1 in flight)", "serial"]],
                )
            )
            one_shots = max(ONE_SHOT_PER_CALL, messages // 10)
            progress(f"raybroker: one dialog per message ({one_shots:,} dialogs)")
            one_shot = asyncio.run(dialog_per_message(broker, one_shots, body))
            one_shot.vs = [["raybroker", E2E, "end-to-end's messages/s"]]
            report.rows.append(one_shot)
        finally:
            broker.stop()
        progress("raw-sqlite: the same rows, inserted, selected by group, deleted")
        raw = raw_sqlite(
            os.path.join(tmp, "raw.sqlite"), messages, dialogs, batch, body, max_groups
        )
        report.rows += raw
    return report


def _setup(broker: Broker, dialogs: int) -> list[str]:
    broker.create(Queue("InitiatorQueue"))
    broker.create(Queue("TargetQueue"))
    broker.create(Service("Initiator", "InitiatorQueue"))
    broker.create(Service("Target", "TargetQueue", ["DEFAULT"]))
    return broker.apply([Begin("Initiator", "Target") for _ in range(dialogs)])["handles"]


class Cpu:
    """CPU seconds used by this process and the brokers' (each process counted once)."""

    def __init__(self, *brokers: Broker) -> None:
        pids = dict.fromkeys([os.getpid(), *(b.info()["pid"] for b in brokers)])
        self.procs = [psutil.Process(pid) for pid in pids]
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
    cpu = Cpu(broker)
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


E2E = "end-to-end: send || receive+commit"
ONE_SHOT_PER_CALL = 500  # one dialog per message: dialogs begun (each with its message) per call
ONE_SHOT_GROUPS = 100  # groups (here: dialogs) one receive takes at most
ONE_SHOT_OPEN = 2_000  # the producer begins more only while fewer dialogs than this are open
ONE_SHOT_STALL_S = 10.0  # the readers give up when nothing came for this long (then: lost)


async def dialog_per_message(broker: Broker, dialogs: int, body: bytes) -> Row:
    """Service Broker's everyday shape: every message on a dialog of its own. Each producer call
    begins ONE_SHOT_PER_CALL dialogs and sends one message on each; the target's reader receives
    and ends each dialog in its commit; the initiator's reader receives the EndDialog and ends
    its side. The producer keeps fewer than ONE_SHOT_OPEN dialogs open (begun, their EndDialog
    not yet received), as a steady load would. The rate is dialogs per second, from the first
    call until the last EndDialog is received; the notes give it over the first and the last
    fifth of the dialogs too (each dialog adds two endpoints and two groups to the store and to
    the broker's memory, which must not slow the later ones down). A message that never comes
    stops the readers after ONE_SHOT_STALL_S without news and counts as lost; one that came
    twice fails the run (its dialog is ended already)."""
    broker.create(Queue("OneShotInit"))
    broker.create(Queue("OneShotTarget"))
    broker.create(Service("OneShotInitiator", "OneShotInit"))
    broker.create(Service("OneShotTarget", "OneShotTarget", ["DEFAULT"]))
    seen: list[int] = []  # the producer's numbers, as the target received them
    ended_at: list[float] = []  # when each EndDialog reached the initiator
    ended = asyncio.Event()  # set when more EndDialogs came
    news = [time.perf_counter()]  # when a reader last got something

    async def produce() -> None:
        for first in range(0, dialogs, ONE_SHOT_PER_CALL):
            while first - len(ended_at) >= ONE_SHOT_OPEN - ONE_SHOT_PER_CALL:
                ended.clear()
                try:
                    await asyncio.wait_for(ended.wait(), ONE_SHOT_STALL_S)
                except TimeoutError:
                    return  # the readers stop too; what was not sent counts as lost
            ops: list[Begin | Send] = []
            for n in range(first, min(first + ONE_SHOT_PER_CALL, dialogs)):
                begin = Begin("OneShotInitiator", "OneShotTarget")
                ops += [begin, Send(begin.handle, "DEFAULT", [n.to_bytes(8, "big") + body])]
            await broker.aio.apply(ops)

    async def end_each(queue: str, took: Callable[[list[ReceivedGroup]], None]) -> None:
        groups: list[ReceivedGroup] = []
        while True:
            ends = [End(m.conversation_handle) for g in groups for m in g.messages]
            over = len(ended_at) >= dialogs  # every dialog is over (or news stopped coming)
            if over or time.perf_counter() - news[0] > ONE_SHOT_STALL_S:
                if groups:  # end what was taken last
                    await broker.aio.commit(groups, ops=ends)
                return
            groups = await broker.aio.receive(
                queue, max_groups=ONE_SHOT_GROUPS, wait=0.2, commit=groups, ops=ends
            )
            if groups:
                news[0] = time.perf_counter()
                took(groups)

    def at_target(groups: list[ReceivedGroup]) -> None:
        seen.extend(int.from_bytes(m.body[:8], "big") for g in groups for m in g.messages)

    def at_initiator(groups: list[ReceivedGroup]) -> None:
        ended_at.extend(itertools.repeat(time.perf_counter(), sum(len(g) for g in groups)))
        ended.set()

    cpu = Cpu(broker)
    t0 = time.perf_counter()
    await asyncio.gather(
        produce(), end_each("OneShotTarget", at_target), end_each("OneShotInit", at_initiator)
    )
    done, fifth = len(ended_at), max(1, dialogs // 5)
    first = fifth / (ended_at[fifth - 1] - t0) if done >= fifth else 0.0
    last = fifth / (ended_at[-1] - ended_at[-fifth - 1]) if done > fifth else first
    distinct = len(set(seen))
    return Row(
        "raybroker",
        "one dialog per message: begin+send, receive+end on both sides",
        done / ((ended_at[-1] if ended_at else time.perf_counter()) - t0),
        cpu_s_per_1k=cpu.per_1k(dialogs),
        notes=f"dialogs/s; first fifth {first:,.0f}/s, last fifth {last:,.0f}/s",
        lost=dialogs - distinct,
        doubled=len(seen) - distinct,
    )


# The floor a row-per-message store cannot go below (raybroker's own layout before segments):
# a row per message and an index on (group, id), written and deleted a batch at a time.
ROW_PER_MESSAGE = """
CREATE TABLE messages (
    id INTEGER PRIMARY KEY, group_no INTEGER NOT NULL, endpoint_no INTEGER NOT NULL,
    seq INTEGER NOT NULL, type TEXT NOT NULL, body BLOB NOT NULL, status INTEGER NOT NULL,
    sent_at REAL NOT NULL, arrived_at REAL NOT NULL);
CREATE INDEX messages_group ON messages (group_no, id);
"""


def raw_sqlite(
    path: str, messages: int, dialogs: int, batch: int, body: bytes, max_groups: int
) -> list[Row]:
    """Plain sqlite3, a row per message (ROW_PER_MESSAGE), the broker's durability and batch
    sizes; no broker logic."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("PRAGMA secure_delete=FAST")  # as the broker's store (Debian's default is ON)
    db.executescript(ROW_PER_MESSAGE)
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
