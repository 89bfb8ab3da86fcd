"""`raybroker demo`: the main job, on a local embedded Ray.

It deploys the sales-by-region topology (seed 000: a shop, two replicated routers, three regional
brokers whose activated readers answer every order), builds a Spark DataFrame of orders, ingests
it through the router set from Spark's executors (one dialog per order, its lines in order),
waits for every reply at the shop, then reads every broker's delivery audit into Spark and
reconciles it against the input both ways: each line reached a router once and in order, and
each reply came back once and in order. It prints messages per region, throughput, latency and
the lost / doubled / out-of-order counts, which must all be zero.
"""

from __future__ import annotations

import tempfile
import time
from importlib import resources
from typing import Any

from actors import ensure_ray

REGIONS = ("EU", "US", "APAC")
LINES = 3  # Order messages per order (its lines), one dialog per order


def run(orders: int = 2000, path: str | None = None, progress: Any = print) -> int:
    from spark_bridge import AuditCursor, ingest, reconcile, spark_session
    from spark_bridge.session import short_jobs_configs
    from topologies.deploy import deploy
    from topologies.loader import load

    ensure_ray()
    topology = load(str(resources.files("topologies") / "sales_by_region.yaml"))
    with tempfile.TemporaryDirectory(prefix="raybroker-demo-") as tmp:
        data = path or tmp
        progress(f"deploying {topology.source} into {data}")
        d = deploy(topology, data, progress=lambda s: progress(f"  {s}"))
        try:
            progress("starting Spark on Ray (RayDP)")
            with spark_session(configs=short_jobs_configs()) as spark:
                df = _orders(spark, orders)
                rows = orders * LINES
                progress(f"ingesting {orders:,} orders ({rows:,} lines) through the routers")
                t0 = time.perf_counter()
                report = ingest(
                    df,
                    d.router_sets["sales-routers"],
                    from_service="Store",
                    contract="Sales",
                    message_type="Order",
                    body="body",
                    key="order",
                    order="line",
                )
                _collect_replies(d.brokers["shop"], rows, progress)
                elapsed = time.perf_counter() - t0
                progress("reading every broker's delivery audit into Spark and reconciling")
                brokers = [*d.brokers.values(), *d.router_sets["sales-routers"].replicas.values()]
                audit = AuditCursor(brokers).read(spark)
                args = {"ingest_id": report.ingest_id, "key": "order", "order": "line"}
                there = reconcile(audit, df, **args)
                back = reconcile(audit, df, **args, replies=True)
                ok = _summary(audit, report, there, back, rows, elapsed, progress)
        finally:
            d.stop(delete_stores=path is None)
    return 0 if ok else 1


def _orders(spark: Any, orders: int) -> Any:
    """`orders` orders of LINES lines: the order id (the dialog's key), the line (its order),
    and the body, a struct sent as JSON naming the region the routers classify by."""
    from pyspark.sql import functions as F

    region = F.element_at(
        F.array(*map(F.lit, REGIONS)), (F.col("order") % len(REGIONS) + 1).cast("int")
    )
    return (
        spark.range(orders * LINES)
        .select(
            (F.col("id") / LINES).cast("long").alias("order"), (F.col("id") % LINES).alias("line")
        )
        .select(
            "order",
            "line",
            F.struct(
                region.alias("region"),
                F.col("order"),
                F.col("line"),
                F.concat(F.lit("sku-"), (F.col("order") * 7 + F.col("line")) % 500).alias("sku"),
                (F.col("line") + 1).alias("qty"),
            ).alias("body"),
        )
        .cache()
    )


def _collect_replies(shop: Any, rows: int, progress: Any, timeout_s: float = 300.0) -> None:
    """Receive and commit replies at the shop until there is one per line (or time is up)."""
    got, shown, deadline = 0, time.monotonic(), time.monotonic() + timeout_s
    while got < rows and time.monotonic() < deadline:
        groups = shop.receive("StoreQ", max_groups=200, top=50_000, wait=0.5)
        got += sum(len(g.messages) for g in groups)
        if groups:
            shop.commit(groups)
        if time.monotonic() - shown > 2.0:
            progress(f"  replies at the shop: {got:,}/{rows:,}")
            shown = time.monotonic()
    progress(f"  replies at the shop: {got:,}/{rows:,}")


def _summary(audit, report, there, back, rows: int, elapsed: float, progress: Any) -> bool:
    from pyspark.sql import functions as F

    records = audit.df
    per_region = {
        r["to_service"]: r["n"]
        for r in records.filter(F.col("to_service").startswith("Sales") & F.col("from_initiator"))
        .filter(F.col("message_type") == "Order")
        .groupBy("to_service")
        .agg(F.count("*").alias("n"))
        .collect()
    }
    ours = F.col("conversation_id").startswith(f"{report.ingest_id}/")
    sent = records.filter(ours & F.col("from_initiator")).select(
        "conversation_id", "sequence_number", "sent_at"
    )
    replied = records.filter(ours & ~F.col("from_initiator")).select(
        "conversation_id", "sequence_number", "committed_at"
    )
    trips = sent.join(replied, ["conversation_id", "sequence_number"]).select(
        ((F.col("committed_at") - F.col("sent_at")) * 1000).alias("ms")
    )
    p50, p99 = trips.approxQuantile("ms", [0.5, 0.99], 0.001) or (float("nan"),) * 2
    lost = there.missing + back.missing + there.unaccounted + back.unaccounted
    doubled = there.doubled + back.doubled
    out_of_order = there.out_of_order + back.out_of_order
    table = [
        ("orders (dialogs)", f"{report.dialogs:,}"),
        ("order lines sent", f"{report.sent:,} of {report.rows:,} rows"),
        *(
            (f"lines at {svc}", f"{per_region.get(svc, 0):,}")
            for svc in (f"Sales{r}" for r in REGIONS)
        ),
        ("replies back at the shop", f"{back.delivered:,}"),
        ("ingest", f"{report.elapsed_s:.1f}s ({report.rows_per_s:,.0f} rows/s)"),
        ("end to end", f"{elapsed:.1f}s ({2 * rows / elapsed:,.0f} messages/s, there and back)"),
        ("latency order sent -> reply committed", f"p50 {p50:,.0f} ms, p99 {p99:,.0f} ms"),
        ("lost", f"{lost}"),
        ("doubled", f"{doubled}"),
        ("out of order", f"{out_of_order}"),
    ]
    width = max(len(k) for k, _ in table)
    progress("")
    progress("sales by region: summary")
    for k, v in table:
        progress(f"  {k.ljust(width)}  {v}")
    ok = there.ok and back.ok and there.expected == rows and not report.rejected
    progress(
        "  result".ljust(width + 2)
        + ("  every line once, in order, both ways" if ok else "  FAILED")
    )
    return ok
