"""`raybroker ingest` and `raybroker audit`: the Spark bridge from the command line, against
brokers running on a Ray cluster (`--address`, or $RAY_ADDRESS)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_parsers(sub: Any) -> None:
    ing = sub.add_parser("ingest", help="send a Parquet file's rows as messages, from Spark")
    ing.add_argument("path", help="the Parquet file (or directory) to ingest")
    _brokers(ing)
    ing.add_argument("--from-service", required=True, help="the service that sends")
    ing.add_argument("--to-service", required=True, help="the service the rows go to")
    ing.add_argument("--message-type", required=True, help="the rows' message type")
    ing.add_argument("--body", required=True, help="the column holding each body")
    ing.add_argument("--contract", default="DEFAULT")
    ing.add_argument("--key", help="one dialog per value of this column")
    ing.add_argument("--order", help="orders each key's rows")
    ing.add_argument("--group", help="dialogs with the same value share a conversation group")
    ing.add_argument("--body-format", default="json", help="struct bodies as json or msgpack")
    ing.add_argument("--ingest-id", help="names the ingest; run again with it to finish a run")
    ing.add_argument(
        "--batch-rows",
        type=int,
        help="rows per apply call (default 4,000; paced: 10 calls a second)",
    )
    ing.add_argument("--rows-per-s", type=float, help="send at most this many rows a second")
    ing.add_argument("--report", metavar="PATH", help="write the report as JSON (for audit)")
    ing.add_argument(
        "--encryption",
        choices=("on", "off"),
        default="on",
        help="the dialogs' ENCRYPTION: on (the default), they leave the broker only secured",
    )
    ing.set_defaults(fn=_ingest)

    aud = sub.add_parser("audit", help="write brokers' delivery audits as Parquet, reconcile")
    _brokers(aud)
    aud.add_argument("--out", required=True, metavar="PATH", help="the audit, as Parquet")
    aud.add_argument("--checkpoint", metavar="PATH", help="read only what is new since then")
    aud.add_argument("--reconcile", metavar="PATH", help="the ingested Parquet to check")
    aud.add_argument("--ingest-report", metavar="PATH", help="the JSON `ingest --report` wrote")
    aud.add_argument("--per-key", metavar="PATH", help="write the per-key reconciliation")
    aud.set_defaults(fn=_audit)


def _brokers(p: argparse.ArgumentParser) -> None:
    p.add_argument("--broker", action="append", required=True, help="a broker (repeatable)")
    p.add_argument("--namespace", default="raybroker", help="the brokers' Ray namespace")
    p.add_argument("--address", help="the Ray cluster (default: $RAY_ADDRESS)")


def _connect(args: argparse.Namespace) -> list[Any]:
    from actors.remote.client import connect
    from actors.remote.runtime import ensure_ray

    ensure_ray(args.address)
    return [connect(name, args.namespace, retry_s=5.0) for name in args.broker]


def _ingest(args: argparse.Namespace) -> int:
    from . import ingest, spark_session

    brokers = _connect(args)
    with spark_session() as spark:
        df = spark.read.parquet(args.path)
        report = ingest(
            df,
            brokers,
            from_service=args.from_service,
            to_service=args.to_service,
            contract=args.contract,
            message_type=args.message_type,
            body=args.body,
            key=args.key,
            order=args.order,
            group=args.group,
            body_format=args.body_format,
            ingest_id=args.ingest_id,
            batch_rows=args.batch_rows,
            rows_per_s=args.rows_per_s,
            encryption=args.encryption == "on",
        )
    print(
        f"ingest {report.ingest_id}: {report.rows:,} rows, {report.sent:,} sent, "
        f"{report.dialogs:,} dialogs, {len(report.rejected):,} rejected, "
        f"{report.elapsed_s:.1f}s ({report.rows_per_s:,.0f} rows/s)"
    )
    for r in report.rejected[:20]:
        print(f"  rejected: key {r['key']!r} position {r['position']}: {r['reason']}")
    if args.report:
        with open(args.report, "w") as f:
            json.dump(report.as_dict(), f, indent=1)
        print(f"wrote {args.report}")
    return 0


def _audit(args: argparse.Namespace) -> int:
    from . import AuditCursor, reconcile, spark_session

    if args.reconcile and not args.ingest_report:
        print("raybroker audit: --reconcile needs --ingest-report", file=sys.stderr)
        return 2
    brokers = _connect(args)
    with spark_session() as spark:
        cursor = AuditCursor(brokers, args.checkpoint)
        read = cursor.read(spark, commit=False)
        read.df.write.mode("overwrite").parquet(args.out)
        cursor.commit()  # only once the records are safely written
        print(f"wrote {read.records:,} delivery records to {args.out}")
        if not read.complete:
            print(f"the audit rolled over before this read: commits missed {read.missed}")
        ok = True
        if args.reconcile:
            with open(args.ingest_report) as f:
                rep = json.load(f)
            result = reconcile(
                read,
                spark.read.parquet(args.reconcile),
                ingest_id=rep["ingest_id"],
                key=rep.get("key"),
                order=rep.get("order"),
                rejected=rep.get("rejected", []),
            )
            print(result.summary())
            if args.per_key:
                result.per_key.write.mode("overwrite").parquet(args.per_key)
                print(f"wrote {args.per_key}")
            ok = result.ok
    return 0 if ok else 1
