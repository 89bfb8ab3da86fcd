"""`raybroker bench remote`: messages between two brokers, and request-reply latency over a dialog
between them, each beside the same figure on a single broker measured in the same run.

Throughput: N messages over K dialogs from broker A to a service on broker B, sent in batches,
received by conversation group on B and committed (send and receive concurrent). Latency: a
request on an Echo dialog from A to B, answered by B's broker itself, received back on A.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
import uuid
from dataclasses import asdict

from actors import Begin, Queue, Service, start_broker
from actors.remote.client import Broker
from actors.remote.runtime import ensure_ray
from actors.tools.bench.local import receive_all, send_all
from actors.tools.bench.report import DEFAULT_LOAD, Load, Progress, Report, Row, percentile


def run(load: Load = DEFAULT_LOAD, round_trips: int = 300, progress: Progress = print) -> Report:
    messages, dialogs, batch = load.messages, load.dialogs, load.batch
    report = Report("remote", {**asdict(load), "round_trips": round_trips})
    ensure_ray()
    body = os.urandom(100)
    with tempfile.TemporaryDirectory(prefix="raybroker-bench-") as tmp:
        tag = uuid.uuid4().hex[:6]
        a = start_broker(f"bench-A-{tag}", os.path.join(tmp, "a.sqlite"))
        b = start_broker(f"bench-B-{tag}", os.path.join(tmp, "b.sqlite"))
        try:
            for broker in (a, b):
                _define(broker)
            a.create_route("ToB", "Remote", address=f"ray://{b.name}")
            a.create_route("EchoOnB", "RemoteEcho", address=f"ray://{b.name}")
            b.create_route("ToA", "Init", address=f"ray://{a.name}")

            progress(f"two brokers: {messages:,} messages A -> B, received and committed on B")
            remote = _throughput(a, b, "Remote", messages, dialogs, batch, body)
            progress(f"one broker: {messages:,} messages, same batches")
            local = _throughput(a, a, "Local", messages, dialogs, batch, body)
            progress(f"request-reply: {round_trips} round trips, across brokers and on one")
            lat_remote = _round_trips(a, "RemoteEcho", round_trips)
            lat_local = _round_trips(a, "LocalEcho", round_trips)
        finally:
            for broker in (a, b):
                broker.stop()
    report.rows += [
        Row(
            "raybroker",
            "two brokers: send A, receive+commit B",
            remote,
            notes=f"{remote / local:.2f}x one broker",
        ),
        Row("raybroker", "one broker: send, receive+commit", local),
        Row(
            "raybroker",
            "request-reply across two brokers (Echo)",
            1000 / _mean(lat_remote),
            percentile(lat_remote, 0.5),
            percentile(lat_remote, 0.99),
            notes=f"p99 {percentile(lat_remote, 0.99) / percentile(lat_local, 0.99):.1f}x one "
            "broker; messages_per_s = round trips per second, one at a time",
        ),
        Row(
            "raybroker",
            "request-reply on one broker (Echo)",
            1000 / _mean(lat_local),
            percentile(lat_local, 0.5),
            percentile(lat_local, 0.99),
        ),
    ]
    return report


def _define(b: Broker) -> None:
    b.create(Queue("InitQueue"))
    b.create(Queue("WorkQueue"))
    b.create(Queue("EchoQueue"))
    b.create(Service("Init", "InitQueue"))
    b.create(Service("Local", "WorkQueue", ["DEFAULT"]))
    b.create(Service("Remote", "WorkQueue", ["DEFAULT"]))
    b.create(Service("LocalEcho", "EchoQueue", ["Echo"]))
    b.create(Service("RemoteEcho", "EchoQueue", ["Echo"]))


def _throughput(
    a: Broker, b: Broker, service: str, messages: int, dialogs: int, batch: int, body: bytes
) -> float:
    handles = a.apply([Begin("Init", service) for _ in range(dialogs)])["handles"]

    async def both() -> None:
        await asyncio.gather(
            send_all(a, handles, messages, batch, body, inflight=4),
            receive_all(b, messages, max_groups=16, readers=1, queue="WorkQueue"),
        )

    t0 = time.perf_counter()
    asyncio.run(both())
    return messages / (time.perf_counter() - t0)


def _round_trips(a: Broker, service: str, n: int) -> list[float]:
    h = a.begin_dialog("Init", service, "Echo")
    out = []
    for i in range(n + 10):
        t0 = time.perf_counter()
        a.send(h, "Echo", b"ping")
        groups = a.receive("InitQueue", wait=10)  # returns as soon as the reply is there
        elapsed = time.perf_counter() - t0
        a.commit(groups)
        if i >= 10:  # the first few warm the paths
            out.append(elapsed * 1000)
    a.end_conversation(h)
    return sorted(out)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)
