"""The bridge between raybroker and Spark, through RayDP: DataFrames in as messages, delivery
audits out as DataFrames, and the join that proves nothing was lost, doubled or reordered.

    with spark_session() as spark:
        report = ingest(df, broker, from_service=..., to_service=..., message_type=...,
                        body="payload", key="customer", order="ts")
        audit = AuditCursor(broker).read(spark)
        print(reconcile(audit, df, ingest_id=report.ingest_id, key="customer",
                        order="ts", rejected=report.rejected).summary())
"""

from .audit import AuditCursor, AuditRead, audit_frame
from .ingest import IngestReport, ingest
from .reconcile import Reconciliation, reconcile
from .session import spark_session

__all__ = [
    "AuditCursor",
    "AuditRead",
    "IngestReport",
    "Reconciliation",
    "audit_frame",
    "ingest",
    "reconcile",
    "spark_session",
]
