"""`raybroker bench dialogs`: many open dialogs in bounded memory.

One broker actor, its store a SQLite file, the default limits. N dialogs (`--messages`) are
begun with one message each, and the target receives and commits every message: N open, idle
dialogs (2N endpoints and 2N conversation groups on the broker). Measured:

- the broker process's RSS per open dialog (its RSS with the N dialogs open, less its RSS
  before the first, over N);
- the restart: the broker stopped and started again on its file, the time from the start until
  a receive has answered with a message sent before the stop;
- traffic over a hot subset of H dialogs spread over the N (`send || receive+commit`, one
  message on each of 100 hot dialogs a call), against the same traffic on a broker whose store
  holds only the H hot dialogs, all of them in memory.

Each run is repeated (`--repeats`) after a warm-up run of the same length (which reads the hot
dialogs into memory: a tenth of a run leaves a third of them to the first run measured), rows
the medians; the N dialogs are begun once.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import tempfile
import time
import uuid

import psutil

from actors import Begin, Queue, Send, Service, start_broker
from actors.remote.client import Broker
from actors.remote.runtime import ensure_ray
from actors.tools.bench.local import receive_all
from actors.tools.bench.repeat import check_repeats
from actors.tools.bench.report import Load, Progress, Report, Row, median_row, with_ratios

HOT = 10_000  # dialogs the traffic runs over (at most N)
HOT_MESSAGES = 100_000  # messages per traffic run
PER_CALL = 1_000  # dialogs begun per call while opening them
SPREAD = 100  # hot dialogs one traffic call sends on (one message each)
INFLIGHT = 4
BACKLOG = 20_000  # dialogs begun whose message is not received yet, at most, while opening
BODY = bytes(100)


def run(load: Load, progress: Progress = print, repeats: int = 3, warm_up: bool = True) -> Report:
    check_repeats(repeats)
    n = load.messages
    hot = min(HOT, n)
    traffic = min(HOT_MESSAGES, max(SPREAD, n))
    params = {"dialogs": n, "hot": hot, "hot_messages": traffic, "body_bytes": len(BODY)}
    report = Report("dialogs", {**params, "repeats": repeats})
    ensure_ray()
    with tempfile.TemporaryDirectory(prefix="raybroker-bench-dialogs-") as tmp:
        name = f"bench-dialogs-{uuid.uuid4().hex[:8]}"
        path = os.path.join(tmp, "dialogs.sqlite")
        broker = start_broker(name, path)
        small_path = os.path.join(tmp, "hot.sqlite")
        small = start_broker(f"{name}-hot", small_path)
        try:
            empty = _rss(broker)
            hot_handles = _open(broker, n, hot, progress)
            rss = _rss(broker)
            per_dialog = (rss - empty) / n
            progress(f"{n:,} open dialogs: broker RSS {rss >> 20:,} MiB ({per_dialog:,.0f} B each)")
            small_handles = _open(small, hot, hot, lambda s: None)
            restarts: list[float] = []
            for i in range(repeats):
                broker = _restart(broker, name, path, hot_handles[i % hot], restarts, progress)
            # the baseline restarted too, so both brokers serve the traffic from a fresh process
            # (it reads its few dialogs back at start, all of them)
            small = _restart(small, small.name, small_path, small_handles[0], [], lambda s: None)
            rss_restarted = _rss(broker)
            rows: dict[str, list[Row]] = {"big": [], "small": []}
            label = {
                "big": f"hot subset: {hot:,} of {n:,} open dialogs",
                "small": f"the same on a store of only the {hot:,} hot dialogs (all cached)",
            }
            pairs = (("big", broker, hot_handles), ("small", small, small_handles))
            for i in range(-1 if warm_up else 0, repeats):
                for key, b, handles in pairs:
                    progress(f"{'warm-up' if i < 0 else f'run {i + 1} of {repeats}'}: {label[key]}")
                    # a warm-up as long as a run: every hot dialog is in use (in memory)
                    # before the runs measured, on both brokers alike
                    count = traffic
                    rate = asyncio.run(_traffic(b, handles, count))
                    if i >= 0:
                        rows[key].append(Row("raybroker", label[key], rate))
            rss_after = _rss(broker)
        finally:
            for b in (broker, small):
                b.stop()
    big, base = median_row(rows["big"]), median_row(rows["small"])
    big.vs = [["raybroker", label["small"], "all cached"]]
    restart_s = statistics.median(restarts)
    report.rows = with_ratios([big, base])
    mib = lambda b: f"{b / 2**20:,.0f} MiB"  # noqa: E731
    memory = (
        f"{per_dialog:,.0f} bytes of RSS per open dialog ({mib(rss)} with {n:,} open, "
        f"{mib(empty)} empty); after a restart {mib(rss_restarted)}, after the hot traffic "
        f"{mib(rss_after)}"
    )
    each = ", ".join(f"{s:.2f}" for s in restarts)
    restart = f"{restart_s:.2f} s, median of {len(restarts)} ({each} s)"
    report.rows.append(Row("raybroker", "open dialogs: broker memory", 0.0, notes=memory))
    report.rows.append(Row("raybroker", "restart to first receive", 0.0, notes=restart))
    report.params |= {
        "rss_bytes_per_dialog": round(per_dialog),
        "restart_s": round(restart_s, 2),
        "hot_ratio": round(big.messages_per_s / base.messages_per_s, 3)
        if base.messages_per_s
        else 0.0,
    }
    return report


def _rss(broker: Broker) -> int:
    return psutil.Process(broker.info()["pid"]).memory_info().rss


def _open(broker: Broker, n: int, hot: int, progress: Progress) -> list[str]:
    """Begin `n` dialogs with a message each, the target receiving and committing them all;
    the handles of `hot` of them, spread evenly over the `n`."""
    broker.create(Queue("InitiatorQueue"))
    broker.create(Queue("TargetQueue"))
    broker.create(Service("Initiator", "InitiatorQueue"))
    broker.create(Service("Target", "TargetQueue", ["DEFAULT"]))
    every = max(1, n // hot)
    handles: list[str] = []
    t0 = time.perf_counter()

    async def begin_all() -> None:
        gate = asyncio.Semaphore(INFLIGHT)
        step = max(PER_CALL, n // 10 // PER_CALL * PER_CALL)  # progress about every tenth
        received = 0
        turned = asyncio.Event()  # the reader took a turn

        async def one(first: int) -> None:
            try:
                ops: list[Begin | Send] = []
                for i in range(first, min(first + PER_CALL, n)):
                    begin = Begin("Initiator", "Target")
                    ops += [begin, Send(begin.handle, "DEFAULT", [BODY])]
                    if i % every == 0 and len(handles) < hot:
                        handles.append(begin.handle)
                await broker.aio.apply(ops)
            finally:
                gate.release()
            if (first + PER_CALL) % step == 0:
                rate = (first + PER_CALL) / (time.perf_counter() - t0)
                progress(f"opened {first + PER_CALL:,} of {n:,} dialogs ({rate:,.0f}/s)")

        async def produce() -> None:
            calls = []
            for first in range(0, n, PER_CALL):
                # messages waiting stay few: the broker's memory then measures open dialogs,
                # not a backlog of unread messages
                while first - received > BACKLOG:
                    turned.clear()
                    await turned.wait()
                await gate.acquire()
                calls.append(asyncio.create_task(one(first)))
            await asyncio.gather(*calls)

        async def read() -> None:
            nonlocal received
            groups: list = []
            while received < n:
                groups = await broker.aio.receive(
                    "TargetQueue", max_groups=PER_CALL, wait=0.2, commit=groups
                )
                received += sum(len(g) for g in groups)
                turned.set()
            if groups:
                await broker.aio.commit(groups)

        await asyncio.gather(produce(), read())

    asyncio.run(begin_all())
    return handles


def _restart(
    broker: Broker, name: str, path: str, handle: str, took: list[float], progress: Progress
) -> Broker:
    """Stop `broker` after a message on `handle`; start it again; time the first receive."""
    broker.apply([Send(handle, "DEFAULT", [BODY])])
    broker.stop()
    t0 = time.perf_counter()
    again = start_broker(name, path)
    groups = again.receive("TargetQueue", wait=60.0)
    took.append(time.perf_counter() - t0)
    if [(m.sequence_number, m.body) for g in groups for m in g.messages] != [(1, BODY)]:
        raise RuntimeError(f"after the restart, the receive took {groups!r}, not the message sent")
    again.commit(groups)
    progress(f"restart to first receive: {took[-1]:.2f} s")
    return again


async def _traffic(broker: Broker, handles: list[str], messages: int) -> float:
    """`messages` sent, one on each of SPREAD random hot dialogs a call, INFLIGHT calls at once,
    while a reader receives and commits them: messages per second."""
    gate = asyncio.Semaphore(INFLIGHT)
    spread = min(SPREAD, len(handles))
    calls = max(1, messages // spread)

    async def one() -> None:
        async with gate:
            await broker.aio.apply([Send(random.sample(handles, spread), "DEFAULT", [BODY])])

    t0 = time.perf_counter()
    await asyncio.gather(
        *(one() for _ in range(calls)),
        receive_all(broker, calls * spread, max_groups=SPREAD, readers=2),
    )
    return calls * spread / (time.perf_counter() - t0)
