"""The mirror's backlog: shipped transactions it holds and has answered for, not yet applied.

A mirror answers a ship once it **holds** the transactions, and applies them to its store just
after (in one SQLite transaction for all that waits: `take`, `apply` (on a thread of its own,
so ships go on being answered meanwhile), `applied`), as SQL Server's mirror answers once
the log records are hardened and redoes them after. A caller of the principal then waits for one
trip to the mirror and a write to a file, not for the mirror's SQLite transaction as well
(measured: half the round trip on a busy 2-core machine).

Holds means written to the backlog's file beside the store (`log_path`), and synced when the
store's durability is "full": what the principal's own commit promises at the same durability.
So a mirror whose process dies after answering finds the transactions in the file when it opens
its store again (`recover`), and one promoted to principal applies its whole backlog before it
opens a broker on the store. The file is emptied each time the backlog is applied; a frame a
crash cut short was never answered for, and is ignored.

The backlog is bounded (`full`): a ship that finds it full waits for it to be applied, so neither
the mirror's memory nor a failover's wait for it grows with a burst.

What waits is applied in batches (`apply_wait`): a transaction held while the mirror applies
nothing waits up to `APPLY_AFTER_S` for the ships behind it, so one SQLite transaction (one
commit, one fsync at "full") applies several, and a message a principal's group commit wrote and
its next one deleted is never written to the mirror's store at all. Measured on the bench's
stream (a ship every ~5 ms): 3.4 ships an apply instead of 1.0, and 0.44 ms of the mirror's CPU a
ship instead of 0.75. Waiting 50 ms rather than 10 (and for a full backlog rather than 32
transactions) took the mirror's CPU a message from 0.43-0.44 to 0.31-0.33 us in streams
of 3,000,000 messages: fewer of the store's pages written again at every apply, and more of what
one commit wrote and a later one deleted gone before it reaches the mirror's store. Nobody waits
for it: callers are answered once a transaction is held, and a promotion applies everything held
first (at most `MOST_ENTRIES` transactions, `MOST_BYTES` bytes, as before).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import struct
import time
from collections.abc import Sequence
from typing import Any

import msgpack

from actors.errors import MirrorBehind
from actors.mirroring import replay
from actors.mirroring.capture import Entry
from actors.packing import packb
from actors.store.file import sync_directory, write_new

log = logging.getLogger("raybroker")

MOST_ENTRIES = 256  # transactions held before a ship waits for them to be applied
MOST_BYTES = 32 << 20  # and bytes
FILE_BYTES = 4 * MOST_BYTES  # a file this long, never emptied under load, is written anew
APPLY_AFTER_S = 0.05  # how long the first transaction held waits for others to be applied with
_LENGTH = struct.Struct("<I")  # each entry in the file: its length, then it (msgpack)


def log_path(store_path: str) -> str:
    return f"{store_path}-mirrorlog"


def _framed(entry: Entry) -> bytes:
    data = packb([entry.seq, entry.at, [list(s) for s in entry.statements]])
    return _LENGTH.pack(len(data)) + data


def read_log(path: str) -> list[Entry]:
    """The entries a backlog's file holds, in order; a last one cut short is left out, and a
    damaged one ends the reading (logged)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    out, at = [], 0
    while at + _LENGTH.size <= len(data):
        (n,) = _LENGTH.unpack_from(data, at)
        if at + _LENGTH.size + n > len(data):
            break  # written in part when the process stopped: never answered for
        try:
            seq, when, statements = msgpack.unpackb(
                data[at + _LENGTH.size : at + _LENGTH.size + n], raw=False
            )
            out.append(Entry(seq, when, [(many, sql, params) for many, sql, params in statements]))
        except Exception:  # damaged on disk (this code never leaves a frame so): read no further
            why = "the entries from it on are not applied (a rebuild replaces them)"
            log.error("mirror backlog %s: entry %d is damaged; %s", path, len(out), why)
            break
        at += _LENGTH.size + n
    return out


def recover(store_path: str, db: Any, held: int) -> int:
    """Apply what the backlog's file of the store at `store_path` holds beyond `held` (the
    store's number), then empty it; the store's number after."""
    path = log_path(store_path)
    entries = [e for e in read_log(path) if e.seq > held]
    if entries:
        try:
            held = replay.apply(db, held, entries)
        except MirrorBehind as exc:  # not this store's continuation: a rebuild follows anyway
            log.warning("mirror backlog %s does not follow its store: %s", path, exc)
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
    return held


class Backlog:
    """One mirror store's backlog. `held`: the store's number when it was opened (recovered)."""

    def __init__(self, store_path: str, held: int, sync: bool) -> None:
        self.path = log_path(store_path)
        self.sync = sync
        self.applied_seq = held  # the store's number
        self.received = held  # the last transaction held (applied or waiting)
        self.pending: collections.deque[Entry] = collections.deque()
        self.bytes = 0  # what `pending` takes in the file
        self._sizes: collections.deque[int] = collections.deque()  # each pending entry's
        self._file_bytes = 0
        self._fd: int | None = None
        self._first_held_at = 0.0  # when the oldest transaction waiting was held

    def full(self) -> bool:
        return len(self.pending) >= MOST_ENTRIES or self.bytes >= MOST_BYTES

    def apply_wait(self, now: float) -> float:
        """Seconds before what waits is applied (0: now), `now` on `time.monotonic`'s clock: the
        oldest transaction waiting waits `APPLY_AFTER_S` from its holding for more to batch with,
        unless the backlog is full."""
        if not self.pending or self.full():
            return 0.0
        return max(0.0, self._first_held_at + APPLY_AFTER_S - now)

    def accept(self, entries: Sequence[Entry]) -> int:
        """Hold `entries` (those after `received`; ones already held are skipped: a ship retried
        after a lost answer): written to the file (and synced) before this returns. The last
        transaction held. A gap before them is refused (`MirrorBehind`): the principal rebuilds."""
        received = self.received
        todo = [e for e in entries if e.seq > received]
        if not todo:
            return received
        for e in todo:
            if e.seq != received + 1:
                raise MirrorBehind(received, e.seq)
            received = e.seq
        frames = [_framed(e) for e in todo]
        self._write(b"".join(frames))
        sizes = [len(f) for f in frames]
        if not self.pending:
            self._first_held_at = time.monotonic()
        self.pending.extend(todo)
        self._sizes.extend(sizes)
        self.bytes += sum(sizes)
        self.received = received
        return received

    def take(self) -> list[Entry]:
        """Everything waiting, to `apply` (it stays waiting until `applied`)."""
        return list(self.pending)

    def apply(self, db: Any, entries: list[Entry]) -> int:
        """Apply `take`'s entries in one transaction (their store's number after). Touches
        nothing of the backlog's own: it may run on another thread while ships are held."""
        return replay.apply(db, self.applied_seq, entries) if entries else self.applied_seq

    def applied(self, entries: list[Entry]) -> None:
        """`entries` (from `take`) are in the store: they wait no more. The file is emptied
        once nothing waits (written anew, holding only what waits, when it grew too long)."""
        for _ in entries:
            self.pending.popleft()
            self.bytes -= self._sizes.popleft()
        if self.pending:  # held while these were applied: their wait starts now
            self._first_held_at = time.monotonic()
        if entries:
            self.applied_seq = entries[-1].seq
        if not self.pending:
            self._empty()
        elif self._file_bytes > FILE_BYTES:
            self._rewrite()

    def drain(self, db: Any) -> int:
        """Apply everything waiting, here and now; the store's number. A failure leaves the
        backlog as it was (the store rolled back)."""
        entries = self.take()
        self.apply(db, entries)
        self.applied(entries)
        return self.applied_seq

    def reset(self, seq: int) -> None:
        """The store was replaced (rebuilt at `seq`): nothing of before waits."""
        self.pending.clear()
        self.bytes = 0
        self._sizes.clear()
        self.applied_seq = self.received = seq
        self._empty()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _write(self, data: bytes) -> None:
        if self._fd is None:
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
            self._fd = os.open(self.path, flags, 0o644)
            self._file_bytes = os.fstat(self._fd).st_size
            if self.sync:  # the file's name survives a power cut too
                sync_directory(os.path.dirname(os.path.abspath(self.path)))
        start = self._file_bytes
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
            if self.sync:
                os.fdatasync(self._fd)
        except BaseException:
            # a write that failed part way (a full disk, say) was never answered for: cut it
            # off, or the frames written after it would be read as part of it
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, start)
            raise
        self._file_bytes = start + len(data)

    def _empty(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.truncate(self.path, 0)
        self._file_bytes = 0

    def _rewrite(self) -> None:
        """The file anew, holding only what waits (written beside it, then renamed over it)."""
        self.close()
        write_new(self.path + ".new", b"".join(_framed(e) for e in self.pending))
        os.replace(self.path + ".new", self.path)
        if self.sync:
            sync_directory(os.path.dirname(os.path.abspath(self.path)))
        self._file_bytes = self.bytes
