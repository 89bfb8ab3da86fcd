"""Calls from one client are applied in the order the client issued them, with several in flight.

Ray does not promise that an async actor starts one caller's calls in the order they were
submitted (a call whose arguments come through the object store can overtake an earlier one), so
a producer pipelining sends on one conversation would see them applied out of order. The client
and the broker therefore keep a per-client sequence, as Kafka's idempotent producer does:

- The client handle (`Issuer`) has a random id (a new one in a forked child) and numbers every
  call 0, 1, 2, ... as it issues it. With each call it sends its `floor`: the lowest number
  among its calls not yet answered (this one included), so the broker knows every call below it
  is done.
- The broker (`Sequencer`) starts call n of a client once call n-1 has started. On one event loop
  a call runs alone until it first waits, and apply, settle and receive's settle-and-take make
  their change before any wait, so starting in order is applying in order. A call that waits
  (a receive with `wait`) does not hold back the calls after it.
- A call numbered below the next expected one starts at once: a retry of a call that already
  started (its request id makes it apply once) or a call the broker stopped waiting for.
- A client the broker does not know (new, forgotten after `idle_s` without calls, or a broker
  restart that lost its memory) starts at its `floor`. A larger `floor` than the broker expects
  also moves it on: those calls were answered (by an earlier incarnation).
- A call waits at most `gap_s` for a missing predecessor (lost before it reached the broker).
  Then the broker gives up on the missing numbers below the lowest waiting call and goes on.
- A call the client stops waiting for (cancelled) stays unanswered until the broker answers it,
  so the floor never passes a call that may still start.

Plain Python, no Ray: `Issuer` is thread-safe (a sync handle may be shared by threads);
`Sequencer` runs on the broker's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable

from actors.errors import InvalidArgument

log = logging.getLogger("raybroker")

GAP_S = 5.0  # how long a call waits for a missing predecessor before the broker gives up on it
IDLE_S = 600.0  # a client with no calls for this long is forgotten (its next call starts afresh)

Order = tuple[str, int, int]  # (client id, sequence number, floor) sent with every call
# A change's request id: the caller's own string, or, for a call that carries none, its place in
# its client's order (`call_key`). A retry comes with the same order, so it finds what the first
# arrival recorded, and the calls of one numbered client call (a coalesced batch of a hundred)
# are recorded in one row (actors.store.database) rather than a row each.


class CallKey(tuple):
    """(client id, number, index in its batch; -1: a call alone). A type of its own: one made
    here, never one a client sent (a wire tuple is refused as a request id)."""

    __slots__ = ()


RequestId = str | CallKey


class Issuer:
    """The client's half: numbers calls and knows which are still unanswered."""

    def __init__(self) -> None:
        self.client = os.urandom(8).hex()
        self._next = 0
        self._open: dict[int, None] = {}  # unanswered numbers, in issue order (so first = lowest)
        self._lock = threading.Lock()
        _issuers.add(self)

    def issue(self) -> int:
        """A number for a new call; it is unanswered until `answered`."""
        with self._lock:
            seq = self._next
            self._next += 1
            self._open[seq] = None
            return seq

    def order(self, seq: int) -> Order:
        """What to send with call `seq` (again on each retry: the floor may have moved on)."""
        with self._lock:
            return self.client, seq, next(iter(self._open), seq)

    def answered(self, seq: int) -> None:
        with self._lock:
            self._open.pop(seq, None)

    def forked(self) -> None:
        """In a child forked from the process that made this issuer: a client of its own. Two
        processes with one id would take each other's calls for retries (actors.service.replies
        would even hand one the other's received messages); the parent's calls in flight are not
        this process's to wait for."""
        self._lock = threading.Lock()  # the parent's may have been held at the fork
        self.client = os.urandom(8).hex()
        self._open = {}


_issuers: weakref.WeakSet[Issuer] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for issuer in list(_issuers):
        issuer.forked()


os.register_at_fork(after_in_child=_after_fork_in_child)


def check_order(order: object) -> Order:
    """A call's (client id, number, floor), as `Issuer.order` makes it; anything else is refused
    before it can touch another client's order."""
    if isinstance(order, (tuple, list)) and len(order) == 3:
        client, seq, floor = order
        if (
            type(client) is str
            and 0 < len(client) <= 64
            and type(seq) is int
            and type(floor) is int
            and 0 <= floor <= seq
        ):
            return client, seq, floor
    raise InvalidArgument(
        f"a call's order must be (client id of 1-64 characters, number, floor) with "
        f"0 <= floor <= number, not {order!r}; send calls through a Broker handle"
    )


def call_key(order: Order, index: int) -> CallKey:
    """The request id of the `index`th call of client call `order` (-1: a call alone), for a
    change whose caller gave none."""
    return CallKey((order[0], order[1], index))


class _Client:
    __slots__ = ("next", "seen", "waiting")

    def __init__(self, start: int, now: float) -> None:
        self.next = start  # the number that may start next
        self.seen = now
        self.waiting: dict[int, asyncio.Future[None]] = {}  # number -> released at its turn


class Sequencer:
    """The broker's half: `await turn(order)` returns when that call may start, in order."""

    def __init__(
        self,
        gap_s: float = GAP_S,
        idle_s: float = IDLE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.gap_s, self.idle_s, self.clock = gap_s, idle_s, clock
        self._clients: dict[str, _Client] = {}
        self._sweep_at = 0.0
        self.skipped = 0  # numbers given up on after gap_s

    def admit(self, client: str, seq: int, floor: int) -> bool:
        """Whether call `seq` may start now; if so it has started (the fast path: no await)."""
        now = self.clock()
        c = self._clients.get(client)
        if c is None:
            if now >= self._sweep_at:
                self._sweep(now)
            c = self._clients[client] = _Client(floor, now)
        c.seen = now
        if floor > c.next:
            self._move(c, floor)
        if seq < c.next:
            return True  # late: a retry of a started call, or one given up on
        if seq == c.next:  # (the number expected next is never waiting: it is released)
            self._started(c, seq)
            return True
        return False

    async def turn(self, order: Order) -> None:
        """Wait until call `order` may start (at most `gap_s` per missing predecessor)."""
        client, seq, floor = check_order(order)
        if self.admit(client, seq, floor):
            return
        c = self._clients[client]
        fut = c.waiting.get(seq)
        if fut is None:  # a duplicate (a retry while the first is waiting) shares its turn
            fut = c.waiting[seq] = asyncio.get_running_loop().create_future()
        try:
            while not fut.done():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(fut), self.gap_s)
                if fut.done():
                    break
                if c.waiting.get(seq) is not fut:
                    break  # no longer waited for (a duplicate of it was cancelled): go ahead
                self._give_up(c)
        except asyncio.CancelledError:
            if fut.done():
                self._started(c, seq)  # it was its turn: pass the turn on
            elif c.waiting.get(seq) is fut:
                del c.waiting[seq]
            raise
        self._started(c, seq)

    def _started(self, c: _Client, seq: int) -> None:
        if seq == c.next:
            c.next = seq + 1
            self._release(c, c.next)

    def _release(self, c: _Client, seq: int) -> None:
        fut = c.waiting.pop(seq, None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    def _move(self, c: _Client, start: int) -> None:
        """Calls below `start` are done or given up: release the waiting ones (in number order,
        so they still start in order) and expect `start` next."""
        c.next = start
        for seq in sorted(s for s in c.waiting if s <= start):
            self._release(c, seq)

    def _give_up(self, c: _Client) -> None:
        low = min(c.waiting)
        if low > c.next:
            log.warning(
                "calls %d-%d of a client did not come within %ss; its later calls go on",
                c.next,
                low - 1,
                self.gap_s,
            )
            self.skipped += low - c.next
            self._move(c, low)

    def _sweep(self, now: float) -> None:
        self._sweep_at = now + self.idle_s
        old = now - self.idle_s
        for client in [k for k, c in self._clients.items() if c.seen < old and not c.waiting]:
            del self._clients[client]

    def clients(self) -> int:
        """How many clients the broker remembers."""
        return len(self._clients)
