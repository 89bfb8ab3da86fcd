"""`raybroker demo`: the main job, on a local embedded Ray.

It deploys the sales-by-region topology (seed 000: a shop, two replicated routers, three regional
brokers whose activated readers answer every order; dialog and transport security on), builds a
Spark DataFrame of orders, ingests it through the router set from Spark's executors (one dialog
per order, its lines in order) while the shop receives the replies as they come, then reads
every broker's delivery audit into Spark and reconciles it against the input both ways: each
line reached a router once and in order, and each reply came back once and in order. A small
first ingest starts what starts on first use (Spark's Python workers, the regions' readers), so
the figures are the pipeline's; start-up (Ray, the deploy, Spark, that first use) is reported
apart. It shows one live line (rows sent, their rate, replies, the lag), then messages per
region, throughput, latency and the lost / doubled / out-of-order counts, which must all be
zero.
"""

from __future__ import annotations

import tempfile
import threading
import time
from importlib import resources
from typing import Any

from actors import ensure_ray

REGIONS = ("EU", "US", "APAC")
LINES = 3  # Order messages per order (its lines), one dialog per order


def run(orders: int = 2000, path: str | None = None, progress: Any = print) -> int:
    from spark_bridge import AuditCursor, reconcile, spark_session
    from spark_bridge.session import short_jobs_configs
    from topologies.deploy import deploy
    from topologies.loader import load

    startup: dict[str, float] = {}
    t = time.perf_counter()
    ensure_ray()
    startup["Ray"] = time.perf_counter() - t
    topology = load(str(resources.files("topologies") / "sales_by_region.yaml"))
    with tempfile.TemporaryDirectory(prefix="raybroker-demo-") as tmp:
        data = path or tmp
        progress(f"deploying {topology.source} into {data}")
        t = time.perf_counter()
        d = deploy(topology, data, progress=lambda s: progress(f"  {s}"))
        startup["deploy"] = time.perf_counter() - t
        try:
            progress("starting Spark on Ray (RayDP)")
            t = time.perf_counter()
            with spark_session(configs=short_jobs_configs()) as spark:
                startup["Spark"] = time.perf_counter() - t
                shop, routers = d.brokers["shop"], d.router_sets["sales-routers"]
                warm = max(30, orders // 20)
                progress(f"first use: {warm:,} orders start Spark's Python workers and the readers")
                t = time.perf_counter()
                with Replies(shop, warm * LINES, lambda s: None) as replies:
                    _ingest(_orders(spark, warm, first=orders), routers, replies.ingest_view)
                startup["first use"] = time.perf_counter() - t
                df = _orders(spark, orders)
                rows = orders * LINES
                progress(f"ingesting {orders:,} orders ({rows:,} lines) through the routers")
                started, t0 = time.time(), time.perf_counter()
                with Replies(shop, rows, progress) as replies:
                    report = _ingest(df, routers, replies.ingest_view)
                elapsed = time.perf_counter() - t0
                progress("reading every broker's delivery audit into Spark and reconciling")
                audit = AuditCursor([*d.brokers.values(), *routers.replicas.values()]).read(spark)
                args = {"ingest_id": report.ingest_id, "key": "order", "order": "line"}
                there = reconcile(audit, df, **args)
                back = reconcile(audit, df, **args, replies=True)
                timing = {"started": started, "elapsed": elapsed, "startup": startup}
                ok = _summary(audit, report, there, back, rows, timing, progress)
        finally:
            d.stop(delete_stores=path is None)
    return 0 if ok else 1


def _ingest(df: Any, routers: Any, show: Any) -> Any:
    from spark_bridge import ingest

    return ingest(df, routers, from_service="Store", contract="Sales", message_type="Order",
                  body="body", key="order", order="line", progress=show)  # fmt: skip


class Replies:
    """Receives and commits the replies at the shop while the orders go out (so an order's
    latency is the pipeline's, not the wait for the ingest to end), and shows one live line:
    rows sent and their rate, replies back, and the lag between them. Leaving the block waits
    for every reply (or `timeout_s`)."""

    def __init__(self, shop: Any, rows: int, progress: Any, timeout_s: float = 300.0) -> None:
        self.shop, self.rows, self.progress, self.timeout_s = shop, rows, progress, timeout_s
        self.got, self.view = 0, {"rows": 0, "rows_per_s": 0.0}
        self.sending = threading.Event()
        self.thread = threading.Thread(target=self._collect, daemon=True, name="demo-replies")
        self.error: BaseException | None = None

    def ingest_view(self, view: dict[str, Any]) -> None:
        self.view = view

    def __enter__(self) -> Replies:
        self.sending.set()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:  # the ingest failed: no more replies are coming
            self.timeout_s = 0.0
        self.sending.clear()
        self.thread.join()
        if self.error is not None and exc[0] is None:
            raise self.error

    def _collect(self) -> None:
        shown, deadline = 0.0, None
        try:
            while self.got < self.rows:
                if not self.sending.is_set():
                    deadline = deadline or time.monotonic() + self.timeout_s
                    if time.monotonic() > deadline:
                        break
                groups = self.shop.receive("StoreQ", max_groups=200, top=50_000, wait=0.2)
                self.got += sum(len(g.messages) for g in groups)
                if groups:
                    self.shop.commit(groups)
                if time.monotonic() - shown > 1.0:
                    self._show()
                    shown = time.monotonic()
            self._show()
        except BaseException as exc:  # the caller raises it
            self.error = exc

    def _show(self) -> None:
        sent = max(self.view["rows"], self.got)
        self.progress(f"  rows sent {sent:,}/{self.rows:,} ({self.view['rows_per_s']:,.0f}/s), "
                      f"replies {self.got:,}, lag {sent - self.got:,}")  # fmt: skip


def _orders(spark: Any, orders: int, first: int = 0) -> Any:
    """`orders` orders of LINES lines from order `first` on: the order id (the dialog's key),
    the line (its order), and the body, a struct sent as JSON naming the region the routers
    classify by."""
    from pyspark.sql import functions as F

    region = F.element_at(
        F.array(*map(F.lit, REGIONS)), (F.col("order") % len(REGIONS) + 1).cast("int")
    )
    return (
        spark.range(first * LINES, (first + orders) * LINES)
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


def _summary(audit, report, there, back, rows: int, timing: dict, progress: Any) -> bool:
    from pyspark.sql import functions as F

    records = audit.df
    ours = F.col("conversation_id").startswith(f"{report.ingest_id}/")
    # the routers' onward dialogs are their own: this run's are those sent after it began (the
    # first use's were all answered before)
    mine = records.filter(F.col("sent_at") >= timing["started"])
    elapsed = timing["elapsed"]
    per_region = {
        r["to_service"]: r["n"]
        for r in mine.filter(F.col("to_service").startswith("Sales") & F.col("from_initiator"))
        .filter(F.col("message_type") == "Order")
        .groupBy("to_service")
        .agg(F.count("*").alias("n"))
        .collect()
    }
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
        ("start-up", ", ".join(f"{k} {v:.1f}s" for k, v in timing["startup"].items())),
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
