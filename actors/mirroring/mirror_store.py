"""A mirror's store, the backlog of shipped transactions it holds for it, and the drain that
applies them (`actors.mirroring.backlog`).

Plain asyncio, no Ray: `PartnerActor` (actors.remote.partner) opens one when it becomes a mirror
and checks who ships to it; this holds the ships in order and applies them. A ship is answered
once held (written to the backlog's file); what is held is applied on a thread, in batches, while
later ships go on being held; one that arrived before the ship it follows waits for it briefly;
one that finds the backlog full waits for it to be applied. A backlog that cannot be applied
leaves the mirror `failed` until a rebuild replaces the store: it answered for transactions its
store does not hold, so it must be neither shipped to nor promoted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from actors.mirroring import replay
from actors.mirroring.backlog import Backlog, recover
from actors.mirroring.capture import SEQ_KEY, Entry
from actors.store.database import Store

log = logging.getLogger("raybroker")

GAP_S = 2.0  # how long a ship that arrived before the one it follows waits for it


class MirrorStore:
    """The store at `path`, opened for a mirror named `holder`, with what its backlog's file held
    when its process stopped applied first."""

    def __init__(self, path: str, durability: str, holder: str) -> None:
        self.path, self.durability, self.holder = path, durability, holder
        self.failed: str | None = None  # why the backlog could not be applied (until rebuilt)
        self.applied_at: float | None = None  # when a ship was last applied
        self._draining: asyncio.Task | None = None  # the backlog applied on a thread
        self._received = asyncio.Event()  # a ship was held (a later one may go next)
        self._open()

    def _open(self) -> None:
        self.store = Store(self.path, self.durability, holder=self.holder)
        held = recover(self.path, self.store.db, replay.held_seq(self.store))
        self.backlog = Backlog(self.path, held, sync=self.durability == "full")
        self.closed = False

    async def hold(self, entries: Sequence[Entry], in_line: Callable[[], Awaitable[None]]) -> int:
        """Hold `entries` (answered once this returns, applied just after); the last transaction
        held. `in_line` raises if the caller may not ship here (any more): it is asked again
        after every wait."""
        await in_line()
        deadline = time.monotonic() + GAP_S
        while entries and self.backlog.received < entries[0].seq - 1:
            left = deadline - time.monotonic()
            if left <= 0:
                break  # the gap stays: the backlog refuses it, and the principal rebuilds
            self._received.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._received.wait(), left)
            await in_line()
        while self.backlog.full():  # this ship waits for it to be applied: it stays bounded
            self.drain_soon()
            await self.quiet()
            await in_line()
        held = self.backlog.accept(entries)
        self._received.set()
        self.drain_soon()
        return held

    def drain_soon(self) -> None:
        if self._draining is None:
            self._draining = asyncio.ensure_future(self._drain_on_thread())

    async def _drain_on_thread(self) -> None:
        """Apply the backlog until nothing waits, on a thread: ships go on being held and
        answered meanwhile (SQLite lets go of the GIL as it works). The store is not closed or
        replaced while this runs (`quiet` first)."""
        try:
            while not self.closed and not self.failed:
                backlog = self.backlog
                if wait := backlog.apply_wait(time.monotonic()):  # for more to apply with
                    await asyncio.sleep(wait)
                    continue
                entries = backlog.take()
                if not entries:
                    return
                try:
                    await asyncio.to_thread(backlog.apply, self.store.db, entries)
                except Exception as exc:
                    self._broken(exc)
                    return
                backlog.applied(entries)
                self.applied_at = time.time()
        finally:
            self._draining = None

    async def quiet(self) -> None:
        """Return once no drain runs on its thread (shielded: the thread cannot be stopped)."""
        while self._draining is not None:
            await asyncio.shield(self._draining)

    async def apply_all(self) -> None:
        """Everything held, in the store (unless the backlog failed: see `failed`)."""
        await self.quiet()
        if self.closed or self.failed:
            return
        try:
            self.backlog.drain(self.store.db)
        except Exception as exc:
            self._broken(exc)
            return
        self.applied_at = time.time()

    def _broken(self, exc: Exception) -> None:
        log.error("partner %s: its backlog could not be applied: %r", self.holder, exc)
        self.failed = repr(exc)[:500]

    def replace(self, data: bytes, seq: int) -> None:
        """The store replaced by a principal's snapshot at `seq` (`quiet` first): nothing held
        before it waits any more, and a failed backlog is forgotten."""
        self.backlog.reset(-1)  # the old line's: the snapshot replaces all it held
        self.close()
        replay.install(self.path, data)
        self._open()
        self.store.set_meta(SEQ_KEY, str(seq))
        self.backlog.reset(seq)
        self.failed, self.applied_at = None, time.time()

    def close(self) -> None:
        self.closed = True
        self.backlog.close()
        self.store.close()
