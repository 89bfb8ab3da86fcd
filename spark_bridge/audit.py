"""Delivery audits as Spark DataFrames: each broker's audit cursor is read by a Ray task into an
Arrow table, and the tables become one DataFrame through Ray Data (`from_arrow_refs` then
`to_spark`), so the records never pass through the driver. A cursor remembers, per broker, where
the last read stopped (in a checkpoint file if given), so each read returns only what is new."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from actors.errors import InvalidArgument
from actors.store import audit as audit_format

SCHEMA = pa.schema(
    [
        ("message_id", pa.string()),
        ("conversation_id", pa.string()),
        ("from_initiator", pa.bool_()),
        ("sequence_number", pa.int64()),
        ("message_type", pa.string()),
        ("from_service", pa.string()),
        ("to_service", pa.string()),
        ("from_broker", pa.string()),
        ("to_broker", pa.string()),
        ("queue", pa.string()),
        ("sent_at", pa.float64()),
        ("arrived_at", pa.float64()),
        ("received_at", pa.float64()),
        ("committed_at", pa.float64()),
        ("status", pa.string()),
        ("hops", pa.int64()),
        ("audit_id", pa.int64()),
        ("broker", pa.string()),  # the broker (by name) whose audit the record came from
    ]
)
assert SCHEMA.names[:-1] == list(audit_format.FIELDS)


READ_TASKS = 2  # tasks reading audits at once: each is a process; brokers share them


def read_brokers(
    brokers: list[tuple[str, str, int]], page: int = 1000
) -> tuple[pa.Table, list[int], list[int]]:
    """The audits of (name, namespace, after id) brokers, one after another, as one Arrow
    table; per broker the id to continue from and the commits its bound dropped unread."""
    parts = [read_broker(name, ns, after, page) for name, ns, after in brokers]
    return (
        pa.concat_tables([t for t, _, _ in parts]),
        [n for _, n, _ in parts],
        [m for _, _, m in parts],
    )


def read_broker(
    name: str, namespace: str, after_id: int, page: int = 1000
) -> tuple[pa.Table, int, int]:
    """One broker's audit after `after_id`, as an Arrow table; the id to continue from, and the
    commits its bound dropped before they could be read."""
    from actors.remote.client import connect

    broker = connect(name, namespace)
    records: list[dict[str, Any]] = []
    missed = None
    while True:
        got = broker.audit(after_id=after_id, limit=page)
        if missed is None:
            missed = got.get("missed", 0)
        records += got["records"]
        if got["next"] == after_id:
            break
        after_id = got["next"]
    cols = audit_format.columns(records)
    cols["broker"] = [name] * len(records)
    return pa.Table.from_pydict(cols, schema=SCHEMA), after_id, missed or 0


@dataclass
class AuditRead:
    """One read: the records as a (cached) DataFrame, and per broker the commits dropped by the
    audit's bound before this read could see them (any: the audit is not complete)."""

    df: Any
    records: int
    missed: dict[str, int] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return not any(self.missed.values())


class AuditCursor:
    """Reads brokers' delivery audits incrementally: each `read` returns the records committed
    since the last one. With `checkpoint` (a JSON file), where each broker's read stopped survives
    the process; it is written when a read is committed (`read(commit=True)`, the default)."""

    def __init__(self, brokers: Any, checkpoint: str | os.PathLike[str] | None = None) -> None:
        from actors.remote.client import Broker

        self.brokers: list[Broker] = [brokers] if isinstance(brokers, Broker) else list(brokers)
        if not self.brokers or not all(isinstance(b, Broker) for b in self.brokers):
            raise InvalidArgument("an audit cursor needs a broker handle or a list of them")
        self.checkpoint = None if checkpoint is None else os.fspath(checkpoint)
        self.positions: dict[str, int] = self._load()
        self._staged: dict[str, int] = {}

    def _load(self) -> dict[str, int]:
        if self.checkpoint is None or not os.path.exists(self.checkpoint):
            return {}
        try:
            with open(self.checkpoint) as f:
                data = json.load(f)
            return {str(k): int(v) for k, v in data["positions"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InvalidArgument(
                f"audit checkpoint {self.checkpoint!r} is not a checkpoint this cursor wrote "
                f"({type(exc).__name__}: {exc}); remove it to read from the start"
            ) from None

    def read(self, spark: Any, *, commit: bool = True) -> AuditRead:
        """The records committed since the last committed read, from every broker, as one
        DataFrame (cached: it stays valid after the Ray objects it came from are gone)."""
        import ray

        task = ray.remote(num_cpus=0, num_returns=3)(read_brokers)
        todo = [(b.name, b.namespace, self.positions.get(b.name, 0)) for b in self.brokers]
        shares = [todo[i::READ_TASKS] for i in range(min(READ_TASKS, len(todo)))]
        parts = [task.remote(share) for share in shares]
        tables = [p[0] for p in parts]
        # back in the brokers' order: share i holds brokers i, i + READ_TASKS, ...
        got = [(ray.get(p[1]), ray.get(p[2])) for p in parts]
        nexts, missed = [0] * len(todo), [0] * len(todo)
        for i, (ns, ms) in enumerate(got):
            for j, (n, m) in enumerate(zip(ns, ms, strict=True)):
                nexts[i + j * READ_TASKS], missed[i + j * READ_TASKS] = n, m
        quiet = logging.getLogger("ray.data")  # its per-dataset banners are not for users
        level = quiet.level
        quiet.setLevel(logging.WARNING)
        try:
            df = ray.data.from_arrow_refs(tables).to_spark(spark).cache()
        finally:
            quiet.setLevel(level)
        records = df.count()
        self._staged = {b.name: n for b, n in zip(self.brokers, nexts, strict=True)}
        if commit:
            self.commit()
        return AuditRead(
            df, records, {b.name: m for b, m in zip(self.brokers, missed, strict=True)}
        )

    def commit(self) -> None:
        """Move the cursor past the last read (and write the checkpoint, atomically)."""
        self.positions.update(self._staged)
        self._staged = {}
        if self.checkpoint is not None:
            tmp = f"{self.checkpoint}.tmp"
            with open(tmp, "w") as f:
                json.dump({"positions": self.positions}, f)
            os.replace(tmp, self.checkpoint)


def audit_frame(spark: Any, brokers: Any | Sequence[Any]) -> AuditRead:
    """Every record the brokers' audits hold, as a DataFrame (a cursor read from the start)."""
    return AuditCursor(brokers).read(spark)
