"""Endpoints' sequence numbers, written as an append-only journal and folded into their table in
sorted sweeps.

Every message sent or received moves its endpoint's sequence numbers. Written in place, each
commit rewrites one 4 KiB page of `endpoint_seqs` per endpoint it touched; once the table is far
larger than the hot dialogs (ten million open, ten thousand busy), every busy endpoint sits on a
page of its own, so a commit of 100 messages writes 100 scattered pages, and the WAL and the
checkpoint carry them all. Measured with SQLite alone: 100 rows updated a transaction ran at 361
transactions/s on a 20-million-row table, 1,964 on a 20,000-row one; appended to a journal and
folded as here, 2,634 on the large one.

So a transaction appends its endpoints' numbers to `seq_journal` (rows in id order: the newest
row of an endpoint wins over `endpoint_seqs`). The journal has no index (one on the endpoint
would be a scattered write per row again): the store keeps the newest numbers of every endpoint
with a row in the journal in memory (`latest`, read back from the journal when the store opens),
and a read of an endpoint takes them from there.

A sweep folds the journal: it takes the endpoints in `latest` in number order and writes their
newest numbers into `endpoint_seqs`, a few each transaction that appends (at a pace that ends the
sweep after SWEEP_ROWS more rows), so an endpoint written many times in a sweep is written once,
and the rows are written in the table's order. An endpoint written again since the sweep began
is skipped: its newer row outlives the sweep. One written in the sweep before but not since is
carried instead: its newest numbers are appended again (a write at the journal's end, not a
scattered page), and it is folded only if it stays quiet through the next sweep too. Busy
endpoints are therefore folded only once they go quiet. Folding every endpoint that merely
missed one sweep's window cost, with 10,000 busy dialogs among 10 million, some 8,000 scattered
page writes per 100,000 messages (a fifth of the busy endpoints each sweep). When a sweep ends,
the journal's rows up to where it began go. The journal then holds at most the rows of two
sweeps and what they carried (one more sweep's across a restart, which begins a new sweep and
carries what the journal names once more), and `latest` at most one entry per endpoint in them.

Everything the journal changes is written inside the caller's transaction (`Store.tx` tells it
`before_commit`, `committed`, `rolled_back`): a rollback leaves memory as the store is.
"""

from __future__ import annotations

from collections.abc import Iterable

from actors.store.file import Connection

SWEEP_ROWS = 100_000  # journal rows appended while one sweep runs
SEQ_JOURNAL = """
CREATE TABLE IF NOT EXISTS seq_journal (
    id INTEGER PRIMARY KEY, no INTEGER NOT NULL, send_seq INTEGER NOT NULL,
    recv_seq INTEGER NOT NULL);
"""
Seqs = tuple[int, int, int]  # send_seq, recv_seq, the journal row's id


class SeqJournal:
    """The journal of one store's connection, and the newest numbers it holds per endpoint."""

    def __init__(self, db: Connection) -> None:
        self.db = db
        self.latest: dict[int, Seqs] = {}
        self.top_no = 0  # the highest endpoint number the journal names (not to be reused)
        for row_id, no, send_seq, recv_seq in db.execute("SELECT * FROM seq_journal ORDER BY id"):
            self.latest[no] = (send_seq, recv_seq, row_id)
            self.top_no = max(self.top_no, no)
        self._next_id = 1 + (db.execute("SELECT MAX(id) FROM seq_journal").fetchone()[0] or 0)
        self._staged: dict[int, Seqs] = {}  # the open transaction's
        self._gone: set[int] = set()  # endpoints the open transaction deleted
        self._appended = 0  # rows the open transaction appended (its own writes: they pace)
        self._rows_open = 0  # and with what it carried (all its rows)
        self._carried: set[int] = set()  # endpoints whose newest row is a carry (committed)
        self._carrying: list[int] = []  # the open transaction's carries
        self._sweep: list[int] = []  # endpoints the running sweep folds, in number order
        self._done = 0  # how many of them are folded (committed)
        self._rows = 0  # rows appended since it began (committed)
        self._upto = 0  # the journal's rows up to this id go when the sweep ends
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
            self.committed()

    def _append(self, rows: Iterable[tuple[int, int, int]]) -> int:
        first = self._next_id
        journal = [(first + i, no, s, r) for i, (s, r, no) in enumerate(rows)]
        if journal:
            self.db.executemany("INSERT INTO seq_journal VALUES (?, ?, ?, ?)", journal)
            self._next_id = first + len(journal)
            self._rows_open += len(journal)
            self._staged.update({no: (s, r, row_id) for row_id, no, s, r in journal})
        return len(journal)

    def forget(self, nos: Iterable[int], in_tx: bool) -> None:
        """Endpoints deleted: nothing to keep for them (their rows go with a later sweep)."""
        for no in nos:
            if no in self.latest or no in self._staged:
                self._staged.pop(no, None)
                self._gone.add(no)
        if not in_tx:
            self.committed()

    def before_commit(self) -> None:
        """Inside the transaction, before it commits: fold as much as the rows it appended owe
        the sweep (starting one when none runs and the journal holds anything)."""
        if not self._appended:
            return
        if not self._sweep and not self._start():
            return
        sweep = self._sweep
        # in step with the rows appended: all folded once SWEEP_ROWS rows have been
        done = min(len(sweep), (self._rows + self._appended) * len(sweep) // SWEEP_ROWS)
        if done > self._done:
            folds, carries = [], []
            carried = self._carried
            for no in sweep[self._done : done]:
                seqs = self.seqs(no)
                # written since the sweep began: that row outlives the sweep, nothing to fold
                if seqs is not None and seqs[2] <= self._upto:
                    # written in the sweep before (its newest row is no carry): still busy
                    (folds if no in carried else carries).append((seqs[0], seqs[1], no))
            self.db.executemany("UPDATE endpoint_seqs SET send_seq=?, recv_seq=? WHERE no=?", folds)
            self._append(carries)
            self._carrying = [no for _, _, no in carries]
        if done == len(sweep):
            self.db.execute("DELETE FROM seq_journal WHERE id <= ?", (self._upto,))
        self._folding = done

    def _start(self) -> bool:
        if not self.latest:
            return False
        # every endpoint the journal names was written (or carried) since the last sweep began
        self._sweep = sorted(self.latest)
        self._done = self._rows = 0
        self._upto = max(seqs[2] for seqs in self.latest.values())
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
        self._rows_open, self._carrying = 0, []
