"""An ingest with a dialog per few rows (a conversation per order, say), into one broker on a
local Ray with Spark on Ray: rows a second, after a warm-up tenth. Run it alone on the machine:

    python scripts/ingest_keys.py [ROWS] [ROWS_PER_KEY] [RUNS] [number|text]

(default 300,000 rows, 3 a key, so 100,000 dialogs, 3 runs, whole-number keys; `text`: keys
`order-<n>`). Each run ingests into a fresh broker (`raybroker bench ingest`'s catalog and body
shape) and drains it.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import uuid

from pyspark.sql import functions as F

from actors import start_broker
from actors.remote.runtime import ensure_ray
from spark_bridge.bench import COLUMNS, SEND, define
from spark_bridge.ingest import ingest
from spark_bridge.session import spark_session


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 300_000
    per_key = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    text = len(sys.argv) > 4 and sys.argv[4] == "text"
    ensure_ray()
    with tempfile.TemporaryDirectory() as tmp, spark_session() as spark:
        for i in range(runs + 1):  # the first, a tenth of the rows, warms Spark's workers
            n = rows if i else max(per_key, rows // 10)
            broker = start_broker(f"ingest-keys-{uuid.uuid4().hex[:6]}", f"{tmp}/b{i}.sqlite")
            define(broker)
            body = F.concat(F.lpad(F.col("id").cast("string"), 12, "0"), F.lit("x" * 88))
            key = (F.col("id") / per_key).cast("long")
            if text:
                key = F.concat(F.lit("order-"), key.cast("string"))
            ts = F.col("id").alias("ts")
            df = spark.range(n).select(key.alias("key"), ts, body.alias("body")).cache()
            df.count()
            started = time.perf_counter()
            report = ingest(df, broker, **SEND, **COLUMNS, progress=False)
            elapsed = time.perf_counter() - started
            while got := broker.receive("SinkQ", max_groups=1000, top=100_000):
                broker.commit(got)
            if i:
                print(f"{n:,} rows, {report.dialogs:,} dialogs: {n / elapsed:,.0f} rows/s "
                      f"({elapsed:.2f} s)", flush=True)  # fmt: skip
            df.unpersist()
            broker.stop(delete_store=True)
    os._exit(0)  # Spark's and Ray's threads need not be waited for


if __name__ == "__main__":
    main()
