"""The principal's shipper: the captured log goes to the mirror in batches, and callers wait for it.

One ship at a time, in order, carrying every transaction committed since the last one (a group
commit's worth, or more while a ship was in flight): batched like everything else, never one
call per message. A caller is answered once `settled` says so:

- **synchronized**: the mirror has applied the caller's transaction ("safety full");
- **exposed**: the mirror cannot be reached, and the witness has recorded that the principal runs
  alone (`fence(False)`), so no failover can lose what is answered now;
- **stale**: the witness has moved on (`StaleEpoch`): this partner is no longer principal, and the
  caller hears `NotPrincipal` (its transaction is discarded when this partner rejoins as mirror;
  the client retries on the new principal with the same request id).

A mirror that cannot take the next entries (it is new, restarted, or missed some) is rebuilt from
a snapshot; the entries committed while the snapshot travels follow it. Plain asyncio, no Ray: the
mirror is reached through a `MirrorLink`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from actors.errors import BrokerError, MirrorBehind, NotPrincipal, StaleEpoch
from actors.mirroring.capture import Capture, Entry
from actors.mirroring.replay import chunks

log = logging.getLogger("raybroker")

SHIP_MOST = 4096  # entries per ship
IN_FLIGHT = 4  # ships under way at once (each commit ships as it commits, so more go at once)
RETRY_S = 0.5  # how long an unreachable mirror is left before it is tried again (doubling)
RETRY_MAX_S = 5.0


class MirrorLink(Protocol):
    """The principal's calls to its mirror (Ray's actor calls, or in-process for tests). Any
    failure to reach it raises `PeerUnreachable`."""

    async def held(self, epoch: int) -> int:
        """The last entry the mirror holds in this principal's line, or -1: rebuild it."""
        ...

    async def apply(self, epoch: int, entries: list[Entry]) -> int: ...

    def ship(self, epoch: int, entries: list[Entry]) -> Awaitable[int]:
        """`apply`, started at once: over a direct channel, the entries are on their way when
        this returns; the awaitable (best a future, whose answer is taken as it comes) is the
        mirror's answer."""
        ...

    async def rebuild(self, epoch: int, seq: int, parts: list[bytes]) -> int: ...

    def close(self) -> None:
        """Let go of any connection to the mirror (this principal stops shipping)."""
        ...


class Shipper:
    def __init__(
        self,
        name: str,
        capture: Capture,
        epoch: int,
        link: MirrorLink,
        fence: Callable[[bool], Awaitable[None]],
        snapshot: Callable[[], bytes],
        on_event: Callable[[str, str], None] | None = None,
        fenced: bool = False,
    ) -> None:
        """`fenced`: the witness already records that the mirror is not synchronized (as after a
        promotion, when the mirror is the lost old principal): callers need not wait for it."""
        self.name, self.capture, self.epoch, self.link = name, capture, epoch, link
        self.fence, self.snapshot, self.on_event = fence, snapshot, on_event
        self.state = "exposed"  # until the mirror is found in step
        self.fenced = fenced  # the witness knows this principal runs alone
        self.acked = -1  # the last entry the mirror holds (-1: not known to be in step)
        self.rebuilds = 0
        self.failures = 0  # tries in a row that did not reach or rebuild the mirror
        self.ships = 0
        self.reason = "not yet in touch with the mirror"
        # callers waiting: (the transaction they wait for, a ticket, their future), soonest
        # first, so a landed ship wakes just the callers it covers
        self._waiting: list[tuple[int, int, asyncio.Future]] = []
        self._tickets = itertools.count()
        self._work = asyncio.Event()
        capture.on_commit = self._committed
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._flying: collections.deque[asyncio.Future] = collections.deque()  # ships under way
        self._sent = -1  # the last entry sent (acknowledged or not)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop shipping; callers still waiting hear `NotPrincipal` (this partner steps down)."""
        if self._task is not None:
            # the flag as well: Python 3.11's wait_for can swallow a cancel that comes as the
            # awaited event fires, and the loop would go on (and this wait for it) forever
            self._stopping = True
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.link.close()
        self._set("stale", "stopped: this partner is no longer principal")

    # --- callers ---------------------------------------------------------------------------------

    async def settled(self, seq: int) -> None:
        """Return once a caller whose transactions end at `seq` may be answered (see above)."""
        while True:
            if self.state == "stale":
                raise NotPrincipal(self.name, None, self.epoch)
            if self.acked >= seq or (self.state == "exposed" and self.fenced):
                return
            waiter = asyncio.get_running_loop().create_future()
            heapq.heappush(self._waiting, (seq, next(self._tickets), waiter))
            await waiter

    def lag(self) -> dict[str, Any]:
        """The mirror's lag behind this principal: transactions, and seconds since the oldest
        transaction it lacks committed."""
        behind = max(0, self.capture.seq - max(self.acked, 0)) if self.acked >= 0 else None
        oldest = self.capture.pending[0].at if self.capture.pending else None
        seconds = 0.0 if oldest is None or not behind else max(0.0, time.time() - oldest)
        return {
            "state": self.state,
            "lag_transactions": behind,
            "lag_s": seconds if behind is not None else None,
            "acked": self.acked,
            "seq": self.capture.seq,
            "rebuilds": self.rebuilds,
            "ships": self.ships,
            "reason": self.reason,
        }

    def _set(self, state: str, reason: str = "") -> None:
        if state != self.state and self.on_event is not None:
            self.on_event(f"Mirror{state.capitalize()}", reason or state)
        self.state, self.reason = state, reason
        self._wake(None)

    def _wake(self, through: int | None) -> None:
        """Wake the callers waiting for transactions up to `through` (None: all, to look again
        at a changed state)."""
        waiting = self._waiting
        while waiting and (through is None or waiting[0][0] <= through):
            waiter = heapq.heappop(waiting)[2]
            if not waiter.done():  # (a caller that stopped waiting)
                waiter.set_result(None)

    # --- the loop --------------------------------------------------------------------------------

    async def _run(self) -> None:
        while self.state != "stale" and not self._stopping:
            try:
                try:
                    if self.acked < 0:
                        await self._catch_up()
                    else:
                        await self._ship()
                except (StaleEpoch, asyncio.CancelledError):
                    raise
                except Exception as exc:  # unreachable, refused, behind: run alone meanwhile
                    await self._expose(exc)
                    if not isinstance(exc, MirrorBehind):
                        # backing off: a mirror refusing a rebuild must not cost a snapshot
                        # of the store every half second
                        await asyncio.sleep(min(RETRY_S * 2**self.failures, RETRY_MAX_S))
                        self.failures += 1
                else:
                    self.failures = 0
            except StaleEpoch as exc:
                self._set("stale", str(exc))
                return

    def _in_step(self) -> bool:
        return self.acked >= 0 and self.state != "stale" and self._task is not None

    def _committed(self) -> None:
        """A transaction committed: ship it now, in the commit's own step, when the mirror is in
        step and a ship may go. Left to the loop below, it would go once the event loop got to
        it, behind whatever else was ready (1-3 ms under load, which every caller waited)."""
        self._work.set()
        if self._in_step():
            try:
                self._launch()
            except Exception:  # the loop below sends it
                log.exception("mirror of %s: a ship could not be started", self.name)

    def _launch(self) -> None:
        """Start ships of what committed and was not sent yet, up to `IN_FLIGHT` under way (none
        behind one that failed: the loop below acts on it first)."""
        while len(self._flying) < IN_FLIGHT and self._failed_head() is None:
            entries = [e for e in self.capture.take(SHIP_MOST * IN_FLIGHT) if e.seq > self._sent]
            if not entries:
                return
            entries = entries[:SHIP_MOST]
            self._sent = entries[-1].seq
            ship = asyncio.ensure_future(self.link.ship(self.epoch, entries))
            ship.add_done_callback(self._landed)
            self._flying.append(ship)

    def _landed(self, _: asyncio.Future) -> None:
        """Ships answered, oldest first, move `acked` on as their answers come (each step the
        answer waited for the loop below to run again was a step every caller waited too), and
        wake the callers they cover; a ship that failed is left first in line for the loop
        below to act on."""
        landed = False
        while self._flying and self._flying[0].done():
            if self._failed_head() is not None:
                self._work.set()
                break
            first = self._flying.popleft()
            self.acked = max(self.acked, first.result())
            self.ships += 1
            landed = True
        if landed:
            self.capture.drop_through(self.acked)
            self._wake(self.acked)
            if self._in_step():
                self._launch()

    async def _ship(self) -> None:
        """Keep up to `IN_FLIGHT` ships under way (the mirror applies them in order, and
        `_landed` takes their answers), so a commit waits for one ship's round trip, not for the
        ones before it as well; a ship that failed ends this (the caller exposes or rebuilds)."""
        self._raise_failed()
        self._launch()
        self._work.clear()
        if not self._flying:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._work.wait(), 1.0)
            return
        more = asyncio.ensure_future(self._work.wait())
        await asyncio.wait([self._flying[0], more], return_when=asyncio.FIRST_COMPLETED)
        more.cancel()
        self._raise_failed()

    def _failed_head(self) -> asyncio.Future | None:
        """The first ship under way, if it failed (one answered is taken by `_landed`)."""
        first = self._flying[0] if self._flying else None
        if first is None or not first.done():
            return None
        return first if first.cancelled() or first.exception() is not None else None

    def _raise_failed(self) -> None:
        """The first ship under way failed: drop them all, and raise why."""
        first = self._failed_head()
        if first is not None:
            failure = None if first.cancelled() else first.exception()
            self._drop_flying()
            raise failure or RuntimeError("a ship to the mirror was cancelled")

    def _drop_flying(self) -> None:
        for f in self._flying:
            f.cancel()
        self._flying.clear()
        self._sent = -1

    async def _catch_up(self) -> None:
        """Find where the mirror is; ship what it lacks, or rebuild it; then say synchronized."""
        held = await self.link.held(self.epoch)
        pending = self.capture.pending
        gap = pending[0].seq > held + 1 if pending else held != self.capture.seq
        if held < 0 or held > self.capture.seq or gap:
            held = await self._rebuild()
        self.capture.drop_through(held)
        while self.capture.pending:  # what committed meanwhile (callers already answered)
            held = await self.link.apply(self.epoch, self.capture.take(SHIP_MOST))
            self.capture.drop_through(held)
        # in step: from here every caller waits for the mirror; then the witness may fail over
        self.acked, self.fenced, self._sent = held, False, held
        self._set("synchronized", "the mirror holds every committed transaction")
        await self.fence(True)

    async def _rebuild(self) -> int:
        self.rebuilds += 1
        seq, data = self.capture.seq, self.snapshot()  # one event-loop step: consistent
        self.capture.drop_through(seq)
        return await self.link.rebuild(self.epoch, seq, chunks(data))

    async def _expose(self, exc: Exception) -> None:
        """The mirror cannot take the log: run alone, once the witness has recorded it."""
        why = str(exc) if isinstance(exc, BrokerError) else repr(exc)
        self.acked = -1  # found and caught up (or rebuilt) next time
        self._drop_flying()
        if isinstance(exc, MirrorBehind):
            return  # it answers: rebuilt at once, callers wait meanwhile
        self.capture.pending.clear()  # the next catch-up rebuilds from a snapshot
        while not self.fenced:
            try:
                await self.fence(False)
                self.fenced = True
            except StaleEpoch:
                raise
            except Exception as fault:  # the witness is unreachable: nobody may be answered
                log.warning("mirror of %s: cannot tell the witness: %s", self.name, fault)
                await asyncio.sleep(RETRY_S)
        self._set("exposed", why)
