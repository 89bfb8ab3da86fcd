"""What `raybroker verify` saw, shared by its threads: messages the broker accepted, replies whose
commit succeeded, and each stream's flow (for recovery times). No Ray."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from actors.tools.verify.checker import Reply, Sent, recovered_at


def parse_id(ident: str) -> tuple[str, int]:
    """A message id is "<stream>:<position>" (the generator's own naming)."""
    stream, _, position = ident.rpartition(":")
    return stream, int(position)


def make_id(stream: str, position: int) -> str:
    return f"{stream}:{position}"


class History:
    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.sent: list[Sent] = []
        self.replies: list[Reply] = []
        self.flow: dict[str, list[tuple[int, float]]] = defaultdict(list)
        self.sent_upto: dict[str, int] = {}  # per stream: positions below this were accepted
        self.confirmed: set[str] = set()  # distinct ids with a committed reply
        self.others: list[dict[str, Any]] = []  # messages at the shop that are not replies
        self.workload_sent = 0
        self.workload_confirmed = 0

    def record_sent(self, sent: Iterable[Sent], workload: bool = True) -> None:
        with self.changed:
            for s in sent:
                self.sent.append(s)
                self.sent_upto[s.stream] = max(self.sent_upto.get(s.stream, 0), s.position + 1)
                self.workload_sent += workload
            self.changed.notify_all()

    def record_replies(self, replies: Iterable[Reply]) -> None:
        with self.changed:
            for r in replies:
                self.replies.append(r)
                stream, position = parse_id(r.id)
                self.flow[stream].append((position, r.at))
                if r.id not in self.confirmed:
                    self.confirmed.add(r.id)
                    self.workload_confirmed += not stream.startswith("spark/")
            self.changed.notify_all()

    def record_other(self, what: dict[str, Any]) -> None:
        with self.changed:
            self.others.append(what)

    def wait_outstanding_below(self, limit: int, deadline: float) -> bool:
        """Block while more than `limit` workload messages wait for their reply (flow control);
        False if the deadline came first."""
        with self.changed:
            while self.workload_sent - self.workload_confirmed > limit:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(min(left, 1.0))
            return True

    def recovered_at(self, marks: Mapping[str, int]) -> float | None:
        with self.changed:
            flow = {s: list(self.flow.get(s, ())) for s in marks}
            return recovered_at(marks, dict(self.sent_upto), flow)

    def unconfirmed(self) -> int:
        """Messages the broker accepted whose reply has not been committed yet."""
        with self.changed:
            return sum(1 for s in self.sent if s.id not in self.confirmed)

    def counts(self) -> dict[str, int]:
        with self.changed:
            return {
                "sent": len(self.sent),
                "confirmed": len(self.confirmed),
                "replies": len(self.replies),
            }
