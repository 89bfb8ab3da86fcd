"""Endpoints' sequence numbers, written as an append-only journal and folded into their table in
sorted sweeps.

Every message sent or received moves its endpoint's sequence numbers. Written in place, each
commit rewrites one 4 KiB page of `endpoint_seqs` per endpoint it touched; once the table is far
larger than the hot dialogs (ten million open, ten thousand busy), every busy endpoint sits on a
page of its own, so a commit of 100 messages writes 100 scattered pages, and the WAL and the
checkpoint carry them all. Measured with SQLite alone: 100 rows updated a transaction ran at 361
transactions/s on a 20-million-row table, 1,964 on a 20,000-row one; appended to a journal and
folded as here, 2,634 on the large one.

So a transaction appends its endpoints' numbers to a journal (entries in number order: the
newest entry of an endpoint wins over `endpoint_seqs`). The journal has no index (one on the
endpoint would be a scattered write per entry again): the store keeps the newest numbers of
every endpoint with an entry in the journal in memory (`latest`, read back from the journal when
the store opens), and a read of an endpoint takes them from there.

A sweep folds the journal: it takes the endpoints in `latest` in number order and writes their
newest numbers into `endpoint_seqs`, a few each transaction that appends (at a pace that ends the
sweep after SWEEP_ROWS more entries), so an endpoint written many times in a sweep is written once,
and the table's rows are written in its order. An endpoint written again since the sweep began
is skipped: its newer entry outlives the sweep. One written in the sweep before but not since is
carried instead: its newest numbers are appended again (a write at the journal's end, not a
scattered page), and it is folded only if it stays quiet through the next sweep too. Busy
endpoints are therefore folded only once they go quiet. Folding every endpoint that merely
missed one sweep's window cost, with 10,000 busy dialogs among 10 million, some 8,000 scattered
page writes per 100,000 messages (a fifth of the busy endpoints each sweep). When a sweep ends,
the journal's entries up to where it began go. The journal then holds at most the entries of two
sweeps and what they carried (one more sweep's across a restart, which begins a new sweep and
carries what the journal names once more), and `latest` at most one entry per endpoint in them.

A transaction's entries are written as one row of `seq_entries` (the entries packed: endpoint,
send_seq, recv_seq, ...; the row's id is its last entry's number, the entries numbered
consecutively before it), not a row each: a commit of a hundred dialogs' messages inserts one
row, not a hundred (with SQLite's work per statement row and per b-tree cell), and a sweep's end
deletes a few rows, not a hundred thousand. A store written before the packing (its entries a
row each in `seq_journal`) is read back from there too, and that table's rows go when the first
sweep ends.

Everything the journal changes is written inside the caller's transaction (`Store.tx` tells it
`before_commit`, `committed`, `rolled_back`): a rollback leaves memory as the store is.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import msgpack

from actors.packing import packb
from actors.store.file import Connection

SWEEP_ROWS = 100_000  # journal entries appended while one sweep runs
SEQ_JOURNAL = """
CREATE TABLE IF NOT EXISTS seq_entries (id INTEGER PRIMARY KEY, entries BLOB NOT NULL);
"""
UNPACKED = "SELECT 1 FROM sqlite_master WHERE type='table' AND name='seq_journal'"
Seqs = tuple[int, int, int]  # send_seq, recv_seq, the journal entry's number


def entries(db: Connection) -> Iterator[tuple[int, int, int, int]]:
    """Every entry the journal holds, oldest first: (number, endpoint, send_seq, recv_seq).
    Those of a store written before the packing come first (all older than any packed one)."""
    if db.execute(UNPACKED).fetchone() is not None:
        yield from db.execute("SELECT id, no, send_seq, recv_seq FROM seq_journal ORDER BY id")
    for last, packed in db.execute("SELECT id, entries FROM seq_entries ORDER BY id"):
        flat = msgpack.unpackb(packed)
        first = last - len(flat) // 3 + 1
        for i in range(0, len(flat), 3):
            yield first + i // 3, flat[i], flat[i + 1], flat[i + 2]


class SeqJournal:
    """The journal of one store's connection, and the newest numbers it holds per endpoint."""

    def __init__(self, db: Connection) -> None:
        self.db = db
        self.latest: dict[int, Seqs] = {}
        self.top_no = 0  # the highest endpoint number the journal names (not to be reused)
        last = 0
        for last, no, send_seq, recv_seq in entries(db):
            self.latest[no] = (send_seq, recv_seq, last)
            self.top_no = max(self.top_no, no)
        self._next_id = last + 1
        # a store written before the packing: its rows go when the first sweep ends
        self._unpacked = db.execute(UNPACKED).fetchone() is not None
        self._staged: dict[int, Seqs] = {}  # the open transaction's
        self._flat: list[int] = []  # its entries, not yet written: endpoint, send_seq, recv_seq
        self._gone: set[int] = set()  # endpoints the open transaction deleted
        self._appended = 0  # entries the open transaction appended (its own writes: they pace)
        self._rows_open = 0  # and with what it carried (all its entries)
        self._carried: set[int] = set()  # endpoints whose newest entry is a carry (committed)
        self._carrying: list[int] = []  # the open transaction's carries
        self._sweep: list[int] = []  # endpoints the running sweep folds, in number order
        self._done = 0  # how many of them are folded (committed)
        self._rows = 0  # entries appended since it began (committed)
        self._upto = 0  # the journal's entries up to this number go when the sweep ends
        self._folding: int | None = None  # how many are folded once the open transaction commits

    def seqs(self, no: int) -> Seqs | None:
        """The newest numbers the journal holds for endpoint `no` (None: `endpoint_seqs` has
        them)."""
        seqs = self._staged.get(no)
        if seqs is not None or no in self._gone:
            return seqs
        return self.latest.get(no)

    def write(self, rows: Iterable[tuple[int, int, int]], in_tx: bool) -> None:
        """Endpoints' new numbers: (send_seq, recv_seq, no). `in_tx`: inside `Store.tx` (else
        the statement commits on its own)."""
        self._appended += self._append(rows)
        if not in_tx:
            self._write()
            self.committed()

    def _append(self, rows: Iterable[tuple[int, int, int]]) -> int:
        """Stage entries (written as one row by `_write`); how many."""
        first = self._next_id
        staged, flat = self._staged, self._flat
        n = 0
        for s, r, no in rows:
            staged[no] = (s, r, first + n)
            flat += (no, s, r)
            n += 1
        self._next_id = first + n
        self._rows_open += n
        return n

    def _write(self) -> None:
        """The open transaction's entries, as one row."""
        if self._flat:
            self.db.execute(
                "INSERT INTO seq_entries VALUES (?, ?)", (self._next_id - 1, packb(self._flat))
            )
            self._flat = []

    def forget(self, nos: Iterable[int], in_tx: bool) -> None:
        """Endpoints deleted: nothing to keep for them (their entries go with a later sweep)."""
        for no in nos:
            if no in self.latest or no in self._staged:
                self._staged.pop(no, None)
                self._gone.add(no)
        if not in_tx:
            self.committed()

    def before_commit(self) -> None:
        """Inside the transaction, before it commits: fold as much as the entries it appended owe
        the sweep (starting one when none runs and the journal holds anything)."""
        if not self._appended:
            return
        if not self._sweep and not self._start():
            self._write()
            return
        sweep = self._sweep
        # in step with the entries appended: all folded once SWEEP_ROWS have been
        done = min(len(sweep), (self._rows + self._appended) * len(sweep) // SWEEP_ROWS)
        if done > self._done:
            folds, carries = [], []
            carried = self._carried
            for no in sweep[self._done : done]:
                seqs = self.seqs(no)
                # written since the sweep began: that entry outlives the sweep, nothing to fold
                if seqs is not None and seqs[2] <= self._upto:
                    # written in the sweep before (its newest entry is no carry): still busy
                    (folds if no in carried else carries).append((seqs[0], seqs[1], no))
            self.db.executemany("UPDATE endpoint_seqs SET send_seq=?, recv_seq=? WHERE no=?", folds)
            self._append(carries)
            self._carrying = [no for _, _, no in carries]
        self._write()
        if done == len(sweep):
            self.db.execute("DELETE FROM seq_entries WHERE id <= ?", (self._upto,))
            if self._unpacked:  # all older than the sweep's start
                self.db.execute("DELETE FROM seq_journal")
        self._folding = done

    def _start(self) -> bool:
        if not self.latest:
            return False
        # every endpoint the journal names was written (or carried) since the last sweep began
        self._sweep = sorted(self.latest)
        self._done = self._rows = 0
        # every entry committed (the newest may be an ended endpoint's, not in `latest`): rows
        # are whole transactions', so none straddles it
        self._upto = self._next_id - 1 - self._rows_open
        return True

    def committed(self) -> None:
        """The transaction committed: what it wrote is the journal's."""
        self.latest.update(self._staged)
        carried = self._carried
        if carried:  # written by the transaction: busy again
            carried.difference_update(self._staged)
        carried.update(self._carrying)
        for no in self._gone:
            self.latest.pop(no, None)
            carried.discard(no)
        if self._folding is not None:
            self._done, self._rows = self._folding, self._rows + self._appended
            if self._done == len(self._sweep):  # ended: what it folded left the journal
                self._unpacked = False
                for no in self._sweep:
                    seqs = self.latest.get(no)
                    if seqs is not None and seqs[2] <= self._upto:
                        del self.latest[no]
                        carried.discard(no)
                self._sweep = []
        self._reset()

    def rolled_back(self) -> None:
        """The transaction rolled back: nothing it wrote happened."""
        self._next_id -= self._rows_open
        self._reset()

    def _reset(self) -> None:
        self._staged, self._gone, self._appended, self._folding = {}, set(), 0, None
        self._rows_open, self._carrying, self._flat = 0, [], []
