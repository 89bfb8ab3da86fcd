"""`raybroker bench remote`: messages between two brokers, and request-reply latency over a dialog
between them, each beside the same figure on a single broker measured in the same run.

Throughput: N messages over K dialogs from broker A to a service on broker B, sent in batches,
received by conversation group on B and committed (send and receive concurrent). Latency: a
request on an Echo dialog from A to B, answered by B's broker itself, received back on A.
With `secure` (`--secure`), the same throughput again on secured dialogs (seed 003: a session
key per dialog, every message sealed on A and opened on B), beside the unsecured figure, and
what sealing and opening one message costs.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
import uuid
from dataclasses import asdict

from actors import Begin, Certificate, Grant, Queue, RemoteServiceBinding, Service, start_broker
from actors.remote.client import Broker
from actors.remote.runtime import ensure_ray
from actors.tools.bench.local import receive_all, send_all
from actors.tools.bench.report import DEFAULT_LOAD, Load, Progress, Report, Row, percentile

REMOTE = "two brokers: send A, receive+commit B"
LOCAL = "one broker: send, receive+commit"


def run(
    load: Load = DEFAULT_LOAD,
    round_trips: int = 300,
    progress: Progress = print,
    secure: bool = False,
) -> Report:
    messages, dialogs, batch = load.messages, load.dialogs, load.batch
    report = Report("remote", {**asdict(load), "round_trips": round_trips, "secure": secure})
    ensure_ray()
    body = os.urandom(100)
    with tempfile.TemporaryDirectory(prefix="raybroker-bench-") as tmp:
        tag = uuid.uuid4().hex[:6]
        master = os.path.join(tmp, "master.key")
        with open(master, "w") as f:
            f.write(os.urandom(32).hex())
        limits = {"master_key_file": master}
        a = start_broker(f"bench-A-{tag}", os.path.join(tmp, "a.sqlite"), limits=limits)
        b = start_broker(f"bench-B-{tag}", os.path.join(tmp, "b.sqlite"), limits=limits)
        try:
            for broker in (a, b):
                _define(broker)
            a.create_route("ToB", "Remote", address=f"ray://{b.name}")
            a.create_route("SecuredOnB", "Secured", address=f"ray://{b.name}")
            a.create_route("EchoOnB", "RemoteEcho", address=f"ray://{b.name}")
            b.create_route("ToA", "Init", address=f"ray://{a.name}")

            progress(f"two brokers: {messages:,} messages A -> B, received and committed on B")
            remote = _throughput(a, b, "Remote", messages, dialogs, batch, body)
            if secure:
                _secure(a, b)
                progress(f"two brokers, secured dialogs: {messages:,} messages A -> B")
                secured = _throughput(a, b, "Secured", messages, dialogs, batch, body, True)
                report.rows.append(Row(
                    "raybroker",
                    "two brokers, secured dialogs: send A, receive+commit B",
                    secured,
                    notes=f"sealing and opening {len(body)}-byte messages, {batch} a bundle: "
                    f"{_crypto_us(body, batch):.2f} us of CPU each",
                    vs=[["raybroker", REMOTE, "unsecured"]],
                ))  # fmt: skip
            progress(f"one broker: {messages:,} messages, same batches")
            local = _throughput(a, a, "Local", messages, dialogs, batch, body)
            progress(f"request-reply: {round_trips} round trips, across brokers and on one")
            lat_remote = _round_trips(a, "RemoteEcho", round_trips)
            lat_local = _round_trips(a, "LocalEcho", round_trips)
        finally:
            for broker in (a, b):
                broker.stop()
    report.rows[:0] = [
        Row("raybroker", REMOTE, remote, vs=[["raybroker", LOCAL, "one broker"]]),
        Row("raybroker", LOCAL, local),
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
    b.create(Service("Secured", "WorkQueue", ["DEFAULT"]))


def _secure(a: Broker, b: Broker) -> None:
    """Dialog security from A's Init to B's Secured: each side's certificate made on its
    broker, the other's imported, Secured bound on A and SEND on it granted on B."""
    a.create(Certificate("InitCert", owner="Init", days=1))
    b.create(Certificate("SecuredCert", owner="Secured", days=1))
    a.create(Certificate("SecuredCert", _pem(b, "SecuredCert")))
    b.create(Certificate("InitCert", _pem(a, "InitCert")))
    a.create(RemoteServiceBinding("ToSecured", "Secured", "SecuredCert"))
    b.create(Grant("InitMaySend", "Secured", "InitCert"))


def _pem(b: Broker, name: str) -> str:
    [pem] = [r["certificate"] for k, r in b.definitions()
             if k == "certificate" and r["name"] == name]  # fmt: skip
    return pem


def _crypto_us(body: bytes, batch: int, rounds: int = 20) -> float:
    """CPU microseconds per message to seal a bundle of `batch` messages on one side and open
    it on the other (one AEAD call per bundle)."""
    from actors.security.sessions import Session, new_session_key

    key = new_session_key()
    sender, receiver = Session(key, "bench"), Session(key, "bench")
    seqs, types, bodies = list(range(batch)), ["DEFAULT"] * batch, [body] * batch
    started = time.process_time()
    for _ in range(rounds):
        receiver.open(True, seqs, types, sender.seal(True, seqs, types, bodies))
    return (time.process_time() - started) / (rounds * batch) * 1e6


def _throughput(
    a: Broker,
    b: Broker,
    service: str,
    messages: int,
    dialogs: int,
    batch: int,
    body: bytes,
    encryption: bool = False,
) -> float:
    begins = [Begin("Init", service, encryption=encryption) for _ in range(dialogs)]
    handles = a.apply(begins)["handles"]

    async def both() -> None:
        await asyncio.gather(
            send_all(a, handles, messages, batch, body, inflight=4),
            receive_all(b, messages, max_groups=16, readers=1, queue="WorkQueue"),
        )

    t0 = time.perf_counter()
    asyncio.run(both())
    return messages / (time.perf_counter() - t0)


def _round_trips(a: Broker, service: str, n: int) -> list[float]:
    h = a.begin_dialog("Init", service, "Echo", encryption=False)  # as the unsecured figures
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
