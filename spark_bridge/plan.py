"""How the rows of one Spark partition become batched, idempotent `apply` calls. Plain Python over
pyarrow record batches: no Spark, no Ray, so every rule here is unit-tested on its own.

A row's identity is the ingest id, its key and its position among the key's rows. Each key is one
dialog whose handle and conversation id are derived from the ingest id and the key (`dialog_id`),
begun with `if_absent`; the row sent k-th on it is sent `at` sequence number k. So however the
rows are cut into batches, a retried call, a retried task or a re-run of the whole ingest sends
no row twice: the broker skips the sequence numbers the dialog has already used. Request ids,
derived from the ingest id, the run and the batch's contents, let a retried call or a retried
Spark task of the same run get its first answer back without work; a new run gets new ones, so
its report counts only what it really sent (the sequence numbers keep it from sending anything
twice).
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from actors.calls.envelope import MAX_HANDLE, Begin, Op, Send
from actors.errors import InvalidArgument
from actors.model.bodies import BodyValidator
from actors.model.catalog import MessageType

BODY_FORMATS = ("json", "msgpack")  # how a struct (or list, or map) body column is encoded
MAX_INGEST_ID = 100
KEY_DIGEST = 32  # hex characters of sha256 in a dialog id
# How dialog ids are made (`dialog_id`), by release: 1, the key's digest alone; 2, the CRC-32 of
# the key's text first; 3, the key's own order first. Ingests begun by an earlier release keep
# their kind when run again (see `spark_bridge.ingest`).
DIGEST_IDS, RANKED_IDS, ORDERED_IDS = 1, 2, 3
RANK_MARK = "k"  # begins a ranked id's part after the "/"
WHOLE_MARK, TEXT_MARK = "n", "t"  # begin an ordered id's part: a whole number's, other text's
# (none is a hex digit, so ids of different kinds never share a prefix beyond "<ingest id>/")
TEXT_PREFIX = 16  # bytes of a key's text an ordered id carries, as hex, before its digest
_SIGN = 1 << 63


def check_ingest_id(ingest_id: object) -> str:
    ok = isinstance(ingest_id, str) and 0 < len(ingest_id) <= MAX_INGEST_ID
    if not ok or ingest_id != ingest_id.strip() or "/" in ingest_id:
        raise InvalidArgument(
            f"ingest_id must be a non-empty string of at most {MAX_INGEST_ID} characters with no "
            f"'/' and no surrounding spaces, not {ingest_id!r}"
        )
    return ingest_id


def key_text(value: object) -> str:
    """A key as text: the same text Spark's cast to string gives (strings and whole numbers)."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise InvalidArgument(f"a conversation key must be a string or a whole number, not {value!r}")


def key_texts(column: pa.Array) -> list[str]:
    """A key column as text, as `key_text` gives it (in bulk for strings and whole numbers)."""
    t = column.type
    if column.null_count == 0:
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            return column.to_pylist()
        if pa.types.is_integer(t):
            return column.cast(pa.string()).to_pylist()
    return [key_text(k) for k in column.to_pylist()]


def run_starts(column: pa.Array) -> list[int]:
    """Where each run of equal keys begins, after the first (rows sorted by key)."""
    n = len(column)
    if n < 2:
        return []
    differs = pc.not_equal(column.slice(1), column.slice(0, n - 1))
    return (np.flatnonzero(differs.to_numpy(zero_copy_only=False)) + 1).tolist()


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:KEY_DIGEST]


def key_rank(key: str) -> int:
    """A key's place in the ingest order of ranked ids (RANKED_IDS): the CRC-32 of its text, as
    Spark's `crc32(cast(cast(key as string) as binary))` computes it."""
    return zlib.crc32(key.encode())


def whole_number(key: str) -> int | None:
    """The key's text as a whole number, if it is one as Spark writes one (`cast(n as string)`:
    no sign but a minus, no leading zeros, within 64 bits); else None."""
    digits = key[1:] if key[:1] == "-" else key
    if not (0 < len(digits) <= 19 and digits.isascii() and digits.isdigit()):
        return None
    value = int(key)
    return value if str(value) == key and -_SIGN <= value < _SIGN else None


def dialog_id(ingest_id: str, key: str, kind: int = ORDERED_IDS) -> str:
    """The handle and conversation id of one key's dialog, from the key's text (so a key of
    whole numbers and the same key written as text name the same dialog): `<ingest id>/n` and
    the number plus 2**63 as 16 hex digits, for a whole number; else `<ingest id>/t`, the text's
    first TEXT_PREFIX bytes as hex (padded with 0s) and its digest (sha256's first 32 hex
    digits). So ids sort as Spark sorts the keys (numbers by value, text byte by byte, each
    within its length for whole numbers written as text): an ingest's senders meet their keys in
    that order (`spark_bridge.arrange`), so each begins its dialogs in the order of their ids,
    and the brokers' indexes of handles and conversation ids grow at one point per sender, a few
    pages a commit, where ids in no order land anywhere (a page written for each new dialog, in
    every index). Spark computes the same in `reconcile.expected_rows`. Ids of earlier
    releases, for their re-runs: DIGEST_IDS, `<ingest id>/<digest>`; RANKED_IDS,
    `<ingest id>/k`, `key_rank` as 8 hex digits, the digest."""
    if kind == DIGEST_IDS:
        return f"{ingest_id}/{_digest(key)}"
    if kind == RANKED_IDS:
        return f"{ingest_id}/{RANK_MARK}{key_rank(key):08x}{_digest(key)}"
    number = whole_number(key)
    if number is not None:
        return f"{ingest_id}/{WHOLE_MARK}{number + _SIGN:016x}"
    head = key.encode()[:TEXT_PREFIX].hex().ljust(2 * TEXT_PREFIX, "0")
    return f"{ingest_id}/{TEXT_MARK}{head}{_digest(key)}"


def group_id(ingest_id: str, group: str) -> str:
    return f"{ingest_id}/g/{_digest(group)}"


def broker_of(key: str, brokers: int) -> int:
    """Which of the senders a key's dialog goes through: stable across runs and processes."""
    return int(_digest(key)[:8], 16) % brokers


assert len(dialog_id("x" * MAX_INGEST_ID, "k")) <= MAX_HANDLE


def digest_span(ingest_id: str) -> tuple[str, str]:
    """The handles the digest ids of `ingest_id` lie between (the first, and one past the last):
    a hex digit follows the "/", where ids of the other kinds have a letter past "f"."""
    return f"{ingest_id}/0", f"{ingest_id}/g"


def rank_span(ingest_id: str) -> tuple[str, str]:
    """The same for the ranked ids (RANKED_IDS) of `ingest_id`."""
    return f"{ingest_id}/{RANK_MARK}", f"{ingest_id}/{chr(ord(RANK_MARK) + 1)}"


_HEX = frozenset("0123456789abcdef")


def ids_of(handle: str, ingest_id: str) -> int | None:
    """How `handle`, a dialog id of ingest `ingest_id`, was made (`dialog_id`); None: it is
    not one."""
    prefix = f"{ingest_id}/"
    rest = handle[len(prefix) :] if handle.startswith(prefix) else ""
    mark, n = rest[:1], len(rest)
    if not _HEX.issuperset(rest[1:]):
        return None
    if n == KEY_DIGEST and mark in _HEX:
        return DIGEST_IDS
    if n == 1 + 8 + KEY_DIGEST and mark == RANK_MARK:
        return RANKED_IDS
    if (n, mark) in ((1 + 16, WHOLE_MARK), (1 + 2 * TEXT_PREFIX + KEY_DIGEST, TEXT_MARK)):
        return ORDERED_IDS
    return None


def encode_bodies(column: pa.Array, body_format: str) -> list[bytes | None]:
    """A body column as bytes: binary as it is, strings as UTF-8, structs, lists and maps as
    JSON or msgpack. Nulls stay None (those rows are rejected)."""
    t = column.type
    if pa.types.is_binary(t) or pa.types.is_string(t):  # strings are UTF-8: the same bytes
        return _bytes_of(column)
    if pa.types.is_large_binary(t) or pa.types.is_large_string(t):
        return column.cast(pa.large_binary()).to_pylist()
    if pa.types.is_struct(t) or pa.types.is_list(t) or pa.types.is_map(t):
        values = column.to_pylist()
        if pa.types.is_map(t):  # Arrow gives a map as (key, value) pairs; a body wants an object
            values = [None if v is None else dict(v) for v in values]
        if body_format == "json":
            dump = json.JSONEncoder(separators=(",", ":"), default=str, ensure_ascii=False).encode
            return [None if v is None else dump(v).encode() for v in values]
        pack = msgpack.Packer(default=str, use_bin_type=True).pack
        return [None if v is None else pack(v) for v in values]
    raise InvalidArgument(f"a body column must be binary, string, struct, list or map, not {t}")


def _bytes_of(column: pa.Array) -> list[bytes | None]:
    """A binary or string column's values as bytes: sliced from its data buffer when it has no
    nulls (twice as fast as `to_pylist`, which matters at a million rows)."""
    if column.null_count:
        return column.cast(pa.binary()).to_pylist()
    n = len(column)
    ends = np.frombuffer(column.buffers()[1], dtype=np.int32)[column.offset : column.offset + n + 1]
    data = column.buffers()[2]
    first = int(ends[0])
    blob = b"" if data is None else data.slice(first, int(ends[-1]) - first).to_pybytes()
    ends = (ends - first).tolist()
    return [blob[a:b] for a, b in zip(ends, ends[1:], strict=False)]


@dataclass(frozen=True)
class IngestSpec:
    """What every sender needs to know about one ingest (pickled to Spark's Python workers)."""

    ingest_id: str
    run: str  # this run of the ingest (a fresh id per call of `ingest`)
    from_service: str
    to_service: str
    contract: str
    message_type: MessageType
    body: str
    body_format: str = "json"
    key: str = "key"  # the column of conversation keys
    group: str | None = None
    senders: int = 1  # brokers sending; a key's dialog goes through broker_of(key, senders)
    batch_rows: int = 4000
    max_body_bytes: int = 4 << 20
    call_bytes: int = 16 << 20  # bodies per call, summed (well under the brokers' max_call_bytes)
    encryption: bool = True  # the dialogs' ENCRYPTION
    ids: int = ORDERED_IDS  # how its dialog ids are made (`dialog_id`)


def slices(bodies: Sequence[bytes | None], rows: int, max_bytes: int) -> Iterator[tuple[int, int]]:
    """(start, stop) of consecutive runs of at most `rows` bodies and, unless one body alone is
    bigger, at most `max_bytes` bytes."""
    start, size = 0, 0
    for i, body in enumerate(bodies):
        n = len(body) if body is not None else 0
        if i > start and (i - start >= rows or size + n > max_bytes):
            yield start, i
            start, size = i, 0
        size += n
    if start < len(bodies):
        yield start, len(bodies)


@dataclass
class Call:
    """One `apply` call to one sending broker."""

    sender: int
    ops: list[Op]
    request_id: str
    rows: int


@dataclass
class Rejected:
    """A row that was not sent, and why."""

    key: str
    position: int
    reason: str


@dataclass
class _Dialog:
    key: str
    handle: str
    position: int = 0  # the next row's position among the key's rows
    sent: int = 0  # rows of the key sent so far: the next row's sequence number


@dataclass
class PartitionPlanner:
    """Turns the rows of one partition, each key's together and in order (`arrange`), into apply
    calls. Keeps the current key across batches, so a key's rows may span several."""

    spec: IngestSpec
    rejected: list[Rejected] = field(default_factory=list)
    dialogs: int = 0
    rows: int = 0
    _dialog: _Dialog | None = None
    _done: set[str] = field(default_factory=set)  # keys whose rows are all planned
    _validator: BodyValidator | None = None

    def __post_init__(self) -> None:
        self._validator = BodyValidator(self.spec.message_type, strict=False)

    def calls(self, batch: pa.RecordBatch) -> Iterator[Call]:
        """The apply calls that send `batch`'s rows, at most `batch_rows` rows each."""
        spec = self.spec
        n = batch.num_rows
        if n == 0:
            return
        bodies = encode_bodies(batch.column(spec.body), spec.body_format)
        key_column = batch.column(spec.key)
        starts = run_starts(key_column)
        # the key of each run (rows are sorted by key): one text per run, not per row
        keys = dict(zip([0, *starts], key_texts(key_column.take([0, *starts])), strict=True))
        groups = batch.column(spec.group).to_pylist() if spec.group else None
        # the common case, checked once per batch rather than per row: every body can go
        biggest = max(map(len, bodies)) if None not in bodies else None
        clean = (
            biggest is not None
            and biggest <= spec.max_body_bytes
            and self._validator is not None
            and self._validator.kind == "none"
        )
        if clean and biggest * spec.batch_rows <= spec.call_bytes:
            cuts: Iterator[tuple[int, int]] = (
                (i, min(n, i + spec.batch_rows)) for i in range(0, n, spec.batch_rows)
            )
        else:
            cuts = slices(bodies, spec.batch_rows, spec.call_bytes)
        for start, stop in cuts:
            runs = [start] + [i for i in starts if start < i < stop] + [stop]
            yield from self._calls(keys, bodies, groups, runs, clean)
        self.rows += n

    def _calls(
        self,
        keys: dict[int, str],
        bodies: Sequence[bytes | None],
        groups: Sequence[Any] | None,
        runs: Sequence[int],
        clean: bool,
    ) -> Iterator[Call]:
        """The calls for rows runs[0]..runs[-1]; each run between two boundaries is one key's."""
        spec = self.spec
        per_sender: dict[int, tuple[list[Op], list[tuple[str, int, int]], list[int]]] = {}
        for i, j in zip(runs, runs[1:], strict=False):
            key = keys.get(i)
            if key is None:  # a call cut inside a run: the run's key
                key = keys[max(k for k in keys if k <= i)]
            dialog = self._dialog_for(key)
            first_seq = dialog.sent
            if clean:
                run = list(bodies[i:j])
                dialog.sent += j - i
                dialog.position += j - i
            else:
                run = self._accepted(dialog, bodies[i:j])
            if run:
                sender = broker_of(key, spec.senders)
                ops, sends, count = per_sender.setdefault(sender, ([], [], [0]))
                group = None if groups is None or groups[i] is None else str(groups[i])
                ops.append(
                    Begin(
                        spec.from_service,
                        spec.to_service,
                        spec.contract,
                        handle=dialog.handle,
                        conversation_id=dialog.handle,
                        related_group=None if group is None else group_id(spec.ingest_id, group),
                        if_absent=True,
                        encryption=spec.encryption,
                    )
                )
                ops.append(Send(dialog.handle, spec.message_type.name, run, at=first_seq))
                sends.append((dialog.handle, first_seq, len(run)))
                count[0] += len(run)
        for sender, (ops, sends, count) in sorted(per_sender.items()):
            yield Call(sender, ops, request_id(spec, sends), count[0])

    def _accepted(self, dialog: _Dialog, bodies: Sequence[bytes | None]) -> list[bytes]:
        """The bodies of one key's run that can be sent; the others go to `rejected`."""
        run: list[bytes] = []
        for body in bodies:
            why = self._refused(body)
            if why is None:
                assert body is not None
                run.append(body)
                dialog.sent += 1
            else:
                self.rejected.append(Rejected(dialog.key, dialog.position, why))
            dialog.position += 1
        return run

    def _dialog_for(self, key: str) -> _Dialog:
        if self._dialog is None or self._dialog.key != key:
            if key in self._done:  # its sequence numbers would restart: rows would be skipped
                raise InvalidArgument(
                    f"the rows of key {key!r} are not together in their partition; an ingest "
                    "arranges them so (spark_bridge.arrange.arrangement)"
                )
            if self._dialog is not None:
                self._done.add(self._dialog.key)
            self._dialog = _Dialog(key, dialog_id(self.spec.ingest_id, key, self.spec.ids))
            self.dialogs += 1
        return self._dialog

    def _refused(self, body: bytes | None) -> str | None:
        """Why a row cannot be sent (None: it can)."""
        if body is None:
            return "the body is null"
        if len(body) > self.spec.max_body_bytes:
            return (
                f"the body is {len(body):,} bytes, over the broker's max_body_bytes "
                f"({self.spec.max_body_bytes:,})"
            )
        try:
            assert self._validator is not None
            self._validator.check(body)
        except Exception as exc:  # ValidationFailed, named by the validator
            return str(exc)
        return None


def request_id(spec: IngestSpec, sends: Sequence[tuple[str, int, int]]) -> str:
    """A call's request id, from the ingest id, the run and what it sends (dialog, first
    sequence, count): the same call made again in the same run carries the same id."""
    h = hashlib.sha256()
    for handle, at, count in sends:
        h.update(f"{handle}\0{at}\0{count}\0".encode())
    return f"ingest/{spec.ingest_id}/{spec.run}/{h.hexdigest()[:40]}"


BATCH_ROWS = 4000  # rows a call at most, by default
# With `rows_per_s`, calls a second from each partition, by default. Every call costs each broker
# on the path transactions, wake-ups and round trips whatever it carries; on a busy machine those
# costs, not the messages, set the load. The demo at 3,000 rows a second: 20 calls a second a
# partition took 1.73 of its brokers' cores (latency p50 239 ms), 10 took 1.34-1.56 (68-71 ms),
# 5 took 1.26-1.43 (107 ms: bigger bursts wait longer at each hop).
PACED_CALLS_PER_S = 10


def call_rows(batch_rows: int | None, share: float | None) -> int:
    """Rows a call at most: `batch_rows` when given; else BATCH_ROWS, or for a sender paced at
    `share` rows a second, a tenth of a second's rows (PACED_CALLS_PER_S calls a second)."""
    if batch_rows is not None:
        return batch_rows
    return BATCH_ROWS if share is None else max(1, round(share / PACED_CALLS_PER_S))


class Pace:
    """A sender's rate limit: how long to wait before issuing a call, so that the rows issued
    so far never run ahead of `rows_per_s` since the first call (no burst is saved up: a sender
    that fell behind catches up at once, then keeps to the rate)."""

    def __init__(self, rows_per_s: float, start: float) -> None:
        if not rows_per_s > 0:
            raise InvalidArgument(f"a rate must be above 0 rows a second, not {rows_per_s!r}")
        self.rows_per_s, self.start = rows_per_s, start

    def wait_s(self, rows_issued: int, now: float) -> float:
        """Seconds to wait, at `now`, before the call after the first `rows_issued` rows."""
        return max(0.0, self.start + rows_issued / self.rows_per_s - now)
