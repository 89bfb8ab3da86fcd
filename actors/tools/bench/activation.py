"""`raybroker bench activation`: how fast activated readers drain a queue, with 1, 2 and 4 pool
readers and with internal activation, and how long from a first message to the first handler call.

Beside them, in the same run: the same broker's receive+commit rate driven by a client loop with
no activation, the plain BrokerCore receive+commit loop in this process (no Ray: the single
broker's raw receive/commit rate), and raw SQLite select+delete of the same rows.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
import uuid
from dataclasses import asdict

from actors import Begin, Queue, Send, Service, start_broker
from actors.core import BrokerCore
from actors.model.catalog import Activation
from actors.remote.client import Broker
from actors.remote.runtime import ensure_ray
from actors.store.database import Store
from actors.tools.bench.local import raw_sqlite, receive_all
from actors.tools.bench.report import DEFAULT_LOAD, Load, Progress, Report, Row, percentile

REPEATS = 1  # runs per figure within one run of the scenario (`--repeats` takes the median)
DISCARD = "actors.activation.handlers:discard"
STAMP = "actors.activation.handlers:stamp_first_call"
CLIENT_LOOP = "client receive+commit loop, no activation"
CORE = "in-process BrokerCore receive+commit"


def run(
    load: Load = DEFAULT_LOAD, max_groups: int = 8, trials: int = 7, progress: Progress = print
) -> Report:
    messages, dialogs, batch = load.messages, load.dialogs, load.batch
    params = {**asdict(load), "max_groups": max_groups, "latency_trials": trials}
    report = Report("activation", params)
    ensure_ray()
    with tempfile.TemporaryDirectory(prefix="raybroker-bench-") as tmp:

        def fresh(tag: str) -> Broker:
            return start_broker(
                f"bench-act-{tag}-{uuid.uuid4().hex[:6]}",
                os.path.join(tmp, f"{tag}-{uuid.uuid4().hex[:6]}.sqlite"),
            )

        progress("baseline: the broker's receive+commit driven by a client loop, no activation")
        b = fresh("client")
        try:
            handles = _define(b, None, dialogs)
            rates = []
            for _ in range(REPEATS):
                _fill(b, handles, messages, batch)
                t0 = time.perf_counter()
                asyncio.run(receive_all(b, messages, max_groups, readers=2, queue="WorkQueue"))
                rates.append(messages / (time.perf_counter() - t0))
            client_rate = statistics.median(rates)
        finally:
            b.stop()
        core_rate = _core_loop(
            os.path.join(tmp, "core.sqlite"), messages, dialogs, batch, max_groups
        )
        raw = raw_sqlite(
            os.path.join(tmp, "raw.sqlite"), messages, dialogs, batch, b"x" * 100, max_groups
        )[2]
        variants = [("pool", 1), ("pool", 2), ("pool", 4), ("internal", 1)]
        for placement, readers in variants:
            progress(f"activation: {placement}, {readers} reader(s)")
            b = fresh(f"{placement}{readers}")
            try:
                act = Activation(
                    DISCARD,
                    max_readers=readers,
                    placement=placement,
                    max_groups=max_groups,
                    idle_timeout=2.0,
                    enabled=False,
                )
                rate = _drain(b, act, messages, dialogs, batch)
                lat, cold = _first_call_latency(b, placement, trials) if readers == 1 else ([], 0)
            finally:
                b.stop()
            notes = "drain after the first handled batch"
            if lat:
                notes += (
                    f"; p50/p99 = first message to first handler call from idle "
                    f"({trials} trials; the very first, cold: {cold:.0f} ms)"
                )
            report.rows.append(
                Row(
                    "raybroker",
                    f"activation {placement}, {readers} reader(s)",
                    rate,
                    percentile(lat, 0.5),
                    percentile(lat, 0.99),
                    None,
                    notes,
                    vs=[
                        ["raybroker-core", CORE, "in-process core"],
                        ["raybroker", CLIENT_LOOP, "client loop"],
                    ],  # fmt: skip
                )
            )
    report.rows.append(
        Row(
            "raybroker",
            CLIENT_LOOP,
            client_rate,
            notes="2 async readers through the actor",
        )
    )
    report.rows.append(
        Row(
            "raybroker-core",
            CORE,
            core_rate,
            notes="no Ray: the single broker's own receive/commit rate",
        )
    )
    report.rows.append(Row(raw.system, raw.variant, raw.messages_per_s))
    return report


def _define(b: Broker, act: Activation | None, dialogs: int) -> list[str]:
    b.create(Queue("InitiatorQueue"))
    b.create(Queue("WorkQueue", activation=act))
    b.create(Service("Initiator", "InitiatorQueue"))
    b.create(Service("Work", "WorkQueue", ["DEFAULT"]))
    return b.apply([Begin("Initiator", "Work") for _ in range(dialogs)])["handles"]


def _fill(b: Broker | BrokerCore, handles: list[str], messages: int, batch: int) -> None:
    body = b"x" * 100
    for i in range(messages // batch):
        b.apply([Send(handles[i % len(handles)], "DEFAULT", [body] * batch)])


def _drain(b: Broker, act: Activation, messages: int, dialogs: int, batch: int) -> float:
    """Fill the queue with activation off, turn it on, and time the drain from the first
    handled batch to an empty queue (reader start-up is measured apart, as first-call
    latency). When the first turn took every message (a small load), there is no drain after
    it to time: the rate is then from turning activation on to an empty queue, reader start-up
    included. The median of REPEATS runs."""
    handles = _define(b, act, dialogs)
    rates = []
    for _ in range(REPEATS):
        _fill(b, handles, messages, batch)
        on = time.perf_counter()
        b.alter("queue", "WorkQueue", activation={"enabled": True})
        while (depth := b.queues()["WorkQueue"]["depth"]) == messages:
            time.sleep(0.002)  # polling the condition, with the bench's own resolution
        t0 = time.perf_counter()
        if depth == 0:
            rates.append(messages / (t0 - on))
        else:
            while b.queues()["WorkQueue"]["depth"]:
                time.sleep(0.01)
            rates.append(depth / (time.perf_counter() - t0))
        b.alter("queue", "WorkQueue", activation={"enabled": False})
        while b.queues()["WorkQueue"]["readers"]:
            time.sleep(0.01)
    return statistics.median(rates)


def _first_call_latency(b: Broker, placement: str, trials: int) -> tuple[list[float], float]:
    """From an idle queue (no readers running; a pool keeps one warm spare actor), send one
    message and read back the time the handler first saw it. The first trial, whose reader
    process may still be starting, is returned apart (cold) from the `trials` warm ones."""
    b.alter(
        "queue", "WorkQueue", activation={"handler": STAMP, "idle_timeout": 0.3, "enabled": True}
    )
    out = []
    for _ in range(trials + 1):
        while b.queues()["WorkQueue"]["readers"]:
            time.sleep(0.01)
        time.sleep(0.3)  # let the pool's spare settle (it is made on the broker's clock tick)
        h = b.begin_dialog("Initiator", "Work")
        before = {g["conversation_group_id"] for g in b.groups("WorkQueue")}
        t0 = time.time()
        b.send(h, "DEFAULT", b"first")
        while True:
            stamps = [
                g["state"]
                for g in b.groups("WorkQueue")
                if g["conversation_group_id"] not in before and g["state"]
            ]
            if stamps:
                out.append((float(stamps[0]) - t0) * 1000)
                break
            time.sleep(0.002)
    return sorted(out[1:]), out[0]


def _core_loop(path: str, messages: int, dialogs: int, batch: int, max_groups: int) -> float:
    """The plain BrokerCore on a file: receive+commit rate with no Ray at all (median of
    REPEATS runs)."""
    core = BrokerCore(Store(path))
    core.create(Queue("InitiatorQueue"))
    core.create(Queue("WorkQueue"))
    core.create(Service("Initiator", "InitiatorQueue"))
    core.create(Service("Work", "WorkQueue", ("DEFAULT",)))
    handles = core.apply([Begin("Initiator", "Work") for _ in range(dialogs)])["handles"]
    rates = []
    for _ in range(REPEATS):
        _fill(core, handles, messages, batch)
        t0 = time.perf_counter()
        done = 0
        while done < messages:
            groups = core.receive("WorkQueue", max_groups=max_groups)
            core.settle(commit=[g.lock_id for g in groups])
            done += sum(len(g) for g in groups)
        rates.append(messages / (time.perf_counter() - t0))
    core.store.close()
    return statistics.median(rates)
