"""Runs one workload on one system, the same way for every system: the producer and each consumer
in a process of its own (spawned, so nothing is shared with this one but what is sent to it),
started and connected before the clock starts. The producer processes send; the consumer
processes take, acknowledge and log what they acknowledged; this process only starts them,
waits for every message to be acknowledged, stops them and merges their logs. A `System` is the
coordinator's side of a peer (its server, what a workload needs created); a `Client` is what runs
in the processes."""

from __future__ import annotations

import asyncio
import importlib
import multiprocessing as mp
import queue as queues
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import psutil

from actors.tools.bench.peers.workloads import PROCESSES, Pair, Workload, batches, encode

STALL_S = 10.0  # after the last send, give up waiting when no acknowledgement came for this long
READY_S = 120.0  # the longest a process may take to start and connect
BUSY = 0.9  # a harness process above this share of a core is flagged: it may be the bottleneck
Received = tuple[int, int, float]  # a decoded body: (conversation, seq, sent_at)
Acked = tuple[int, int, float]  # (conversation, seq, when its acknowledgement was issued)


class Client(Protocol):
    """A system's client in a producer or consumer process. `ordered`: calls issued in order are
    applied in order, so several may be in flight on one conversation (otherwise a call waits
    for earlier calls on its conversations); `inflight`: producer calls in flight at most."""

    ordered: bool
    inflight: int

    async def start(self) -> None: ...
    async def send(self, bodies: list[tuple[int, bytes]]) -> None: ...  # (conversation, body)
    async def consume(self, index: int, rec: Recorder) -> None: ...  # until rec.stopping
    async def stop(self) -> None: ...


class System(Protocol):
    name: str
    durability: str  # "none", "default" or "power-safe" (its rows compare within the class)
    detail: str  # what its rows' notes add to its configuration ("" for nothing)
    client: str  # "module:Class" of its Client, made in each process from `open`'s params

    def consumers(self, w: Workload) -> int: ...
    def pids(self) -> Sequence[int]: ...  # server processes whose CPU counts
    def open(self, w: Workload) -> dict[str, Any]: ...  # what the clients need (picklable)
    def close(self, w: Workload) -> None: ...
    def settings(self) -> dict[str, Any]: ...  # as the server reports them, and client versions


@dataclass
class Measurement:
    acked: list[Pair]  # in the order acknowledgements were issued, over every consumer
    latencies_ms: list[float]
    elapsed_s: float  # first send to last acknowledgement
    cpu_s: float  # the harness processes' and the servers'
    server_cpu_s: float  # the servers' alone (no server process: 0)
    stalled: bool
    busy: list[str] = field(default_factory=list)  # harness processes above BUSY of a core


class Recorder:
    """What one consumer process acknowledged, as it confirms it."""

    def __init__(self, counter: Any = None) -> None:
        self.acked: list[Acked] = []
        self.latencies_ms: list[float] = []
        self.stopping = False
        self.counter = counter  # shared with the coordinator: acknowledgements so far
        self.last_ack = 0.0

    def confirmed(self, received: Iterable[Received], issued_at: float) -> None:
        """`received` are acknowledged now; their acknowledgement went out at `issued_at`
        (`time.perf_counter()`, the system-wide monotonic clock on Linux, as the bodies' send
        times). Merged by that time, the logs of several consumers keep each conversation's
        order: a conversation passes to another consumer only after its acknowledgement."""
        now = time.perf_counter()
        n = 0
        for conv, seq, sent_at in received:
            self.acked.append((conv, seq, issued_at))
            self.latencies_ms.append((now - sent_at) * 1000)
            n += 1
        self.last_ack = now
        if self.counter is not None and n:
            with self.counter.get_lock():
                self.counter.value += n


def layout(w: Workload, consumers: int) -> tuple[list[list[int]], list[list[int]]]:
    """Which process runs what: per producer process the clients it runs ([-1]: every call, in
    order), per consumer process the consumer indexes. Many clients run PROCESSES processes of
    each kind, their clients spread over them (a pooled client per process); otherwise one
    producer and a process per consumer."""
    if w.clients:
        n = min(PROCESSES, w.clients)
        return (
            [list(range(p, w.clients, n)) for p in range(n)],
            [list(range(p, consumers, n)) for p in range(min(n, consumers))],
        )
    return [[-1]], [[i] for i in range(consumers)]


def make_client(path: str, params: dict[str, Any]) -> Client:
    module, _, cls = path.partition(":")
    return getattr(importlib.import_module(module), cls)(params)


class Pool:
    """The processes the producers and consumers run in, spawned once for a system's runs (a
    process keeps its connection, its Ray among them, from one run to the next). Each waits for
    a task, runs it and waits for the next."""

    def __init__(self, size: int = 2 * PROCESSES) -> None:
        ctx = mp.get_context("spawn")
        self.out = ctx.Queue()
        self.counter = ctx.Value("q", 0)
        self.inboxes = [ctx.Queue() for _ in range(size)]
        self.procs = [
            ctx.Process(target=_serve, args=(inbox, self.out, self.counter), daemon=True)
            for inbox in self.inboxes
        ]
        for p in self.procs:
            p.start()
        self.broken = False

    def close(self) -> None:
        for inbox in self.inboxes:
            inbox.put(None)
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def drive(w: Workload, system: System, params: dict[str, Any], pool: Pool) -> Measurement:
    """One run of `w` on `system` in `pool`'s processes. A run that fails breaks the pool (its
    processes may be mid-task): make a new one for the next."""
    try:
        return _drive(w, system, params, pool)
    except BaseException:
        pool.broken = True
        raise


def _drive(w: Workload, system: System, params: dict[str, Any], pool: Pool) -> Measurement:
    producers, consumers = layout(w, system.consumers(w))
    roles = [("producer", i, share) for i, share in enumerate(producers)]
    roles += [("consumer", i, share) for i, share in enumerate(consumers)]
    if len(roles) > len(pool.procs):
        raise ValueError(f"{len(roles)} processes needed, the pool has {len(pool.procs)}")
    with pool.counter.get_lock():
        pool.counter.value = 0
    inboxes = pool.inboxes[: len(roles)]
    procs = pool.procs[: len(roles)]
    for inbox, (role, i, share) in zip(inboxes, roles, strict=True):
        inbox.put(("run", role, i, share, w, system.client, params))
    _gather(pool.out, procs, "ready", len(roles), READY_S)
    servers = ProcessCpu(system.pids())
    for inbox in inboxes:
        inbox.put("go")
    produced = _gather(pool.out, procs, "produced", len(producers), None)
    stalled = not _settle(pool.counter, w.messages, procs)
    server_cpu = servers.used()
    for inbox in inboxes[len(producers) :]:
        inbox.put("stop")
    logs = _gather(pool.out, procs, "log", len(consumers), READY_S)
    first_send = min(m["first_send"] for m in produced)
    entries = sorted((a for m in logs for a in m["acked"]), key=lambda a: a[2])  # ack issued
    last_ack = max((m["last_ack"] for m in logs), default=first_send)
    elapsed = max(last_ack - first_send, 1e-9)
    busy = [
        f"{m['role']} {m['index']} at {m['cpu_s'] / elapsed:.0%} of a core"
        for m in [*produced, *logs]
        if m["cpu_s"] / elapsed > BUSY
    ]
    return Measurement(
        acked=[(c, s) for c, s, _ in entries],
        latencies_ms=[x for m in logs for x in m["latencies_ms"]],
        elapsed_s=elapsed,
        cpu_s=server_cpu + sum(m["cpu_s"] for m in [*produced, *logs]),
        server_cpu_s=server_cpu,
        stalled=stalled,
        busy=busy,
    )


def _gather(out: Any, procs: list[Any], kind: str, n: int, timeout: float | None) -> list[dict]:
    """`n` messages of `kind` from the processes; a process that failed raises its error here."""
    got: list[dict] = []
    deadline = None if timeout is None else time.monotonic() + timeout
    while len(got) < n:
        try:
            msg = out.get(timeout=1.0)
        except queues.Empty:
            dead = [p for p in procs if p.exitcode is not None]
            if dead:
                raise RuntimeError(f"a bench process exited with {dead[0].exitcode}") from None
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{n - len(got)} process(es) sent no {kind!r}") from None
            continue
        if msg["kind"] == "error":
            raise RuntimeError(f"{msg['role']} {msg['index']}: {msg['error']}")
        if msg["kind"] == kind:
            got.append(msg)
    return got


def _settle(counter: Any, target: int, procs: list[Any]) -> bool:
    """Wait until `target` acknowledgements were counted (True), or none came for STALL_S or a
    process died (False)."""
    last, since = -1, time.monotonic()
    while True:
        n = counter.value
        if n >= target:
            return True
        if n != last:
            last, since = n, time.monotonic()
        elif time.monotonic() - since > STALL_S:
            return False
        if any(p.exitcode is not None for p in procs):
            return False
        time.sleep(0.01)


class ProcessCpu:
    """CPU seconds (user + system) of `pids` since construction."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.procs = [psutil.Process(p) for p in pids]
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


def _serve(inbox: Any, out: Any, counter: Any) -> None:
    """A pool process: run each task it is given until it is given None."""
    while True:
        task = inbox.get()
        if task is None:
            return
        _, role, index, share, w, client_path, params = task
        try:
            asyncio.run(_work(role, index, share, w, client_path, params, inbox, out, counter))
        except BaseException as exc:  # the coordinator reports it
            out.put({"kind": "error", "role": role, "index": index, "error": f"{exc!r}"[:2000]})


async def _work(role, index, share, w, client_path, params, inbox, out, counter) -> None:
    client = make_client(client_path, params)
    await client.start()
    try:
        out.put({"kind": "ready"})
        if await asyncio.to_thread(inbox.get) != "go":
            raise RuntimeError("expected the start of the run")
        cpu0 = time.process_time()  # the process's CPU, to the ns (psutil's: to the 10 ms tick)
        if role == "producer":
            first = await _produce(w, client, share)
            cpu = time.process_time() - cpu0
            out.put({"kind": "produced", "role": role, "index": index, "first_send": first,
                     "cpu_s": cpu})  # fmt: skip
            return
        rec = Recorder(counter)
        tasks = [asyncio.create_task(client.consume(i, rec)) for i in share]
        while _poll(inbox) != "stop":
            done = [t for t in tasks if t.done()]
            if done:  # a consumer that ends before the run is over has failed
                await done[0]
                raise RuntimeError("a consumer ended before the run was over")
            await asyncio.sleep(0.01)
        cpu = time.process_time() - cpu0  # before the consumers wind down
        rec.stopping = True
        await asyncio.gather(*tasks)
        out.put({"kind": "log", "role": role, "index": index, "acked": rec.acked,
                 "latencies_ms": rec.latencies_ms, "last_ack": rec.last_ack,
                 "cpu_s": cpu})  # fmt: skip
    finally:
        await client.stop()


def _poll(inbox: Any) -> Any:
    try:
        return inbox.get_nowait()
    except queues.Empty:
        return None


async def _produce(w: Workload, client: Client, share: list[int]) -> float:
    """Send this process's calls (share [-1]: every call; otherwise the calls of these clients,
    each client's one after another); returns when the first went out."""
    calls = list(batches(w))
    first = time.perf_counter()
    if share != [-1]:
        mine = set(share)
        per_client: dict[int, list[list[Pair]]] = {}
        for call in calls:
            if call[0][0] in mine:
                per_client.setdefault(call[0][0], []).append(call)
        await asyncio.gather(*(_client(client, c) for c in per_client.values()))
        return first
    gate = asyncio.Semaphore(client.inflight)
    last_on: dict[int, asyncio.Task] = {}  # per conversation, the latest call sending on it
    tasks = []
    for i, call in enumerate(calls):
        if w.rate:
            release = first + i * w.batch / w.rate
            await asyncio.sleep(max(0.0, release - time.perf_counter()))
        await gate.acquire()
        if not client.ordered:
            earlier = {last_on[c] for c, _ in call if c in last_on}
            await asyncio.gather(*earlier)
        task = asyncio.create_task(_send(client, call, gate))
        tasks.append(task)
        for c, _ in call:
            last_on[c] = task
    await asyncio.gather(*tasks)
    return first


async def _client(client: Client, calls: list[list[Pair]]) -> None:
    for call in calls:
        t = time.perf_counter()
        await client.send([(c, encode(c, s, t)) for c, s in call])


async def _send(client: Client, call: list[Pair], gate: asyncio.Semaphore) -> None:
    try:
        t = time.perf_counter()
        await client.send([(c, encode(c, s, t)) for c, s in call])
    finally:
        gate.release()
