"""`raybroker bench ddr`: data-dependent routing end to end (initiator send -> target
receive+commit), through 1, 2 and 4 forwarding router replicas and in redirect mode, beside the
same load sent directly to the targets (no router) in the same run.

One initiator broker opens the dialogs; each dialog's first message names its region (EU or US),
which the router's classifier turns into the target service (SalesEU, SalesUS, each on its own
broker); the rest of the load then goes in batches over those dialogs, `inflight` calls at once.
`cpu s/1k`: the CPU of the driver and of every broker process (the routers' too) per 1,000
messages, from the dialogs' opening to the last commit; on a small machine the sum is the bound.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import asdict

from actors import Begin, Queue, Send, Service, start_broker
from actors.ddr import RouterConfig, begin_redirected
from actors.remote.client import Broker
from actors.remote.routers import RouterSet
from actors.remote.runtime import ensure_ray
from actors.tools.bench.local import Cpu, receive_all, send_all
from actors.tools.bench.report import DEFAULT_LOAD, Load, Progress, Report, Row

REGIONS = ("EU", "US")
CLASSIFIER = "actors.ddr.classifiers:field"
TIMEOUT_S = 600.0  # one variant's load, end to end, at the most
DIRECT = "direct (no router)"


def run(
    load: Load = DEFAULT_LOAD, replicas: tuple[int, ...] = (1, 2, 4), progress: Progress = print
) -> Report:
    report = Report("ddr", {**asdict(load), "replicas": list(replicas), "inflight": 4})
    ensure_ray()
    tag = uuid.uuid4().hex[:6]
    with tempfile.TemporaryDirectory(prefix="raybroker-bench-") as tmp:
        shop = start_broker(f"ddr-shop-{tag}", os.path.join(tmp, "shop.sqlite"))
        targets = {
            f"Sales{r}": start_broker(f"ddr-{r}-{tag}", os.path.join(tmp, f"{r}.sqlite"))
            for r in REGIONS
        }
        brokers = [shop, *targets.values()]
        try:
            shop.create(Queue("StoreQ"))
            shop.create(Service("Store", "StoreQ"))
            for service, b in targets.items():
                b.create(Queue(f"{service}Q"))
                b.create(Service(service, f"{service}Q", ["DEFAULT"]))
                shop.create_route(f"direct-{service}", service, address=f"ray://{b.name}")
            config = RouterConfig(
                "SalesRouter", tuple(targets), CLASSIFIER, "forward", {"template": "Sales{value}"}
            )

            def router_set(n: int, mode: str = "forward") -> RouterSet:
                cfg = RouterConfig(**{**config.options(), "mode": mode})
                return RouterSet(
                    f"ddr-r{n}{mode[0]}-{tag}",
                    cfg,
                    store_dir=tmp,
                    initiators=[shop],
                    initiator_services=["Store"],
                    targets=targets,
                ).start(n)

            progress(f"direct (no router): {load.messages:,} messages over {load.dialogs} dialogs")
            direct, cpu = _drive(shop, targets, load, _open_direct)
            report.rows.append(Row("raybroker", DIRECT, direct, cpu_s_per_1k=cpu))
            for n in replicas:
                progress(f"router forwarding, {n} replica(s)")
                rs = router_set(n)
                try:
                    rate, cpu = _drive(shop, targets, load, _open_via_router, rs)
                finally:
                    rs.stop(delete_stores=True)
                report.rows.append(
                    Row(
                        "raybroker",
                        f"router forwarding, {n} replica{'s' if n > 1 else ''}",
                        rate,
                        cpu_s_per_1k=cpu,
                        vs=[["raybroker", DIRECT, "direct"]],
                    )
                )
            progress("router redirect, 2 replicas")
            rs = router_set(2, "redirect")
            try:
                rate, cpu = _drive(shop, targets, load, _open_redirected, rs)
            finally:
                rs.stop(delete_stores=True)
            notes = "one router round trip per dialog, then direct"
            report.rows.append(Row("raybroker", "router redirect, 2 replicas", rate,
                                   cpu_s_per_1k=cpu, notes=notes,
                                   vs=[["raybroker", DIRECT, "direct"]]))  # fmt: skip
        finally:
            for b in brokers:
                b.stop(delete_store=True)
    return report


def _first_body(i: int) -> tuple[str, bytes]:
    region = REGIONS[i % len(REGIONS)]
    return region, json.dumps({"region": region, "order": i}).encode()


def _open_direct(shop: Broker, dialogs: int) -> list[tuple[str, str]]:
    ops, opened = [], []
    for i in range(dialogs):
        region, body = _first_body(i)
        op = Begin("Store", f"Sales{region}", encryption=False)
        ops += [op, Send(op.handle, "DEFAULT", body)]
        opened.append((op.handle, region))
    shop.apply(ops)
    return opened


def _open_via_router(shop: Broker, dialogs: int) -> list[tuple[str, str]]:
    ops, opened = [], []
    for i in range(dialogs):
        region, body = _first_body(i)
        op = Begin("Store", "SalesRouter", encryption=False)
        ops += [op, Send(op.handle, "DEFAULT", body)]
        opened.append((op.handle, region))
    shop.apply(ops)
    return opened


def _open_redirected(shop: Broker, dialogs: int) -> list[tuple[str, str]]:
    opened = []
    for i in range(dialogs):
        region, body = _first_body(i)
        handle, _ = begin_redirected(
            shop, "Store", "StoreQ", "SalesRouter", "DEFAULT", "DEFAULT", body, encryption=False
        )
        opened.append((handle, region))
    return opened


def _drive(
    shop: Broker,
    targets: dict[str, Broker],
    load: Load,
    open_dialogs,
    routers: RouterSet | None = None,
) -> tuple[float, float]:
    """Open the dialogs (one first message each), send the load over them and wait until the
    targets have received and committed every message: messages per second, end to end, and the
    CPU seconds per 1,000 messages of this driver and every broker (the routers' too)."""
    replicas = list(routers.replicas.values()) if routers is not None else []
    cpu = Cpu(shop, *targets.values(), *replicas)
    t0 = time.perf_counter()
    opened = open_dialogs(shop, load.dialogs)
    bulk = load.messages - load.dialogs
    batches = max(1, bulk // load.batch)
    per_region = Counter(region for _, region in opened)
    for i in range(batches):
        per_region[opened[i % len(opened)][1]] += load.batch
    handles = [h for h, _ in opened]

    async def both() -> None:
        await asyncio.gather(
            send_all(shop, handles, batches * load.batch, load.batch, b"x" * 100, 4),
            *(
                receive_all(b, per_region[s.removeprefix("Sales")], 16, 1, queue=f"{s}Q")
                for s, b in targets.items()
            ),
        )

    asyncio.run(asyncio.wait_for(both(), TIMEOUT_S))
    _drain_redirects(shop)
    messages = sum(per_region.values())
    return messages / (time.perf_counter() - t0), cpu.per_1k(messages)


def _drain_redirects(shop: Broker) -> None:
    """Clear what routers sent back to the initiator (redirects, ends), between variants."""
    while groups := shop.receive("StoreQ", max_groups=1000):
        shop.commit(groups)
