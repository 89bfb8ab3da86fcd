"""Reconciliation: the ingested DataFrame joined to the delivery audit, proving every row arrived
once and in order, or naming the keys where one did not.

Each input row is numbered as the ingest numbered it: its key's dialog (`plan.dialog_id`,
computed here in Spark SQL) and its sequence number on that dialog (its position among the key's
rows, rejected rows left out). The audit holds one record per message committed by a receiver.
A row with no record is missing, one with several is doubled, and one committed after a later row
of its key is out of order. When the audit rolled over before it was read, rows without a record
cannot be told from lost ones: they are reported as unaccounted, not missing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from actors.model.catalog import SYSTEM_TYPES

from .arrange import KEY_COLUMN, ORDER_COLUMN
from .plan import (
    DIGEST_IDS,
    KEY_DIGEST,
    ORDERED_IDS,
    RANK_MARK,
    RANKED_IDS,
    TEXT_MARK,
    TEXT_PREFIX,
    WHOLE_MARK,
    check_ingest_id,
    dialog_id,
    digest_span,
    rank_span,
)

MAX_KEYS_SHOWN = 100


@dataclass
class Reconciliation:
    """Counts of rows expected, delivered once, missing, doubled (extra copies) and out of order,
    the keys each affects (at most MAX_KEYS_SHOWN), and per key (`per_key`, a DataFrame)."""

    expected: int
    delivered: int
    missing: int
    doubled: int
    out_of_order: int
    unexpected: int  # audit records of the ingest's dialogs that match no input row
    unaccounted: int  # rows without a record while the audit is incomplete
    audit_complete: bool
    missing_keys: list[str] = field(default_factory=list)
    doubled_keys: list[str] = field(default_factory=list)
    out_of_order_keys: list[str] = field(default_factory=list)
    per_key: Any = None

    @property
    def ok(self) -> bool:
        return self.audit_complete and not (
            self.missing or self.doubled or self.out_of_order or self.unexpected
        )

    def summary(self) -> str:
        lines = [
            f"expected {self.expected:,} rows: {self.delivered:,} delivered once, "
            f"{self.missing:,} missing, {self.doubled:,} doubled, "
            f"{self.out_of_order:,} out of order, {self.unexpected:,} unexpected"
        ]
        for what, keys in (
            ("missing", self.missing_keys),
            ("doubled", self.doubled_keys),
            ("out of order", self.out_of_order_keys),
        ):
            if keys:
                lines.append(f"keys with rows {what}: {', '.join(keys)}")
        if not self.audit_complete:
            lines.append(
                f"the audit rolled over before it was read: {self.unaccounted:,} rows have no "
                "record and cannot be told from lost ones (raise the brokers' audit_rows limit, "
                "or read the audit more often)"
            )
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "per_key"} | {"ok": self.ok}


def expected_rows(
    df: Any,
    ingest_id: str,
    key: str | None,
    order: str | None,
    rejected: Iterable[Mapping[str, Any]] = (),
    ids: int = ORDERED_IDS,
) -> Any:
    """The input as the ingest numbered it: (key, conversation_id, sequence_number) per row sent;
    `ids`: how the ingest made its dialog ids (`plan.dialog_id`)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if key is None:
        df = df.withColumn(KEY_COLUMN, F.spark_partition_id())
        key, order = KEY_COLUMN, ORDER_COLUMN
        df = df.withColumn(order, F.monotonically_increasing_id())
    elif order is None:
        order = ORDER_COLUMN
        df = df.withColumn(order, F.monotonically_increasing_id())
    rows = df.select(F.col(key).cast("string").alias("key"), F.col(order).alias("_order"))
    rows = rows.withColumn(
        "position", F.row_number().over(Window.partitionBy("key").orderBy("_order")) - 1
    )
    spark = df.sparkSession
    out = [(str(r["key"]), int(r["position"])) for r in rejected]
    if out:
        gone = spark.createDataFrame(out, "key string, position long")
        rows = rows.join(gone, ["key", "position"], "left_anti")
    text = F.col("key")
    digest = F.substring(F.sha2(text, 256), 1, KEY_DIGEST)
    if ids == DIGEST_IDS:
        conversation_id = F.concat(F.lit(f"{ingest_id}/"), digest)
    elif ids == RANKED_IDS:
        rank = F.lpad(F.lower(F.hex(F.crc32(text.cast("binary")))), 8, "0")
        conversation_id = F.concat(F.lit(f"{ingest_id}/{RANK_MARK}"), rank, digest)
    else:  # as `plan.dialog_id`: a whole number as Spark writes one, or other text
        number = F.expr("try_cast(`key` AS BIGINT)")
        whole = number.isNotNull() & (number.cast("string") == text)
        biased = F.lpad(F.lower(F.hex(number.bitwiseXOR(F.lit(-(1 << 63))))), 16, "0")
        head = F.substring(text.cast("binary"), 1, TEXT_PREFIX)
        head = F.rpad(F.lower(F.hex(head)), 2 * TEXT_PREFIX, "0")
        conversation_id = F.when(whole, F.concat(F.lit(f"{ingest_id}/{WHOLE_MARK}"), biased))
        conversation_id = conversation_id.otherwise(
            F.concat(F.lit(f"{ingest_id}/{TEXT_MARK}"), head, digest)
        )
    return rows.select(
        "key",
        conversation_id.alias("conversation_id"),
        (F.row_number().over(Window.partitionBy("key").orderBy("position")) - 1).alias(
            "sequence_number"
        ),
    )


def _ids_in(audit: Any, ingest_id: str) -> int:
    """How the ingest's dialog ids were made (`plan.dialog_id`), as its records in the audit
    show: of an earlier release's kind when any id is of it, else ORDERED_IDS."""
    from pyspark.sql import functions as F

    cid = F.col("conversation_id")
    for kind, (first, end) in ((DIGEST_IDS, digest_span(ingest_id)),
                               (RANKED_IDS, rank_span(ingest_id))):  # fmt: skip
        length = len(dialog_id(ingest_id, "", kind))  # every id of either kind has it
        found = (cid >= first) & (cid < end) & (F.length(cid) == length)
        if audit.filter(found).limit(1).count():
            return kind
    return ORDERED_IDS


def reconcile(
    audit: Any,
    df: Any,
    *,
    ingest_id: str,
    key: str | None = None,
    order: str | None = None,
    rejected: Iterable[Mapping[str, Any]] = (),
    audit_complete: bool = True,
    replies: bool = False,
) -> Reconciliation:
    """Join the audit (a DataFrame of delivery records, or an `AuditRead`) to the ingested
    DataFrame `df`. `ingest_id`, `key` and `order` are the ingest's (its report has them);
    `rejected`: the report's rejected rows, which were never sent. `replies=True` checks the
    other direction: one reply per row, back on the row's dialog, in the rows' order (the
    initiators' audits hold those)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    check_ingest_id(ingest_id)
    if hasattr(audit, "df"):  # an AuditRead
        audit_complete = audit_complete and audit.complete
        audit = audit.df
    expected = expected_rows(df, ingest_id, key, order, rejected, _ids_in(audit, ingest_id))
    expected = expected.cache()
    side = ~F.col("from_initiator") if replies else F.col("from_initiator")
    ours = audit.filter(
        side
        & F.col("conversation_id").startswith(f"{ingest_id}/")
        & ~F.col("message_type").isin(*SYSTEM_TYPES)  # an EndDialog after the rows is no row
    ).select("conversation_id", "sequence_number", "audit_id", "to_broker")
    copies = ours.groupBy("conversation_id", "sequence_number").agg(F.count("*").alias("copies"))
    joined = expected.join(copies, ["conversation_id", "sequence_number"], "left").fillna(
        0, ["copies"]
    )
    # out of order: committed after a message with a higher sequence number of the same dialog
    seen = Window.partitionBy("conversation_id").orderBy("audit_id", "sequence_number")
    late = (
        ours.withColumn(
            "before",
            F.max("sequence_number").over(seen.rowsBetween(Window.unboundedPreceding, -1)),
        )
        .filter(F.col("before") > F.col("sequence_number"))
        .select("conversation_id", "sequence_number")
        .distinct()
        .withColumn("late", F.lit(1))
    )
    joined = joined.join(late, ["conversation_id", "sequence_number"], "left").fillna(0, ["late"])
    per_key = (
        joined.groupBy("key")
        .agg(
            F.count("*").alias("expected"),
            F.sum((F.col("copies") == 1).cast("long")).alias("delivered"),
            F.sum((F.col("copies") == 0).cast("long")).alias("missing"),
            F.sum(F.greatest(F.col("copies") - 1, F.lit(0))).alias("doubled"),
            F.sum("late").alias("out_of_order"),
        )
        .cache()
    )
    totals = per_key.agg(
        *(F.coalesce(F.sum(c), F.lit(0)).alias(c) for c in per_key.columns[1:])
    ).collect()[0]
    unexpected = (
        copies.join(expected, ["conversation_id", "sequence_number"], "left_anti")
        .agg(F.coalesce(F.sum("copies"), F.lit(0)))
        .collect()[0][0]
    )

    def keys(column: str) -> list[str]:
        if not totals[column]:  # none to name: no Spark job (a clean run needs none)
            return []
        rows = per_key.filter(F.col(column) > 0).orderBy("key").limit(MAX_KEYS_SHOWN).collect()
        return [r["key"] for r in rows]

    missing = int(totals["missing"])
    return Reconciliation(
        expected=int(totals["expected"]),
        delivered=int(totals["delivered"]),
        missing=missing if audit_complete else 0,
        doubled=int(totals["doubled"]),
        out_of_order=int(totals["out_of_order"]),
        unexpected=int(unexpected),
        unaccounted=0 if audit_complete else missing,
        audit_complete=audit_complete,
        missing_keys=keys("missing") if audit_complete else [],
        doubled_keys=keys("doubled"),
        out_of_order_keys=keys("out_of_order"),
        per_key=per_key,
    )
