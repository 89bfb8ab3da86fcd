"""`raybroker bench ingest`: N rows of a cached DataFrame into a durable queue, timed from the
ingest call until every row is committed in the broker's store, beside, in the same run:

- the ingest of the same rows cached already partitioned by key, which Spark need not shuffle;
- driver-loop: the best loop a user would write on the driver: the DataFrame to pandas through
  Arrow, sorted by key and order, the same batched `apply` calls, as many in flight as the
  ingest's senders keep in all;
- broker send-only: the same calls, built beforehand in the driver, so only the broker works;
- where an ingest's time goes: Spark arranging and streaming the rows to the executors' Python
  workers with nothing sent, then also planning the calls.

Every variant's messages are then received and checked: each row once, each key in order.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from actors import Contract, MessageType, Queue, Service, start_broker
from actors.remote.runtime import ensure_ray
from actors.tools.bench.report import Load, Progress, Report, Row

from .arrange import arrangement
from .ingest import IN_FLIGHT as INGEST_IN_FLIGHT
from .ingest import ingest
from .plan import IngestSpec, PartitionPlanner
from .session import spark_session

KEYS = 1000
BODY_BYTES = 100
# the driver loop's and send-only's calls under way at once: as many as the ingest keeps in all
# (INGEST_IN_FLIGHT a sender, a sender per executor core: 2 cores here)
IN_FLIGHT = 16
SEND = {"from_service": "Loader", "to_service": "Sink", "contract": "Load"}
COLUMNS = {"message_type": "Row", "body": "body", "key": "key", "order": "ts"}  # of its frames


def run(load: Load, progress: Progress = print, batch_rows: int = 4000) -> Report:
    rows = load.messages
    report = Report(
        "ingest",
        {
            "rows": rows,
            "keys": KEYS,
            "body_bytes": BODY_BYTES,
            "batch_rows": batch_rows,
            "in_flight_per_sender": INGEST_IN_FLIGHT,
            "in_flight_driver": IN_FLIGHT,
            "brokers": 1,
        },
    )
    ensure_ray()
    with tempfile.TemporaryDirectory(prefix="raybroker-bench-") as tmp, spark_session() as spark:
        broker = start_broker(f"bench-ingest-{uuid.uuid4().hex[:8]}", os.path.join(tmp, "b.db"))
        try:
            define(broker)
            progress(f"caching {rows:,} rows in Spark")
            df = _frame(spark, rows)
            df.count()
            # each run has a Spark session of its own: a tenth of the rows through both paths
            # first starts the executors' Python workers and warms the JVM for either, so the
            # one measured first does not pay that alone
            progress("warm-up: a tenth of the rows through the ingest and the driver loop")
            warm = _frame(spark, max(10_000, rows // 10))
            ingest(warm, broker, **SEND, **COLUMNS, progress=False)
            _drain(broker, None)
            _driver_loop(broker, warm, batch_rows)
            _drain(broker, None)
            warm.unpersist()

            progress(f"raybroker: ingest of {rows:,} rows from Spark's executors")
            rep, rate = _timed_ingest(df, broker, batch_rows)
            vs_loop = [["driver-loop", "toPandas + apply", "driver-loop"]]
            vs_send = [["raybroker", "broker send-only", "broker send-only"]]
            notes = f"{rep.calls} calls, {rep.dialogs} dialogs"
            row = Row("raybroker", "ingest (executors)", rate, notes=notes, vs=vs_loop + vs_send)
            report.rows.append(_checked(broker, rows, row))

            progress("raybroker: the same rows, cached partitioned by key (no shuffle needed)")
            keyed = df.repartition(spark.sparkContext.defaultParallelism, "key").cache()
            keyed.count()
            rep, rate = _timed_ingest(keyed, broker, batch_rows)
            keyed.unpersist()
            notes = f"{'shuffled' if rep.shuffled else 'not shuffled'}, {rep.calls} calls"
            vs_ingest = [["raybroker", "ingest (executors)", "the ingest"]]
            variant = "ingest (input partitioned by key)"
            row = Row("raybroker", variant, rate, notes=notes, vs=vs_ingest + vs_send)
            report.rows.append(_checked(broker, rows, row))

            progress("driver-loop: toPandas (Arrow), then batched apply calls from the driver")
            t0 = time.perf_counter()
            table, n_calls = _driver_loop(broker, df, batch_rows)
            rate = rows / (time.perf_counter() - t0)
            report.rows.append(
                _checked(
                    broker,
                    rows,
                    Row(
                        "driver-loop",
                        "toPandas + apply",
                        rate,
                        notes=f"{n_calls} calls, {IN_FLIGHT} in flight",
                    ),
                )
            )

            progress("broker: send-only, the same calls built beforehand")
            calls = list(_calls(table, batch_rows))
            t0 = time.perf_counter()
            asyncio.run(_send(broker, calls))
            rate = rows / (time.perf_counter() - t0)
            report.rows.append(
                _checked(
                    broker,
                    rows,
                    Row(
                        "raybroker",
                        "broker send-only",
                        rate,
                        notes="calls built before the clock starts",
                    ),
                )
            )

            progress("where the time goes: Spark arranging and streaming, no sends")
            for variant, plan in (
                ("spark: arrange + stream", False),
                ("spark: arrange + stream + plan calls", True),
            ):
                t0 = time.perf_counter()
                seen = _dry(df, batch_rows, plan)
                report.rows.append(
                    Row(
                        "spark",
                        variant,
                        rows / (time.perf_counter() - t0),
                        notes=f"{seen:,} rows streamed, nothing sent",
                    )
                )
        finally:
            broker.stop()
    return report


def _timed_ingest(df: Any, broker: Any, batch_rows: int) -> tuple[Any, float]:
    """An ingest of `df`'s rows: its report, and rows a second from the call to its return."""
    t0 = time.perf_counter()
    rep = ingest(df, broker, **SEND, **COLUMNS, batch_rows=batch_rows, progress=False)
    return rep, rep.rows / (time.perf_counter() - t0)


def define(broker: Any) -> None:
    """The bench's catalog on `broker`: Loader sends Row messages to Sink."""
    broker.create(MessageType("Row"))
    broker.create(Contract("Load", {"Row": "initiator"}))
    broker.create(Queue("LoaderQ"))
    broker.create(Queue("SinkQ"))
    broker.create(Service("Loader", "LoaderQ"))
    broker.create(Service("Sink", "SinkQ", ["Load"]))


def _frame(spark: Any, rows: int) -> Any:
    """Rows `id` over KEYS keys, ordered by id within a key; the body starts with the id."""
    from pyspark.sql import functions as F

    pad = "x" * (BODY_BYTES - 12)
    return (
        spark.range(rows)
        .select(
            (F.col("id") % KEYS).alias("key"),
            F.col("id").alias("ts"),
            F.concat(F.lpad(F.col("id").cast("string"), 12, "0"), F.lit(pad)).alias("body"),
        )
        .cache()
    )


def _spec(batch_rows: int) -> IngestSpec:
    return IngestSpec(
        ingest_id=uuid.uuid4().hex,
        run=uuid.uuid4().hex[:16],
        **SEND,
        message_type=MessageType("Row"),
        body="body",
        key="key",
        batch_rows=batch_rows,
    )


def _driver_loop(broker: Any, df: Any, batch_rows: int) -> tuple[pa.Table, int]:
    """The driver loop: the rows to pandas, sorted by key and order, sent in batched calls;
    the rows as Arrow and how many calls."""
    table = pa.Table.from_pandas(df.toPandas().sort_values(["key", "ts"]), preserve_index=False)
    calls = list(_calls(table, batch_rows))
    asyncio.run(_send(broker, calls))
    return table, len(calls)


def _calls(table: pa.Table, batch_rows: int) -> Iterator[Any]:
    planner = PartitionPlanner(_spec(batch_rows))
    for batch in table.to_batches(max_chunksize=batch_rows):
        yield from planner.calls(batch)


async def _send(broker: Any, calls: list[Any]) -> None:
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one(call: Any) -> None:
        async with gate:
            await broker.aio.apply(call.ops, request_id=call.request_id)

    await asyncio.gather(*(one(c) for c in calls))  # tasks start, so issue, in list order


def _dry(df: Any, batch_rows: int, plan: bool) -> int:
    """Rows Spark streams to the Python workers for an ingest, optionally planned into calls."""
    spec = _spec(batch_rows)

    def count(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        planner = PartitionPlanner(spec)
        n = 0
        for batch in batches:
            if plan:
                for _ in planner.calls(batch):
                    pass
            n += batch.num_rows
        yield pa.RecordBatch.from_pylist([{"n": n}])

    frame = arrangement(df, "key", "ts", None, columns=["body"]).frame
    return sum(r.n for r in frame.mapInArrow(count, "n long").collect())


def _drain(broker: Any, rows: int | None) -> tuple[int, int, int]:
    """Receive and commit everything on the sink queue; (lost, doubled, out of order) against
    `rows` rows numbered 0..rows-1 (a key's ids must arrive increasing)."""
    seen: dict[int, int] = {}
    last: dict[str, int] = {}
    out_of_order = 0
    while got := broker.receive("SinkQ", max_groups=256, top=200_000):
        for g in got:
            for m in g.messages:
                i = int(m.body[:12])
                seen[i] = seen.get(i, 0) + 1
                if last.get(m.conversation_handle, -1) > i:
                    out_of_order += 1
                last[m.conversation_handle] = i
        broker.commit(got)
    if rows is None:
        return 0, 0, 0
    lost = sum(1 for i in range(rows) if i not in seen)
    doubled = sum(c - 1 for c in seen.values() if c > 1)
    return lost, doubled, out_of_order


def _checked(broker: Any, rows: int, row: Row) -> Row:
    row.lost, row.doubled, row.out_of_order = _drain(broker, rows)
    return row
