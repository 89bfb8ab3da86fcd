"""Runs one workload on one system: the producer (paced, pipelined, or many clients), the
consumers, the acknowledged log, latency and CPU. The same driver for every system, so they differ
only in how they send and consume (a `Peer`)."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import psutil

from actors.tools.bench.peers.workloads import INFLIGHT, Pair, Workload, batches, encode

STALL_S = 10.0  # after the last send, give up waiting when no acknowledgement came for this long
Received = tuple[int, int, float]  # a decoded body: (conversation, seq, sent_at)


class Peer(Protocol):
    name: str
    detail: str  # what its rows' notes add to its configuration ("" for nothing)
    # True when calls issued in order are applied in order, so a producer may have several calls
    # in flight on one conversation; otherwise a call waits for earlier calls on its conversations
    ordered: bool

    def consumers(self, w: Workload) -> int: ...
    def pids(self) -> Sequence[int]: ...  # processes whose CPU counts, beside this one
    async def open(self, w: Workload) -> None: ...
    async def send(self, bodies: list[tuple[int, bytes]]) -> None: ...  # (conversation, body)
    async def consume(self, index: int, rec: Recorder) -> None: ...  # until rec.stopping
    async def close(self) -> None: ...


@dataclass
class Measurement:
    acked: list[Pair]  # in the order acknowledgements were confirmed
    latencies_ms: list[float]
    elapsed_s: float  # first send to last acknowledgement
    cpu_s: float
    stalled: bool


class Recorder:
    """What the consumers acknowledged, as they confirm it."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.acked: list[Pair] = []
        self.distinct: set[Pair] = set()  # a message acknowledged twice counts once here
        self.latencies_ms: list[float] = []
        self.first_send: float | None = None
        self.last_ack = 0.0
        self.stopping = False
        self.progress = asyncio.Event()

    def confirmed(self, received: Iterable[Received]) -> None:
        """`received` are acknowledged now (their ack or commit call has returned)."""
        now = time.perf_counter()
        for conv, seq, sent_at in received:
            self.acked.append((conv, seq))
            self.distinct.add((conv, seq))
            self.latencies_ms.append((now - sent_at) * 1000)
        self.last_ack = now
        self.progress.set()

    @property
    def complete(self) -> bool:
        return len(self.distinct) >= self.target


class Cpu:
    """CPU seconds (user + system) of this process and `pids` since construction."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.procs = [psutil.Process()] + [psutil.Process(p) for p in pids]
        self.start = self.now()

    def now(self) -> float:
        total = 0.0
        for p in self.procs:
            try:
                t = p.cpu_times()
            except psutil.NoSuchProcess:  # a helper process that ended: its time is gone too
                continue
            total += t.user + t.system
        return total

    def used(self) -> float:
        return self.now() - self.start


async def drive(w: Workload, peer: Peer) -> Measurement:
    # What exists before the run (the clients, Ray, the harness) is no garbage: kept out of the
    # collector's full passes, which would otherwise stall the driver mid-run, for every system
    gc.collect()
    gc.freeze()
    try:
        return await _drive(w, peer)
    finally:
        gc.unfreeze()


async def _drive(w: Workload, peer: Peer) -> Measurement:
    rec = Recorder(w.messages)
    cpu = Cpu(peer.pids())
    consumers = [asyncio.create_task(peer.consume(i, rec)) for i in range(peer.consumers(w))]
    stalled, cpu_s = False, 0.0
    try:
        await _produce(w, peer, rec)
        stalled = not await _settle(rec, consumers)
        cpu_s = cpu.used()  # before the consumers wind down
    finally:
        rec.stopping = True
        results = await asyncio.gather(*consumers, return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        raise failed[0]
    elapsed = (rec.last_ack or time.perf_counter()) - (rec.first_send or 0.0)
    return Measurement(rec.acked, rec.latencies_ms, elapsed, cpu_s, stalled)


async def _produce(w: Workload, peer: Peer, rec: Recorder) -> None:
    calls = list(batches(w))
    rec.first_send = time.perf_counter()
    if w.clients:  # each client its conversation's calls, one after another
        per_client: dict[int, list[list[Pair]]] = {}
        for call in calls:
            per_client.setdefault(call[0][0], []).append(call)
        await asyncio.gather(*(_client(peer, mine) for mine in per_client.values()))
        return
    gate = asyncio.Semaphore(INFLIGHT)
    last_on: dict[int, asyncio.Task] = {}  # per conversation, the latest call sending on it
    tasks = []
    for i, call in enumerate(calls):
        if w.rate:
            release = rec.first_send + i * w.batch / w.rate
            await asyncio.sleep(max(0.0, release - time.perf_counter()))
        await gate.acquire()
        if not peer.ordered:
            earlier = {last_on[c] for c, _ in call if c in last_on}
            await asyncio.gather(*earlier)
        task = asyncio.create_task(_send(peer, call, gate))
        tasks.append(task)
        for c, _ in call:
            last_on[c] = task
    await asyncio.gather(*tasks)


async def _client(peer: Peer, calls: list[list[Pair]]) -> None:
    for call in calls:
        t = time.perf_counter()
        await peer.send([(c, encode(c, s, t)) for c, s in call])


async def _send(peer: Peer, call: list[Pair], gate: asyncio.Semaphore) -> None:
    try:
        t = time.perf_counter()
        await peer.send([(c, encode(c, s, t)) for c, s in call])
    finally:
        gate.release()


async def _settle(rec: Recorder, consumers: list[asyncio.Task]) -> bool:
    """Wait until every message is acknowledged (True), or none was for STALL_S or a consumer
    ended early (False)."""
    while not rec.complete:
        rec.progress.clear()
        waiter = asyncio.ensure_future(rec.progress.wait())
        done, _ = await asyncio.wait(
            [waiter, *consumers], timeout=STALL_S, return_when=asyncio.FIRST_COMPLETED
        )
        waiter.cancel()
        if waiter not in done:
            return False
    return True
