"""`raybroker bench peers`: every workload on raybroker and on each peer, in one run on this
machine, one after another (a peer's server runs only while its rows are measured). Every row is
checked for exactly-once and per-conversation order; raybroker's rows say how they compare."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import Any

from actors.errors import InvalidArgument
from actors.remote.runtime import ensure_ray
from actors.tools.bench.peers import servers
from actors.tools.bench.peers.checker import check
from actors.tools.bench.peers.driver import STALL_S, Measurement, Peer, drive
from actors.tools.bench.peers.workloads import (
    BODY_BYTES,
    CLIENTS,
    CONSUMERS,
    INFLIGHT,
    PACED_RATE,
    Workload,
    expected,
)
from actors.tools.bench.peers.workloads import plan as plan_workloads
from actors.tools.bench.report import DEFAULT_LOAD, Load, Progress, Report, Row, percentile

SYSTEMS = ("raybroker", "redis-streams", "rabbitmq", "ray-queue", "raw-sqlite")
BEHIND_S = 1.0  # paced: how far past the schedule the last acknowledgement may come
CLIENT_INSTALL = "pip install 'raybroker[peers]'"
NOTES = {
    "raybroker": "durable: SQLite WAL, synchronous=NORMAL",
    "redis-streams": "AOF, fsync every second; a stream per partition, XREADGROUP + XACK",
    "rabbitmq": "durable queues, persistent messages, publisher confirms, manual acks",
    "ray-queue": "not durable; no acknowledgement (a get is final)",
    "raw-sqlite": "the floor: in-process, one thread, WAL, synchronous=NORMAL",
}


def run(
    load: Load = DEFAULT_LOAD, progress: Progress = print, systems: Sequence[str] | None = None
) -> Report:
    """The report: a row per (system, workload); `systems` picks some of SYSTEMS."""
    unknown = sorted(set(systems or ()) - set(SYSTEMS))
    if unknown:
        raise InvalidArgument(f"unknown systems {unknown}; known: {', '.join(SYSTEMS)}")
    workloads = plan_workloads(load)
    report = Report(
        "peers",
        {
            **asdict(load),
            "consumers": CONSUMERS,
            "clients": CLIENTS,
            "paced_rate": PACED_RATE,
            "body_bytes": BODY_BYTES,
            "inflight": INFLIGHT,
            "workloads": {w.variant: w.messages for w in workloads},
        },
    )
    rows: dict[tuple[str, str], Row] = {}
    with tempfile.TemporaryDirectory(prefix="raybroker-peers-") as tmp:
        for system in systems or SYSTEMS:
            for row in _system(system, workloads, Path(tmp), progress):
                rows[(row.system, row.variant)] = row
    for w in workloads:  # grouped by workload, so each table block compares like with like
        for system in systems or SYSTEMS:
            report.rows.append(rows[(system, w.variant)])
    _compare(report.rows)
    return report


def _system(system: str, workloads: list[Workload], tmp: Path, progress: Progress) -> list[Row]:
    """Rows of one system; its server (if any) runs for the duration and is always stopped."""
    with ExitStack() as stack:
        try:
            make = _peer_factory(system, tmp, stack)
        except ImportError as exc:
            make = servers.Unavailable(f"python package {exc.name} not installed", CLIENT_INSTALL)
        if isinstance(make, servers.Unavailable):
            progress(f"{system}: {make.note}")
            return [Row(system, w.variant, 0.0, notes=make.note) for w in workloads]
        try:
            return asyncio.run(_measure_all(system, make, workloads, progress))
        except Exception as exc:  # one peer failing must not lose the others' rows
            note = f"failed: {type(exc).__name__}: {exc}"
            progress(f"{system}: {note}")
            return [Row(system, w.variant, 0.0, notes=note) for w in workloads]


def _peer_factory(
    system: str, tmp: Path, stack: ExitStack
) -> Callable[[], Any] | servers.Unavailable:
    """A function making the system's peer inside the event loop that measures it (clients bind
    to their loop), after starting what it needs; stopping it is left on `stack`."""
    if system == "raybroker":
        from actors.tools.bench.peers.raybroker import RayBroker

        ensure_ray()
        peer = RayBroker(str(tmp))
        stack.callback(peer.stop)
        return lambda: peer
    if system == "redis-streams":
        from actors.tools.bench.peers.redis_streams import RedisStreams

        server = servers.start_redis(tmp)
        if isinstance(server, servers.Server):
            stack.callback(server.stop)
            return lambda: RedisStreams(server.port, server.pid)
        return server
    if system == "rabbitmq":
        from actors.tools.bench.peers.rabbitmq import RabbitMQ

        server = servers.start_rabbitmq(tmp)
        if isinstance(server, servers.Server):
            stack.callback(server.stop)
            return lambda: RabbitMQ(server.port, server.pid)
        return server
    if system == "ray-queue":
        from actors.tools.bench.peers.ray_queue import RayQueue

        ensure_ray()
        return RayQueue
    if system == "raw-sqlite":
        from actors.tools.bench.peers.raw_sqlite import RawSqlite

        return lambda: RawSqlite(str(tmp))
    raise InvalidArgument(f"unknown system {system!r}; known: {', '.join(SYSTEMS)}")


async def _measure_all(
    system: str, make: Callable[[], Any], workloads: list[Workload], progress: Progress
) -> list[Row]:
    peer = make()
    rows = []
    try:
        for w in workloads:
            progress(f"{system}: {w.variant}: {w.messages:,} messages")
            try:
                await peer.open(w)
                try:
                    m = await drive(w, peer)
                finally:
                    await peer.close()
            except Exception as exc:  # one workload failing must not lose the others' rows
                note = f"failed: {type(exc).__name__}: {exc}"
                progress(f"{system}: {w.variant}: {note}")
                rows.append(Row(system, w.variant, 0.0, notes=note))
                continue
            rows.append(_row(peer, w, m))
            progress(f"{system}: {w.variant}: {rows[-1].messages_per_s:,.0f} msg/s")
    finally:
        if hasattr(peer, "aclose"):
            await peer.aclose()
    return rows


def _row(peer: Peer, w: Workload, m: Measurement) -> Row:
    verdict = check(expected(w), m.acked)
    lat = sorted(m.latencies_ms)
    notes = [NOTES[peer.name], *([peer.detail] if peer.detail else [])]
    if peer.consumers(w) != w.consumers:
        n = peer.consumers(w)
        notes.append(f"{n} consumer{'s' if n > 1 else ''} (not {w.consumers})")
    # paced: a system that falls behind the producer shows a backlog's latency, not its own
    behind = m.elapsed_s - w.messages / w.rate if w.rate else 0.0
    if behind > BEHIND_S:
        notes.append(f"{behind:.1f} s behind the {w.rate:,.0f}/s pace at the end")
    if m.stalled:
        notes.append(f"stalled: nothing acknowledged for {STALL_S:.0f} s")
    if not verdict.clean:
        notes.append(verdict.describe())
    return Row(
        peer.name,
        w.variant,
        len(m.acked) / m.elapsed_s if m.elapsed_s > 0 else 0.0,
        percentile(lat, 0.5),
        percentile(lat, 0.99),
        m.cpu_s / (w.messages / 1000),
        "; ".join(notes),
        verdict.lost,
        verdict.doubled,
        verdict.out_of_order,
    )


def _compare(rows: list[Row]) -> None:
    """raybroker's rows: its rate as a multiple of each peer's measured in the same workload."""
    for row in rows:
        if row.system != "raybroker" or not row.messages_per_s:
            continue
        ratios = [
            f"{row.messages_per_s / other.messages_per_s:.2f}x {other.system}"
            for other in rows
            if other.variant == row.variant and other.system != "raybroker" and other.messages_per_s
        ]
        if ratios:
            row.notes += "; " + ", ".join(ratios)
