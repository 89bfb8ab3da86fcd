"""The Spark part of `raybroker verify`: a DataFrame of rows whose bodies carry ids the checker
knows, ingested from Spark's executors into the shop while the faults go on. Spark and RayDP
load only when this runs."""

from __future__ import annotations

import threading
import time
from typing import Any

from actors.tools.verify.checker import Sent
from actors.tools.verify.history import History, make_id
from actors.tools.verify.topology import CONTRACT, REQUEST, SHOP_SERVICE, SPARK_SERVICE

ATTEMPTS = 3  # an ingest that fails is run again with the same id: nothing goes twice


def spark_rows(messages: int) -> int:
    """A few thousand rows at most; a twentieth of a small run."""
    return min(5000, max(100, messages // 20))


def keys_for(rows: int) -> int:
    return max(1, min(100, rows // 20))


def expected(rows: int, keys: int) -> list[Sent]:
    """Row i goes on stream "spark/<i % keys>" at position i // keys."""
    return [
        Sent(make_id(f"spark/{i % keys}", i // keys), f"spark/{i % keys}", i // keys)
        for i in range(rows)
    ]


class SparkIngest(threading.Thread):
    """Ingests `rows` rows into the shop (from Shop to Direct) once `go` is set; records the rows
    as sent when the ingest (or a rerun of it with the same id) has sent them all."""

    def __init__(self, spark: Any, shop: Any, rows: int, seed: int, history: History) -> None:
        super().__init__(daemon=True, name="verify-spark")
        self.spark, self.shop, self.rows, self.seed = spark, shop, rows, seed
        self.keys = keys_for(rows)
        self.history = history
        self.go = threading.Event()
        self.result: dict[str, Any] = {"rows": rows, "keys": self.keys, "sent": False}

    def _view(self, view: dict[str, Any]) -> None:
        self.result["progress"] = {"rows": view["rows"], "total": view["total"]}

    def line(self) -> str:
        """Progress, for the run's progress lines."""
        view = self.result.get("progress")
        if self.result["sent"]:
            return "spark done"
        if view is None:
            return "spark waiting" if not self.go.is_set() else "spark starting"
        return f"spark {view['rows']:,}/{view['total']:,}"

    def frame(self) -> Any:
        from pyspark.sql import functions as F

        key = (F.col("id") % self.keys).cast("long")
        position = (F.col("id") / self.keys).cast("long")
        ident = F.concat(F.lit("spark/"), key.cast("string"), F.lit(":"), position.cast("string"))
        return self.spark.range(self.rows).select(
            key.alias("key"), position.alias("pos"), F.struct(ident.alias("id")).alias("body")
        )

    def run(self) -> None:
        from spark_bridge import ingest

        self.go.wait()
        df = self.frame()
        started = time.monotonic()
        for attempt in range(1, ATTEMPTS + 1):
            try:
                report = ingest(
                    df,
                    self.shop,
                    from_service=SHOP_SERVICE,
                    to_service=SPARK_SERVICE,
                    contract=CONTRACT,
                    message_type=REQUEST,
                    body="body",
                    key="key",
                    order="pos",
                    ingest_id=f"verify-{self.seed}",
                    progress=self._view,
                    encryption=False,  # the secured path is the workload's own
                )
            except Exception as exc:  # Spark or the broker: try again, with the same ingest id
                when = f"after {time.monotonic() - started:.1f}s"
                self.result[f"attempt_{attempt}_error"] = f"{when}: {type(exc).__name__}: {exc}"[
                    :500
                ]
                continue
            self.result.update(
                attempts=attempt,
                elapsed_s=round(time.monotonic() - started, 2),
                rejected=report.rejected[:20],
            )
            if report.rows == self.rows and not report.rejected:
                self.history.record_sent(expected(self.rows, self.keys), workload=False)
                self.result["sent"] = True
                self.result.pop("progress", None)  # a rerun's view counts only what it sent
            return
