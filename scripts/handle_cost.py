"""The CPU a message costs the client's process and the broker's, through a real handle on a
local Ray, in the shapes of `raybroker bench peers`' bulk workloads: calls of 1,000 messages on
one conversation (`one`) or 10 on each of 100 (`spread`), 4 calls in flight, and 4 consumers
receiving up to 32 groups a call and committing them in their next. Producer and consumers run
in one client process, as asyncio tasks on one handle.

Each run is a process of its own (its own local Ray), so a setting that applies when a handle is
made applies to it; runs alternate between the settings compared, and each line gives the
median of the runs and their spread (max - min, as a share of the median):

    python scripts/handle_cost.py [MESSAGES] [RUNS]

compares, for both shapes, the client's collector as a handle sets it (actors.collector) with
Python's default kept (`RAYBROKER_KEEP_GC=1`). `... run SHAPE MESSAGES` is one run; it prints
a JSON line, with the collector's passes by generation and their seconds.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CONSUMERS = 4
INFLIGHT = 4
GROUPS_PER_CALL = 32
BODY = bytes(100)


def one_run(shape: str, messages: int) -> dict:
    import psutil
    import ray

    from actors import Begin, Queue, Send, Service, start_broker

    ray.init(num_cpus=2, logging_level="ERROR", log_to_driver=False)
    folder = tempfile.mkdtemp(prefix="raybroker-handle-cost-")
    b = start_broker("handle-cost", os.path.join(folder, "b.sqlite"))
    b.create(Queue("I"))
    b.create(Queue("T"))
    b.create(Service("Init", "I", []))
    b.create(Service("Svc", "T", ["DEFAULT"]))
    handles = b.apply([Begin("Init", "Svc") for _ in range(100)])["handles"]
    broker_process = psutil.Process(b.info()["pid"])
    passes: dict[str, float] = {}
    started: list[float] = []

    def counted(phase: str, info: dict) -> None:
        if phase == "start":
            started[:] = [time.perf_counter()]
        else:
            g = info["generation"]
            passes[f"gen{g}"] = passes.get(f"gen{g}", 0) + 1
            passes[f"gen{g}_s"] = passes.get(f"gen{g}_s", 0.0) + time.perf_counter() - started[0]

    async def flow() -> None:
        taken = [0]
        slots = asyncio.Semaphore(INFLIGHT)

        async def send(i: int) -> None:
            async with slots:
                if shape == "spread":
                    ops = [Send(h, "DEFAULT", [BODY] * 10) for h in handles]
                else:
                    ops = [Send(handles[i % len(handles)], "DEFAULT", [BODY] * 1000)]
                await b.aio.apply(ops)

        async def consume() -> None:
            groups: list = []
            while taken[0] < messages:
                groups = await b.aio.receive(
                    "T", wait=0.0 if groups else 0.2, commit=groups, max_groups=GROUPS_PER_CALL
                )
                taken[0] += sum(len(g.messages) for g in groups)
            if groups:
                await b.aio.commit(groups)

        sends = asyncio.gather(*(send(i) for i in range(messages // 1000)))
        await asyncio.gather(sends, *(consume() for _ in range(CONSUMERS)))

    gc.callbacks.append(counted)
    cpu0, broker0 = time.process_time(), sum(broker_process.cpu_times()[:2])
    t0 = time.perf_counter()
    asyncio.run(flow())
    elapsed = time.perf_counter() - t0
    client_s = time.process_time() - cpu0
    broker_s = sum(broker_process.cpu_times()[:2]) - broker0
    gc.callbacks.remove(counted)
    b.stop()
    ray.shutdown()
    return {
        "shape": shape,
        "rate": messages / elapsed,
        "client_us": client_s / messages * 1e6,
        "broker_us": broker_s / messages * 1e6,
        "thresholds": gc.get_threshold(),
        **passes,
    }


def _median(runs: list[dict], key: str) -> str:
    values = [r[key] for r in runs]
    mid = statistics.median(values)
    return f"{mid:,.2f} (spread {(max(values) - min(values)) / mid:.0%})"


def compare(messages: int, runs: int) -> None:
    settings = {"as a handle sets it": {}, "Python's default kept": {"RAYBROKER_KEEP_GC": "1"}}
    for shape in ("one", "spread"):
        results: dict[str, list[dict]] = {name: [] for name in settings}
        for _ in range(runs):  # alternating, so drift falls on both alike
            for name, env in settings.items():
                out = subprocess.run(
                    [sys.executable, __file__, "run", shape, str(messages)],
                    env={**os.environ, **env},
                    capture_output=True,
                    text=True,
                    check=True,
                )
                results[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
        for name, rs in results.items():
            print(
                f"{shape:6} client's collector {name:22}: {_median(rs, 'rate')} msg/s, "
                f"client {_median(rs, 'client_us')} us/msg, broker {_median(rs, 'broker_us')} "
                f"us/msg; thresholds {rs[0]['thresholds']}"
            )


def main() -> None:
    if sys.argv[1:2] == ["run"]:
        print(json.dumps(one_run(sys.argv[2], int(sys.argv[3]))))
        return
    messages = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    compare(messages, runs)


if __name__ == "__main__":
    main()
