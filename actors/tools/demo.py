"""`raybroker demo`: the main job, on a local embedded Ray.

It deploys the sales-by-region topology (seed 000: a shop, two replicated routers, three regional
brokers whose activated readers answer every order; dialog and transport security on), builds a
Spark DataFrame of orders, ingests it through the router set from Spark's executors (one dialog
per order, its lines in order) while the shop receives the replies as they come, then reads
every broker's delivery audit into Spark and reconciles it against the input both ways: each
line reached a router once and in order, and each reply came back once and in order. A small
first ingest starts what starts on first use (Spark's Python workers, the regions' readers), so
the figures are the pipeline's; start-up (Ray, the deploy, Spark, that first use) is reported
apart. Then two phases: at full load (`orders` orders sent as fast as the routers take them:
the pipeline's throughput, its latency that of a queue building up), and at a steady rate
(`STEADY_SHARE` of the full load's, paced by the ingest for `steady_s` seconds: the latency an
order sees when the pipeline keeps up). It shows one live line (rows sent, their rate, replies,
the lag), then messages per region, both phases' rates and latencies, and the lost / doubled /
out-of-order counts, which must all be zero.
"""

from __future__ import annotations

import math
import tempfile
import threading
import time
from dataclasses import dataclass
from importlib import resources
from typing import Any

from actors import ensure_ray
from actors.errors import InvalidArgument

REGIONS = ("EU", "US", "APAC")
LINES = 3  # Order messages per order (its lines), one dialog per order


STEADY_SHARE = 0.65  # the steady phase's rate, as a share of the rate measured at full load
FIRST_USE = 10**9  # the first use's order ids start here, past any phase's


def run(
    orders: int = 10_000, path: str | None = None, steady_s: float = 30.0, progress: Any = print
) -> int:
    from spark_bridge import AuditCursor, spark_session
    from spark_bridge.session import short_jobs_configs
    from topologies.deploy import deploy
    from topologies.loader import load

    if not isinstance(orders, int) or orders < 1:
        raise InvalidArgument(f"the demo needs at least 1 order, not {orders!r}")
    if not 0 < steady_s < math.inf:
        raise InvalidArgument(f"the steady phase needs a time above 0 s, not {steady_s!r}")
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
                _phase(spark, shop, routers, warm, first=FIRST_USE, show=lambda s: None)
                startup["first use"] = time.perf_counter() - t
                progress(f"full load: {orders:,} orders ({orders * LINES:,} lines) as fast as "
                         "the routers take them")  # fmt: skip
                full = _phase(spark, shop, routers, orders, first=0, show=progress)
                # the full load's rate is the pipeline's, from its first line sent to its last
                # reply (the ingest's call also waits for Spark to start its job): from the
                # audits, read now up to here and at the end from here on
                cursor = AuditCursor([*d.brokers.values(), *routers.replicas.values()])
                early = cursor.read(spark)
                rate = STEADY_SHARE * full.rows / _flow_s(early.df, full.report.ingest_id)
                steady = max(1, round(rate * steady_s / LINES))
                progress(f"steady rate: {steady:,} orders at {rate:,.0f} lines/s "
                         f"({STEADY_SHARE:.0%} of full load) for {steady_s:.0f}s")  # fmt: skip
                paced = _phase(spark, shop, routers, steady, first=orders, show=progress,
                               rows_per_s=rate)  # fmt: skip
                progress("reading every broker's delivery audit into Spark and reconciling")
                audit = _joined(early, cursor.read(spark))
                ok = _summary(audit, [full, paced], startup, progress)
        finally:
            d.stop(delete_stores=path is None)
    return 0 if ok else 1


@dataclass
class Phase:
    """One ingest of orders through the routers, with every reply collected: `elapsed` seconds
    from the ingest's call (Spark's start of its job included) to the last reply."""

    df: Any
    report: Any
    rows: int
    started: float  # time.time() as the ingest began
    elapsed: float


def _phase(
    spark: Any, shop: Any, routers: Any, orders: int, first: int, show: Any,
    rows_per_s: float | None = None,
) -> Phase:  # fmt: skip
    from spark_bridge import ingest

    df = _orders(spark, orders, first)
    rows = orders * LINES
    # paced: calls of a tenth of a second's rows (the ingest's default), so rows go out evenly
    options: dict[str, Any] = {} if rows_per_s is None else {"rows_per_s": rows_per_s}
    started, t = time.time(), time.perf_counter()
    with Replies(shop, rows, show) as replies:
        report = ingest(df, routers, from_service="Store", contract="Sales",
                        message_type="Order", body="body", key="order", order="line",
                        progress=replies.ingest_view, **options)  # fmt: skip
    return Phase(df, report, rows, started, time.perf_counter() - t)


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
        taken: list[Any] = []  # committed with the next receive: one round trip a turn
        try:
            while self.got < self.rows:
                if not self.sending.is_set():
                    deadline = deadline or time.monotonic() + self.timeout_s
                    if time.monotonic() > deadline:
                        break
                taken = self.shop.receive(
                    "StoreQ", max_groups=200, top=50_000, wait=0.2, commit=taken
                )
                self.got += sum(len(g.messages) for g in taken)
                if time.monotonic() - shown > 1.0:
                    self._show()
                    shown = time.monotonic()
            if taken:
                self.shop.commit(taken)
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


def _latency(records: Any, ingest_id: str) -> tuple[float, float]:
    """p50 and p99 in ms of an ingest's order lines, from sent at the shop to reply committed."""
    from pyspark.sql import functions as F

    ours = F.col("conversation_id").startswith(f"{ingest_id}/")
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
    return p50, p99


def _joined(first: Any, then: Any) -> Any:
    """Two reads of one audit cursor as one."""
    from spark_bridge.audit import AuditRead

    missed = {
        b: first.missed.get(b, 0) + then.missed.get(b, 0) for b in {**first.missed, **then.missed}
    }
    return AuditRead(first.df.unionByName(then.df), first.records + then.records, missed)


def _flow_s(records: Any, ingest_id: str) -> float:
    """Seconds from an ingest's first order line sent at the shop to its last reply committed
    there: the pipeline's time for the phase, without Spark's start of the ingest's job."""
    from pyspark.sql import functions as F

    line = F.col("from_initiator")
    [row] = (
        records.filter(F.col("conversation_id").startswith(f"{ingest_id}/"))
        .agg(
            F.min(F.when(line, F.col("sent_at"))).alias("first"),
            F.max(F.when(~line, F.col("committed_at"))).alias("last"),
        )
        .collect()
    )
    return row.last - row.first


def _hops(records: Any, since: float) -> str:
    """Where the steady phase's time goes, hop by hop along an order's path (to a router, to its
    region, the reply to a router, back to the shop): each hop's p50 in transit (sent by one
    broker -> stored by the next) and queued (stored -> received and committed)."""
    from pyspark.sql import functions as F

    from actors.ddr.router import ROUTER_QUEUE

    ms = lambda a, b: (F.col(a) - F.col(b)) * 1000  # noqa: E731
    rows = (
        records.filter(F.col("sent_at") >= since)
        .groupBy("message_type", "queue")
        .agg(
            F.percentile_approx(ms("arrived_at", "sent_at"), 0.5).alias("transit"),
            F.percentile_approx(ms("committed_at", "arrived_at"), 0.5).alias("queued"),
        )
        .collect()
    )
    # an order goes to a router first, then to its region; a reply to a router, then the shop
    rows.sort(key=lambda r: (r.message_type != "Order", r.queue != ROUTER_QUEUE))
    hops = [f"{r.queue} ({r.message_type}) {r.transit:,.0f} + {r.queued:,.0f}" for r in rows]
    return ", ".join(hops) + " ms"


def _summary(audit: Any, phases: list[Phase], startup: dict[str, float], progress: Any) -> bool:
    from pyspark.sql import functions as F

    from spark_bridge import reconcile

    records = audit.df
    # the routers' onward dialogs are their own: this run's are those sent after the full load
    # began (the first use's were all answered before)
    mine = records.filter(F.col("sent_at") >= phases[0].started)
    per_region = {
        r["to_service"]: r["n"]
        for r in mine.filter(F.col("to_service").startswith("Sales") & F.col("from_initiator"))
        .filter(F.col("message_type") == "Order")
        .groupBy("to_service")
        .agg(F.count("*").alias("n"))
        .collect()
    }
    there, back = [], []
    for p in phases:
        args = {"ingest_id": p.report.ingest_id, "key": "order", "order": "line"}
        there.append(reconcile(audit, p.df, **args))
        back.append(reconcile(audit, p.df, **args, replies=True))
    checks = there + back
    lost = sum(c.missing + c.unaccounted for c in checks)
    doubled = sum(c.doubled for c in checks)
    out_of_order = sum(c.out_of_order for c in checks)
    full, steady = phases
    full_p50, full_p99 = _latency(records, full.report.ingest_id)
    full_s, steady_s = (_flow_s(records, p.report.ingest_id) for p in phases)
    p50, p99 = _latency(records, steady.report.ingest_id)
    table = [
        ("orders (dialogs)", f"{sum(p.report.dialogs for p in phases):,}"),
        (
            "order lines sent",
            f"{sum(p.report.sent for p in phases):,} of "
            f"{sum(p.report.rows for p in phases):,} rows",
        ),  # fmt: skip
        *(
            (f"lines at {svc}", f"{per_region.get(svc, 0):,}")
            for svc in (f"Sales{r}" for r in REGIONS)
        ),
        ("replies back at the shop", f"{sum(b.delivered for b in back):,}"),
        ("start-up", ", ".join(f"{k} {v:.1f}s" for k, v in startup.items())),
        (
            "full load",
            f"{full.rows:,} lines in {full_s:.1f}s: {2 * full.rows / full_s:,.0f} messages/s "
            "there and back",
        ),  # fmt: skip
        ("latency at full load", f"p50 {full_p50:,.0f} ms, p99 {full_p99:,.0f} ms (queued)"),
        (
            "steady rate",
            f"{steady.rows:,} lines in {steady_s:.1f}s: {2 * steady.rows / steady_s:,.0f} "
            "messages/s there and back",
        ),  # fmt: skip
        ("latency at steady rate", f"p50 {p50:,.0f} ms, p99 {p99:,.0f} ms"),
        ("by hop, in transit + queued", _hops(records, steady.started)),
        ("lost", f"{lost}"),
        ("doubled", f"{doubled}"),
        ("out of order", f"{out_of_order}"),
    ]
    width = max(len(k) for k, _ in table)
    progress("")
    progress("sales by region: summary")
    for k, v in table:
        progress(f"  {k.ljust(width)}  {v}")
    ok = all(c.ok for c in checks) and all(
        t.expected == p.rows and not p.report.rejected for t, p in zip(there, phases, strict=True)
    )
    progress(
        "  result".ljust(width + 2)
        + ("  every line once, in order, both ways" if ok else "  FAILED")
    )
    return ok
