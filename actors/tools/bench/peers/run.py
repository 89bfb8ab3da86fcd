"""`raybroker bench peers`: every workload on raybroker and on each peer, in one run on this
machine, one system after another, each at every durability class it offers (a server runs only
while its rows are measured; Ray is stopped before the other systems' rows). Each row is the
median of `repeats` measured runs after a warm-up, every run checked for exactly-once and
per-conversation order; raybroker's rows say how they compare with the peers of the same
durability class."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from actors.errors import InvalidArgument
from actors.tools.bench.peers import servers
from actors.tools.bench.peers.checker import check
from actors.tools.bench.peers.driver import STALL_S, Measurement, Pool, System, drive
from actors.tools.bench.peers.workloads import (
    BODY_BYTES,
    CLIENTS,
    CONSUMERS,
    INFLIGHT,
    PACED_RATE,
    PROCESSES,
    Workload,
    expected,
)
from actors.tools.bench.peers.workloads import plan as plan_workloads
from actors.tools.bench.repeat import check_repeats
from actors.tools.bench.report import (
    DEFAULT_LOAD,
    Load,
    Progress,
    Report,
    Row,
    median_row,
    percentile,
)

# the systems on Ray first: Ray is stopped before the others are measured
SYSTEMS = ("raybroker", "ray-queue", "redis-streams", "rabbitmq-classic", "rabbitmq-quorum",
           "raw-sqlite")  # fmt: skip
CLASSES = {
    "raybroker": ("default", "power-safe"),
    "ray-queue": ("none",),
    "redis-streams": ("default", "power-safe"),
    "rabbitmq-classic": ("power-safe",),
    "rabbitmq-quorum": ("power-safe",),
    "raw-sqlite": ("default", "power-safe"),
}
ON_RAY = ("raybroker", "ray-queue")
REPEATS = 3
BEHIND_S = 1.0  # paced: how far past the schedule the last acknowledgement may come
CLIENT_INSTALL = "pip install 'raybroker[peers]'"
NOTES = {
    ("raybroker", "default"): "SQLite WAL, synchronous=NORMAL",
    ("raybroker", "power-safe"): "SQLite WAL, synchronous=FULL (durability='full')",
    ("ray-queue", "none"): "not durable; no acknowledgement (a get is final)",
    ("redis-streams", "default"): "AOF, appendfsync everysec; XADD pipelines, XACK+XREADGROUP",
    ("redis-streams", "power-safe"): "AOF, appendfsync always; XADD pipelines, XACK+XREADGROUP",
    ("rabbitmq-classic", "power-safe"): "durable classic queues, persistent, async confirms",
    ("rabbitmq-quorum", "power-safe"): "quorum queues (one node), async confirms",
    ("raw-sqlite", "default"): "the floor: WAL, synchronous=NORMAL, 1 consumer process",
    ("raw-sqlite", "power-safe"): "the floor: WAL, synchronous=FULL, 1 consumer process",
}
# what each side batches when 100 clients each send one message at a time
MANY_CLIENTS = {
    "raybroker": "each process's handle coalesces its clients' concurrent calls",
    "ray-queue": "a call per message",
    "redis-streams": "a pooled client per process, an XADD per message",
    "rabbitmq-classic": "a channel per process, a publish and confirm per message",
    "rabbitmq-quorum": "a channel per process, a publish and confirm per message",
    "raw-sqlite": "a transaction per message",
}


def run(
    load: Load = DEFAULT_LOAD,
    progress: Progress = print,
    systems: Sequence[str] | None = None,
    repeats: int = REPEATS,
    warm_up: bool = True,
) -> Report:
    """The report: a row per (system, durability class, workload), each the median of
    `repeats` runs after a warm-up (unless not `warm_up`); `systems` picks some of SYSTEMS."""
    unknown = sorted(set(systems or ()) - set(SYSTEMS))
    if unknown:
        raise InvalidArgument(f"unknown systems {unknown}; known: {', '.join(SYSTEMS)}")
    check_repeats(repeats)
    chosen = [s for s in SYSTEMS if s in (systems or SYSTEMS)]
    workloads = plan_workloads(load)
    report = Report(
        "peers",
        {
            **asdict(load),
            "consumers": CONSUMERS,
            "clients": CLIENTS,
            "processes": PROCESSES,
            "paced_rate": PACED_RATE,
            "body_bytes": BODY_BYTES,
            "inflight": INFLIGHT,
            "repeats": repeats,
            "workloads": {w.variant: w.messages for w in workloads},
            "systems": {},
        },
    )
    rows: dict[tuple[str, str, str], Row] = {}
    with tempfile.TemporaryDirectory(prefix="raybroker-peers-") as tmp, ExitStack() as started:
        run_ = _Run(Path(tmp), workloads, repeats, warm_up, report, rows, progress, started)
        # the processes that ran the systems on Ray go before Ray does (their Ray connection
        # would outlive the cluster), then the others get processes of their own
        with _RayFor(chosen), _Pools() as pools:
            for system in [s for s in chosen if s in ON_RAY]:
                run_.system(system, pools)
        with _Pools() as pools:
            for system in [s for s in chosen if s not in ON_RAY]:
                run_.system(system, pools)
    for w in workloads:  # grouped by workload, so each table block compares like with like
        for system in chosen:
            for durability in CLASSES[system]:
                report.rows.append(rows[(system, durability, w.variant)])
    _compare(report.rows)
    return report


class _RayFor:
    """Ray while the systems on it are measured, stopped after (if this run started it)."""

    def __init__(self, chosen: list[str]) -> None:
        self.needed = any(s in ON_RAY for s in chosen)
        self.started = False

    def __enter__(self) -> None:
        if self.needed:
            import ray

            from actors.remote.runtime import ensure_ray

            self.started = not ray.is_initialized()
            ensure_ray()

    def __exit__(self, *exc: Any) -> None:
        if self.started:
            import ray

            ray.shutdown()


class _Run:
    """One `run`'s state: where it writes, what it measures, the servers it shares (RabbitMQ's
    classic and quorum queues run on one node, started once)."""

    def __init__(
        self,
        tmp: Path,
        workloads: list[Workload],
        repeats: int,
        warm_up: bool,
        report: Report,
        rows: dict[tuple[str, str, str], Row],
        progress: Progress,
        started: ExitStack,
    ) -> None:
        self.tmp, self.workloads, self.repeats = tmp, workloads, repeats
        self.warm_up = warm_up
        self.report, self.rows, self.progress = report, rows, progress
        self.started = started
        self.servers: dict[str, servers.Server | servers.Unavailable] = {}

    def server(self, kind: str) -> servers.Server | servers.Unavailable:
        if kind not in self.servers:
            workdir = self.tmp / kind
            workdir.mkdir(mode=0o711)  # traversable: RabbitMQ's node runs as its own user
            start = servers.start_redis if kind == "redis" else servers.start_rabbitmq
            got = start(workdir)
            if isinstance(got, servers.Server):
                self.started.callback(got.stop)
            self.servers[kind] = got
        return self.servers[kind]

    def system(self, system: str, pools: _Pools) -> None:
        for durability in CLASSES[system]:
            label = f"{system} ({durability})"
            with ExitStack() as stack:
                try:
                    made = self._start(system, durability, stack)
                except ImportError as exc:
                    made = servers.Unavailable(
                        f"python package {exc.name} not installed", CLIENT_INSTALL
                    )
                except Exception as exc:  # a server that would not start or configure
                    made = servers.Unavailable(f"failed to start: {type(exc).__name__}: {exc}", "")
                if isinstance(made, servers.Unavailable):
                    self.progress(f"{label}: {made.note}")
                    for w in self.workloads:
                        self.rows[(system, durability, w.variant)] = Row(
                            system, w.variant, 0.0, notes=made.note, durability=durability
                        )
                    continue
                self.report.params["systems"][f"{system} {durability}"] = made.settings()
                for w in self.workloads:
                    row = _measure(made, w, self.repeats, self.warm_up, pools, self.progress)
                    self.rows[(system, durability, w.variant)] = row

    def _start(self, system: str, durability: str, stack: ExitStack) -> System | Any:
        """The system, started, its stopping left on `stack`; or why it is not available."""
        workdir = self.tmp / f"{system}-{durability}"
        workdir.mkdir()
        made: Any
        if system == "raybroker":
            from actors.tools.bench.peers.raybroker import RayBroker

            made = RayBroker(str(workdir), durability)
        elif system == "ray-queue":
            from actors.tools.bench.peers.ray_queue import RayQueue

            made = RayQueue()
        elif system == "redis-streams":
            from actors.tools.bench.peers.redis_streams import RedisStreams

            server = self.server("redis")
            if isinstance(server, servers.Unavailable):
                return server
            made = RedisStreams(server, durability)
        elif system.startswith("rabbitmq-"):
            import aio_pika  # noqa: F401 - the clients need it: a missing one skips the rows

            from actors.tools.bench.peers.rabbitmq import RabbitMQ

            server = self.server("rabbitmq")
            if isinstance(server, servers.Unavailable):
                return server
            made = RabbitMQ(server, system.removeprefix("rabbitmq-"))
        else:
            from actors.tools.bench.peers.raw_sqlite import RawSqlite

            made = RawSqlite(str(workdir), durability)
        stack.callback(made.stop)
        return made


class _Pools:
    """The processes the runs go to, made again after a run that failed."""

    def __init__(self) -> None:
        self.pool: Pool | None = None

    def get(self) -> Pool:
        if self.pool is None or self.pool.broken:
            self.close()
            self.pool = Pool()
        return self.pool

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def __enter__(self) -> _Pools:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _measure(
    system: Any, w: Workload, repeats: int, warm_up: bool, pools: _Pools, progress: Progress
) -> Row:
    label = f"{system.name} ({system.durability}): {w.variant}"
    warm = replace(w, messages=max(w.batch, w.messages // 10 // w.batch * w.batch))
    runs = []
    for i in range(0 if warm_up else 1, repeats + 1):
        this = warm if i == 0 else w
        what = "warm-up" if i == 0 else f"run {i}/{repeats}"
        progress(f"{label}: {what}, {this.messages:,} messages")
        try:
            params = system.open(this)
            try:
                m = drive(this, system, params, pools.get())
            finally:
                system.close(this)
        except Exception as exc:  # one run failing must not lose the others' rows
            note = f"failed: {type(exc).__name__}: {exc}"[:500]
            progress(f"{label}: {note}")
            row = Row(system.name, w.variant, 0.0, notes=note, durability=system.durability)
        else:
            row = _row(system, this, m)
            progress(f"{label}: {row.messages_per_s:,.0f} msg/s")
        if i:
            runs.append(row)
    return median_row(runs)


def _row(system: Any, w: Workload, m: Measurement) -> Row:
    verdict = check(expected(w), m.acked)
    lat = sorted(m.latencies_ms)
    notes = [NOTES[(system.name, system.durability)], *([system.detail] if system.detail else [])]
    if w.clients:
        notes.append(MANY_CLIENTS[system.name])
    if system.consumers(w) != w.consumers:
        n = system.consumers(w)
        notes.append(f"{n} consumer{'s' if n > 1 else ''} (not {w.consumers})")
    # paced: a system that falls behind the producer shows a backlog's latency, not its own
    behind = m.elapsed_s - w.messages / w.rate if w.rate else 0.0
    if behind > BEHIND_S:
        notes.append(f"{behind:.1f} s behind the {w.rate:,.0f}/s pace at the end")
    if m.stalled:
        notes.append(f"stalled: nothing acknowledged for {STALL_S:.0f} s")
    if m.busy:
        notes.append("harness busy: " + ", ".join(m.busy))
    if not verdict.clean:
        notes.append(verdict.describe())
    return Row(
        system.name,
        w.variant,
        len(m.acked) / m.elapsed_s if m.elapsed_s > 0 else 0.0,
        percentile(lat, 0.5),
        percentile(lat, 0.99),
        m.cpu_s / (w.messages / 1000),
        "; ".join(notes),
        verdict.lost,
        verdict.doubled,
        verdict.out_of_order,
        durability=system.durability,
        server_cpu_s_per_1k=m.server_cpu_s / (w.messages / 1000) if system.pids() else None,
    )


def _compare(rows: list[Row]) -> None:
    """raybroker's rows: its rate as a multiple of each peer's measured in the same workload at
    the same durability class (never across classes)."""
    for row in rows:
        if row.system != "raybroker" or not row.messages_per_s:
            continue
        ratios = [
            f"{row.messages_per_s / other.messages_per_s:.2f}x {other.system}"
            for other in rows
            if other.variant == row.variant
            and other.durability == row.durability
            and other.system != "raybroker"
            and other.messages_per_s
        ]
        if ratios:
            row.notes += "; " + ", ".join(ratios)
