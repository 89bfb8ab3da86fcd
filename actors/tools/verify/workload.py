"""The workload of `raybroker verify`: dialogs on every path, a sender that pauses at each fault's
place in the stream, and a collector that receives and commits the replies at the shop. Runs on
any broker handle (`BrokerHandle`); imports no Ray."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from actors.calls.envelope import Begin, Send
from actors.errors import BrokerUnavailable, LockNotHeld
from actors.tools.verify.checker import Reply, Sent
from actors.tools.verify.history import History, make_id
from actors.tools.verify.malformed import Malformed
from actors.tools.verify.topology import CONTRACT, PATHS, REPLY, REQUEST, SHOP_QUEUE, SHOP_SERVICE


@dataclass
class Stream:
    """One dialog of the workload: `name` ("balanced/3"), its path, handle and conversation id,
    the `part` its routed messages name, and `next` (positions allocated so far)."""

    name: str
    path: str
    handle: str
    conversation: str
    part: str = "A"
    next: int = 0

    def body(self, position: int) -> bytes:
        return json.dumps({"id": make_id(self.name, position), "part": self.part}).encode()


def begin_streams(shop: Any, dialogs: int) -> dict[str, list[Stream]]:
    """`dialogs` dialogs per path, begun in one call; routed ones alternate parts A, A, B, B, ...
    so both router replicas (reached round-robin) carry both parts."""
    out: dict[str, list[Stream]] = {}
    ops = []
    for path, service in PATHS.items():
        out[path] = []
        for i in range(dialogs):
            op = Begin(SHOP_SERVICE, service, CONTRACT, conversation_id=str(uuid.uuid4()),
                       encryption=path == "secured")  # fmt: skip
            ops.append(op)
            part = "AB"[(i // 2) % 2]
            out[path].append(Stream(f"{path}/{i}", path, op.handle, op.conversation_id, part))
    shop.apply(ops)
    return out


class Gates:
    """Where the sender waits for a fault: at each threshold (messages allocated) it says it has
    arrived and waits until the fault is injected."""

    def __init__(self, thresholds: Sequence[int]) -> None:
        self.thresholds = list(thresholds)
        self.arrived = [threading.Event() for _ in self.thresholds]
        self.released = [threading.Event() for _ in self.thresholds]
        self.passed = 0

    def pass_(self, allocated: int, deadline: float) -> None:
        while self.passed < len(self.thresholds) and allocated >= self.thresholds[self.passed]:
            i = self.passed
            self.arrived[i].set()
            self.released[i].wait(max(0.0, deadline - time.monotonic()))
            self.passed += 1

    def release_all(self) -> None:
        for e in (*self.arrived, *self.released):
            e.set()


class Sender(threading.Thread):
    """Sends `total` messages round-robin over the paths, `batch` per dialog per call, at most
    `window` awaiting their replies; malformed calls ride along."""

    def __init__(
        self,
        shop: Any,
        streams: dict[str, list[Stream]],
        total: int,
        batch: int,
        history: History,
        gates: Gates,
        malformed: Malformed,
        window: int,
        deadline: float,
    ) -> None:
        super().__init__(daemon=True, name="verify-sender")
        self.shop, self.streams, self.total, self.batch = shop, streams, total, batch
        self.history, self.gates, self.malformed = history, gates, malformed
        self.window, self.deadline = window, deadline
        self.allocated = 0
        self.retried_calls = 0
        self.error: str | None = None
        self.stop = threading.Event()

    def marks(self, paths: Sequence[str]) -> dict[str, int]:
        """Each workload stream of `paths` and its next position (sent after this moment)."""
        return {s.name: s.next for p in paths for s in self.streams.get(p, ())}

    def run(self) -> None:
        try:
            while self.allocated < self.total and not self.stop.is_set():
                for path in self.streams:
                    self.gates.pass_(self.allocated, self.deadline)
                    if not self.history.wait_outstanding_below(self.window, self.deadline):
                        raise TimeoutError("replies stopped coming (the window stayed full)")
                    batch = self._allocate(path)
                    if not batch:
                        break
                    self._send(batch)
        except Exception as exc:  # reported, and the run fails
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.gates.release_all()  # a fault waiting for the sender need not wait on

    def _allocate(self, path: str) -> list[tuple[Stream, int, list[bytes]]]:
        batch = []
        for s in self.streams[path]:
            n = min(self.batch, self.total - self.allocated)
            if n <= 0:
                break
            batch.append((s, s.next, [s.body(s.next + k) for k in range(n)]))
            s.next += n
            self.allocated += n
        return batch

    def _send(self, batch: list[tuple[Stream, int, list[bytes]]]) -> None:
        ops = [Send(s.handle, REQUEST, bodies) for s, _, bodies in batch]
        for kind in self.malformed.due(sum(len(b) for _, _, b in batch)):
            self.malformed.send(kind, batch[0][0].handle, ops, self.deadline)
        while True:
            try:
                self.shop.apply(ops)
                break
            except BrokerUnavailable:
                # The outcome is unknown: send again from each dialog's position; what the
                # first try sent is skipped (Send.at), so nothing goes twice.
                if time.monotonic() > self.deadline:
                    raise
                self.retried_calls += 1
                ops = [Send(s.handle, REQUEST, bodies, at=at) for s, at, bodies in batch]
        self.history.record_sent(
            Sent(make_id(s.name, at + k), s.name, at + k, s.conversation)
            for s, at, bodies in batch
            for k in range(len(bodies))
        )


class Collector(threading.Thread):
    """Receives replies at the shop and commits them; a reply is recorded only once its commit
    succeeded (a commit lost in a shop restart is rolled back, and the reply comes again)."""

    def __init__(self, shop: Any, history: History) -> None:
        super().__init__(daemon=True, name="verify-collector")
        self.shop, self.history = shop, history
        self.stop = threading.Event()
        self.rolled_back = 0  # replies received whose commit did not take
        self.error: str | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self._turn()
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"

    def _turn(self) -> None:
        try:
            groups = self.shop.receive(SHOP_QUEUE, max_groups=200, top=20_000, wait=0.5)
        except BrokerUnavailable:
            return
        if not groups:
            return
        replies: list[Reply] = []
        others: list[dict[str, Any]] = []
        for g in groups:
            for m in g.messages:
                if m.message_type == REPLY:
                    ident = json.loads(m.body)["id"]
                    replies.append(Reply(ident, m.conversation_id, m.sequence_number, 0.0))
                else:  # an Error or EndDialog: a dialog of the workload failed
                    others.append(
                        {
                            "conversation": m.conversation_id,
                            "message_type": m.message_type,
                            "body": m.body[:300].decode(errors="replace"),
                        }
                    )
        try:
            self.shop.commit(groups)
        except (LockNotHeld, BrokerUnavailable):
            self.rolled_back += len(replies)
            return
        now = time.monotonic()
        self.history.record_replies(Reply(r.id, r.conversation, r.sequence, now) for r in replies)
        for o in others:
            self.history.record_other(o)
