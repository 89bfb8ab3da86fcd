"""An ingest's progress: senders on Spark's executors count what they sent into one small Ray
actor, and the driver shows rows and rows/s while the job runs."""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable
from typing import Any


class Progress:
    """Counts of one ingest, as the senders report them."""

    def __init__(self, total: int | None) -> None:
        self.total = total  # None when the ingest did not count its rows beforehand
        self.rows = 0
        self.sent = 0
        self.started = time.monotonic()
        self.senders: set[int] = set()  # process ids of the senders seen (for operators, tests)

    def add(self, pid: int, rows: int, sent: int) -> None:
        self.senders.add(pid)
        self.rows += rows
        self.sent += sent

    def view(self) -> dict[str, Any]:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return {
            "rows": self.rows,
            "sent": self.sent,
            "total": self.total,
            "rows_per_s": self.rows / elapsed,
            "senders": sorted(self.senders),
        }


class Board:
    """Every running ingest's `Progress`, by run id: one small actor per cluster serves them all
    (starting an actor per ingest costs a process start, most of a second here)."""

    def __init__(self) -> None:
        self.runs: dict[str, Progress] = {}

    def start(self, run: str, total: int | None) -> None:
        self.runs[run] = Progress(total)

    def add(self, run: str, pid: int, rows: int, sent: int) -> None:
        if run in self.runs:  # a late report from a retried task of an ended run is dropped
            self.runs[run].add(pid, rows, sent)

    def view(self, run: str) -> dict[str, Any]:
        return self.runs[run].view()

    def end(self, run: str) -> None:
        self.runs.pop(run, None)


BOARD = "raybroker-ingest-progress"  # the board's actor name, in the brokers' namespace
REPORT_S = 0.5  # a sender tells the board what it sent at most this often, and at its end


def board(namespace: str) -> Any:
    """The cluster's progress board (started on first use, kept for the next ingests)."""
    import ray

    # restartable: a board lost with its node comes back elsewhere (empty: runs under way then
    # show no progress; their ingests go on)
    actor = ray.remote(num_cpus=0)(Board).options(
        name=BOARD, namespace=namespace, get_if_exists=True, lifetime="detached", max_restarts=-1
    )
    return actor.remote()


class Tally:
    """What one sender has sent and not yet told the board. A report costs both sides a Ray
    call, so it goes at most every `every_s` (the first at once, so a run shows its senders
    from the start) and the rest with `flush` at the end."""

    def __init__(self, tell: Callable[[int, int], Any], every_s: float = REPORT_S) -> None:
        self.tell, self.every_s = tell, every_s
        self.rows = self.messages = 0
        self.told_at = -math.inf

    def add(self, rows: int, messages: int, now: float) -> None:
        self.rows += rows
        self.messages += messages
        if now - self.told_at >= self.every_s:
            self.flush(now)

    def flush(self, now: float) -> None:
        if self.rows or self.messages:
            rows, messages = self.rows, self.messages
            self.rows = self.messages = 0
            self.told_at = now
            self.tell(rows, messages)


def best_effort(call: Callable[[], Any]) -> Any:
    """Progress never fails an ingest: a call to a board that is gone (or restarting) is None."""
    try:
        return call()
    except Exception:
        return None


def line(view: dict[str, Any]) -> str:
    rate = f"{view['rows_per_s']:,.0f} rows/s"
    if not view["total"]:
        return f"{view['rows']:,} rows, {rate}"
    share = 100 * view["rows"] / view["total"]
    return f"{view['rows']:,}/{view['total']:,} rows ({share:.0f}%), {rate}"


class Watcher:
    """Polls a run's progress from a driver thread and hands each view to `show`."""

    def __init__(
        self, actor: Any, run: str, show: Callable[[dict[str, Any]], None], every_s: float
    ) -> None:
        self.actor, self.run, self.show, self.every_s = actor, run, show, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="ingest-progress")

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import ray

        while not self._stop.wait(self.every_s):
            try:
                self.show(ray.get(self.actor.view.remote(self.run), timeout=self.every_s))
            except Exception:  # progress is best effort: never fail the ingest over it
                continue


def print_progress(view: dict[str, Any]) -> None:
    print(f"ingest: {line(view)}", file=sys.stderr, flush=True)
