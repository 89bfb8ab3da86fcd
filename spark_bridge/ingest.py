"""Ingest: a Spark DataFrame becomes messages, sent from Spark's executors straight to the brokers.

The rows never pass through the driver. The DataFrame is hash-partitioned by the conversation key
(unless it already is: `spark_bridge.arrange`) and sorted by key rank, key and order within each
partition; a Python worker on an executor receives each partition as Arrow record batches
(`mapInArrow`), joins the Ray cluster, and sends the rows in batched `apply` calls, several in
flight, to the brokers (`spark_bridge.plan` makes the calls). Measured on a 2-core machine,
streaming a cached 1M-row DataFrame to Python workers this way took 0.8 s, against 4.1 s for
`ray.data.from_spark` plus 0.3 s to iterate the result: this path starts sending at once and
overlaps Spark with the brokers, so it is the one used.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from actors.errors import IngestError, UnknownContract, UnknownMessageType, UnknownService
from actors.model.catalog import Contract, MessageType, may_send
from actors.model.limits import Limits
from actors.remote.client import DEFAULT_NAMESPACE as NAMESPACE

from .arrange import KEY_COLUMN, NULL_KEY, arrangement, null_keys, reads_only_cache
from .plan import (
    BODY_FORMATS,
    ORDERED_IDS,
    IngestSpec,
    Pace,
    PartitionPlanner,
    call_rows,
    check_ingest_id,
    ids_of,
)
from .progress import BOARD, Tally, Watcher, best_effort, board, print_progress

RESULT_SCHEMA = (
    "rows long, sent long, dialogs long, calls long, "
    "rejected_key string, rejected_position long, rejected_reason string"
)

# Calls a sender has under way at once, by default. 1,000,000 rows on 2 cores (2 senders, one
# broker), three ingests of each, alternating: 4 in flight 540,000-580,000 rows/s, 8 596,000-
# 620,000, 16 623,000-658,000; 8 keeps a sender's memory at 8 calls (at most 128 MiB of bodies).
IN_FLIGHT = 8


@dataclass
class IngestReport:
    """What one ingest did. `sent` counts messages sent by this run: a re-run of an ingest that
    completed sends 0. `rejected`: rows not sent, each with its key, position and reason.
    `shuffled`: whether Spark moved the rows to arrange them by key (not when the input was
    already partitioned by the key: `spark_bridge.arrange`)."""

    ingest_id: str
    rows: int
    sent: int
    dialogs: int
    calls: int
    elapsed_s: float
    key: str | None
    order: str | None
    rejected: list[dict[str, Any]] = field(default_factory=list)
    shuffled: bool = True

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "ingest_id": self.ingest_id,
            "rows": self.rows,
            "sent": self.sent,
            "dialogs": self.dialogs,
            "calls": self.calls,
            "elapsed_s": self.elapsed_s,
            "rows_per_s": self.rows_per_s,
            "key": self.key,
            "order": self.order,
            "rejected": self.rejected,
            "shuffled": self.shuffled,
        }


def ingest(
    df: Any,
    brokers: Any,
    *,
    from_service: str,
    to_service: str | None = None,
    message_type: str,
    body: str,
    contract: str = "DEFAULT",
    key: str | None = None,
    order: str | None = None,
    group: str | None = None,
    body_format: str = "json",
    ingest_id: str | None = None,
    batch_rows: int | None = None,
    in_flight: int = IN_FLIGHT,
    partitions: int | None = None,
    progress: bool | Callable[[dict[str, Any]], None] = True,
    encryption: bool = True,
    rows_per_s: float | None = None,
) -> IngestReport:
    """Send every row of `df` as one message from `from_service` to `to_service`.

    `brokers`: a broker handle or a list of them (each key's dialog goes through one, chosen by
    the key), or a `RouterSet`: its initiators send, to its routing service unless
    `to_service` names another. `body`: the column holding each body (binary, string, or a
    struct/list/map encoded as `body_format` "json" or "msgpack"). `key`: one dialog per
    distinct value (default: one per input partition); `order`: the column that orders a key's
    rows (default: the input's order); `group`: dialogs with the same value share a
    conversation group. `partitions`: how many partitions (each a sender task) the rows are
    arranged in (default: one per executor core; a keyless input's beyond that are merged
    whole). `ingest_id` names the ingest (a fresh one by
    default): run again with the same id, it sends nothing twice. `progress`: True prints rows
    and rows/s to stderr, a callable receives each view, False shows nothing.
    `encryption`: the dialogs' ENCRYPTION (`actors.Begin`): on, they leave the sending broker
    only secured (dialog security configured for `to_service`), else they wait; so with it on,
    an ingest to a service of another broker is refused before anything is sent when a sender
    has no remote service binding for that service.
    `rows_per_s`: send at most this many rows a second in all, shared evenly by the partitions
    (which all send at once when there are no more of them than executor cores), to feed a
    pipeline at a steady rate instead of as fast as the brokers take rows. `batch_rows`: rows a
    call at most; by default 4,000, or with `rows_per_s` a tenth of a partition's rate (ten
    calls a second each, so rows go out evenly: a call costs every broker on the path
    transactions and round trips however few rows it carries, so many more, smaller calls load
    the brokers more than their rows do). `in_flight`: calls each partition has under way at
    once (each holds at most 16 MiB of bodies).
    """
    started = time.monotonic()
    rerun = ingest_id is not None  # (an id of its own is fresh: no dialog can have it yet)
    ingest_id = check_ingest_id(uuid.uuid4().hex if ingest_id is None else ingest_id)
    senders = _senders(brokers)
    to_service = _target(brokers, to_service)
    if batch_rows is not None:
        _whole("batch_rows", batch_rows)
    _whole("in_flight", in_flight)
    if partitions is not None:
        _whole("partitions", partitions)
    if rows_per_s is not None and (
        not isinstance(rows_per_s, (int, float))
        or isinstance(rows_per_s, bool)
        or not 0 < rows_per_s < math.inf
    ):
        raise IngestError(f"rows_per_s must be a number above 0, not {rows_per_s!r}")
    if not isinstance(encryption, bool):
        raise IngestError(f"encryption must be True or False, not {encryption!r}")
    if body_format not in BODY_FORMATS:
        raise IngestError(f"body_format must be one of {BODY_FORMATS}, not {body_format!r}")
    mt, limits = _check_catalog(
        senders, from_service, to_service, contract, message_type, encryption
    )
    _check_columns(df, body=body, key=key, order=order, group=group)
    read = [body] if group is None else [body, group]  # what the senders read besides the key
    arranged = arrangement(df, key, order, partitions, columns=read)
    import ray

    if rows_per_s:  # shared by the partitions (Spark counts a keyless input's)
        share = rows_per_s / (arranged.partitions or arranged.frame.rdd.getNumPartitions())
    else:
        share = None
    batch_rows = call_rows(batch_rows, share)
    spec = IngestSpec(
        ingest_id=ingest_id,
        run=uuid.uuid4().hex[:16],
        from_service=from_service,
        to_service=to_service,
        contract=contract,
        message_type=mt,
        body=body,
        body_format=body_format,
        key=key or KEY_COLUMN,
        group=group,
        senders=len(senders),
        batch_rows=batch_rows,
        max_body_bytes=limits.max_body_bytes,
        call_bytes=min(IngestSpec.call_bytes, limits.max_call_bytes // 2),
        encryption=encryption,
        ids=_dialog_ids(senders, ingest_id) if rerun else ORDERED_IDS,
    )

    meter = board(NAMESPACE)
    best_effort(lambda: meter.start.remote(spec.run, None))  # no pass to count the rows first
    send = _partition_sender(
        spec,
        [(b.name, b.namespace) for b in senders],
        ray.get_runtime_context().gcs_address,
        in_flight,
        share,
    )
    sending = arranged.frame.mapInArrow(send, RESULT_SCHEMA)
    if key is not None and not arranged.shuffled and not reads_only_cache(sending):
        # the input's cache went since it was arranged (the plan checked is the plan run)
        arranged = arrangement(df, key, order, partitions, shuffle=True, columns=read)
        sending = arranged.frame.mapInArrow(send, RESULT_SCHEMA)
    show = print_progress if progress is True else progress or None
    try:
        if show:
            with Watcher(meter, spec.run, show, every_s=1.0):
                out = _collect(sending, df, key)
            final = best_effort(lambda: ray.get(meter.view.remote(spec.run), timeout=5.0))
            if final is not None:
                show(final)
        else:
            out = _collect(sending, df, key)
    finally:
        best_effort(lambda: meter.end.remote(spec.run))
    rows = sum(r.rows for r in out)
    if rows == 0:  # nothing was sent: every queue and dialog is as it was
        raise IngestError(NO_ROWS)
    return IngestReport(
        ingest_id=ingest_id,
        rows=rows,
        sent=sum(r.sent for r in out),
        dialogs=sum(r.dialogs for r in out),
        calls=sum(r.calls for r in out),
        elapsed_s=time.monotonic() - started,
        key=key,
        order=order,
        rejected=[
            {"key": r.rejected_key, "position": r.rejected_position, "reason": r.rejected_reason}
            for r in out
            if r.rejected_reason is not None
        ],
        shuffled=arranged.shuffled,
    )


NO_ROWS = "the DataFrame has no rows: nothing to ingest"


def _collect(frame: Any, df: Any, key: str | None) -> list[Any]:
    """The senders' results, or the null keys' count when the arrangement found one."""
    try:
        return frame.collect()
    except Exception as exc:
        if key is None or NULL_KEY not in str(exc):
            raise
        nulls = df.where(df[key].isNull()).count()  # only now: the message says how many
    raise IngestError(null_keys(nulls, key))


def _partition_sender(
    spec: IngestSpec,
    brokers: Sequence[tuple[str, str]],
    address: str,
    in_flight: int,
    rows_per_s: float | None,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function Spark runs on each partition, in a Python worker on an executor."""

    def send_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import ray

        from actors.remote.client import connect

        if not ray.is_initialized():  # a Python worker joins the cluster once, then is reused
            ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
        handles = [connect(name, namespace) for name, namespace in brokers]
        meter = ray.get_actor(BOARD, namespace=NAMESPACE)
        planner = PartitionPlanner(spec)
        pace = Pace(rows_per_s, time.monotonic()) if rows_per_s else None
        sent, calls = asyncio.run(_send(planner, batches, handles, meter, in_flight, pace))
        yield pa.RecordBatch.from_pylist(
            [
                {"rows": planner.rows, "sent": sent, "dialogs": planner.dialogs, "calls": calls}
                | {"rejected_key": None, "rejected_position": None, "rejected_reason": None}
            ]
            + [
                {"rows": 0, "sent": 0, "dialogs": 0, "calls": 0}
                | {
                    "rejected_key": r.key,
                    "rejected_position": r.position,
                    "rejected_reason": r.reason,
                }
                for r in planner.rejected
            ],
            schema=_RESULT_ARROW,
        )

    return send_partition


async def _send(
    planner: PartitionPlanner,
    batches: Iterator[pa.RecordBatch],
    handles: Sequence[Any],
    meter: Any,
    in_flight: int,
    pace: Pace | None = None,
) -> tuple[int, int]:
    """Send a partition's calls, up to `in_flight` at once (and no faster than `pace`); calls
    from one handle apply in the order issued (actors.calls.ordering), so a key's rows keep
    their order."""
    pending: deque[asyncio.Task[Any]] = deque()
    sent = calls = issued = 0
    pid = os.getpid()
    tally = Tally(
        lambda rows, messages: best_effort(
            lambda: meter.add.remote(planner.spec.run, pid, rows, messages)
        )
    )

    async def settle(task: asyncio.Task[Any]) -> None:
        nonlocal sent
        result, rows = await task
        sent += result["sent"]
        tally.add(rows, result["sent"], time.monotonic())

    async def one(handle: Any, ops: list[Any], request_id: str, rows: int) -> tuple[Any, int]:
        return await handle.aio.apply(ops, request_id=request_id), rows

    for batch in batches:
        for call in planner.calls(batch):
            if pace is not None and (wait := pace.wait_s(issued, time.monotonic())) > 0:
                await asyncio.sleep(wait)  # the rate asked for, not a condition
            issued += call.rows
            pending.append(
                asyncio.ensure_future(
                    one(handles[call.sender], call.ops, call.request_id, call.rows)
                )
            )
            await asyncio.sleep(0)  # let it issue now, in order
            calls += 1
            if len(pending) >= in_flight:
                await settle(pending.popleft())
    while pending:
        await settle(pending.popleft())
    tally.flush(time.monotonic())
    return sent, calls


_RESULT_ARROW = pa.schema(
    [
        ("rows", pa.int64()),
        ("sent", pa.int64()),
        ("dialogs", pa.int64()),
        ("calls", pa.int64()),
        ("rejected_key", pa.string()),
        ("rejected_position", pa.int64()),
        ("rejected_reason", pa.string()),
    ]
)


# --- checks before anything is sent --------------------------------------------------------------


def _whole(what: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise IngestError(f"{what} must be a whole number of at least 1, not {value!r}")


def _senders(brokers: Any) -> list[Any]:
    from actors.remote.client import Broker
    from actors.remote.routers import RouterSet

    if isinstance(brokers, RouterSet):
        return list(brokers.initiators)
    out = [brokers] if isinstance(brokers, Broker) else list(brokers or [])
    if not out or not all(isinstance(b, Broker) for b in out):
        raise IngestError(
            "brokers must be a broker handle (start_broker / connect), a non-empty list of them, "
            "or a RouterSet"
        )
    return out


def _dialog_ids(senders: Sequence[Any], ingest_id: str) -> int:
    """How an ingest run again names its dialogs: as its runs before did (`plan.dialog_id`), so
    that it finds them and sends nothing twice; a run by an earlier release may have left ids
    of another kind. Its dialogs are all begun `if_absent`, so each sender remembers every one,
    live or ended (`rerunnable`), in the order of their ids: the first of them tells (a few
    dialogs of other names a caller may have begun among them are passed over)."""
    prefix = f"{ingest_id}/"
    for b in senders:
        for row in b.rerunnable(after=prefix, limit=PROBED):
            handle = row["conversation_handle"]
            if not handle.startswith(prefix):
                break
            if (kind := ids_of(handle, ingest_id)) is not None:
                return kind
    return ORDERED_IDS


PROBED = 100  # dialogs a re-run reads from each sender to tell how its dialogs are named


def _target(brokers: Any, to_service: str | None) -> str:
    from actors.remote.routers import RouterSet

    if to_service is not None:
        return to_service
    if isinstance(brokers, RouterSet):
        return brokers.config.service
    raise IngestError("to_service is required (the service the rows are sent to)")


def _check_catalog(
    senders: Sequence[Any],
    from_service: str,
    to_service: str,
    contract: str,
    message_type: str,
    encryption: bool,
) -> tuple[MessageType, Limits]:
    """The message type to validate bodies with and the tightest limits of the senders; refuses,
    naming what is missing, when a sender could not begin or send on the dialog, or when its
    dialogs, begun with encryption on to a service of another broker, would wait for a remote
    service binding the sender does not have (seed 003)."""
    mt: MessageType | None = None
    tightest: dict[str, int] = {}
    for b in senders:
        defs: dict[tuple[str, str], dict[str, Any]] = {
            (kind, rec["name"]): rec for kind, rec in b.definitions()
        }
        svc = defs.get(("service", from_service))
        if svc is None:
            raise UnknownService(
                from_service, f"broker {b.name!r} has no such service to send from"
            )
        rec = defs.get(("message_type", message_type))
        if rec is None:
            raise UnknownMessageType(message_type, f"broker {b.name!r} does not define it")
        con = defs.get(("contract", contract))
        if con is None:
            raise UnknownContract(contract, f"broker {b.name!r} does not define it")
        if not may_send(Contract(con["name"], con["messages"]), message_type, True):
            raise IngestError(
                f"contract {contract!r} does not let the initiator send {message_type!r}"
            )
        bound = any(k == "remote_service_binding" and r["service"] == to_service
                    for (k, _), r in defs.items())  # fmt: skip
        if encryption and ("service", to_service) not in defs and not bound:
            raise IngestError(
                f"broker {b.name!r} has no remote service binding for service {to_service!r}, "
                "so dialogs begun with encryption on would wait in its transmission queue for "
                "one; create a RemoteServiceBinding there (dialog security), or ingest with "
                "encryption=False"
            )
        mt = MessageType(rec["name"], rec["validation"], rec.get("schema"))
        own = Limits.of(b.info().get("limits"))
        for name in ("max_body_bytes", "max_call_bytes"):
            tightest[name] = min(tightest.get(name, getattr(own, name)), getattr(own, name))
    assert mt is not None  # a missing route is the brokers' to report: routes may come later
    return mt, Limits.of(tightest)


_BODY_TYPES = ("binary", "string", "struct", "array", "map")
_KEY_TYPES = ("string", "tinyint", "smallint", "int", "bigint")


def _check_columns(
    df: Any, *, body: str, key: str | None, order: str | None, group: str | None
) -> None:
    from pyspark.sql import DataFrame

    if not isinstance(df, DataFrame):
        raise IngestError(f"expected a Spark DataFrame, not {type(df).__name__}")
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}

    def column(role: str, name: str | None, allowed: Sequence[str] | None) -> None:
        if name is None:
            return
        if not isinstance(name, str) or name not in types:
            raise IngestError(
                f"the {role} column {name!r} is not in the DataFrame; its columns are "
                f"{sorted(types)}"
            )
        kind = types[name].split("<")[0]
        if allowed is not None and kind not in allowed:
            raise IngestError(
                f"the {role} column {name!r} is {types[name]}; it must be one of "
                f"{', '.join(allowed)}"
            )

    column("body", body, _BODY_TYPES)
    column("key", key, _KEY_TYPES)
    column("group", group, _KEY_TYPES)
    column("order", order, None)
    if order is not None and key is None:
        raise IngestError("an order column orders the rows of each key: name a key column too")
    if order is not None and types[order].split("<")[0] in ("struct", "array", "map", "binary"):
        raise IngestError(f"the order column {order!r} is {types[order]}; it cannot be sorted")
