"""A call that takes locks runs once per (client, number); its answer is kept until the client
shows it has it.

A receive's answer can be lost after the broker sent it: its direct channel (actors.client.channel)
ends with the answer on the wire, or still in a buffer on either side. The client then sends the
call again, through Ray or a new channel, with the same number (actors.calls.ordering). Run again,
that receive would take other groups and leave the first ones locked by a client that never saw
them, until their lease ran out or the client's process ended (and a receive under a lock the client
holds would read on past what the lost answer carried). So the broker keeps the answer of each
call that may take locks (`LOCKING`) under the call's (client id, number), and an arrival of the
same call, however it comes, gets that answer instead of a second run. An arrival while the
first still runs waits for it; one whose number the client's floor has passed is refused (the
client has that answer: nobody waits for this one).

An answer that took nothing is not kept (running the call again harms nothing). One that took
something goes when the client's floor passes its number (the client has it: see
`Issuer.order`), `KEEP_S` after it was answered (the client sends a call again at once when its
channel breaks, and a dead channel is noticed within about 11 s), or when the kept answers
exceed `KEEP_BYTES` (the oldest first: those calls lose only this protection). An answer the
channel could not send at all is given back by the broker (`BatchVerbs.undelivered`) unless
another arrival of the call has it (`lost`).

Plain Python on the broker's event loop, no Ray.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from actors.calls.envelope import NOTHING_RECEIVED
from actors.errors import BrokerError, InvalidArgument

# Kept this long after it was answered: past the ~11 s a channel takes to notice it is dead,
# and under the default 30 s lease (an answer kept past its locks' lease would name locks gone).
KEEP_S = 20.0
# At most this much of answers kept, over all clients. Measured on bulk receives (`raybroker
# bench peers`, bulk-spread): 64 MiB kept cost about 13% of the rate, 8 MiB about 5%.
KEEP_BYTES = 8 << 20
LOCKING = frozenset({"receive", "wait_take", "get_conversation_group"})  # and batches of them


def took(answer: Any) -> bool:
    """Whether a lock-taking call's answer holds anything taken (one that took nothing can run
    again harmlessly: it is not kept)."""
    if isinstance(answer, bytes):  # a receive's packed groups
        return answer != NOTHING_RECEIVED
    if isinstance(answer, list):  # a batch's or wait_take's outcomes
        return any(ok and took(value) for ok, value in answer)
    # get_conversation_group's (group id, lock id); not None (it found nothing), nor an
    # apply's or a settle's result in a batch (a dict: their request ids make them apply once)
    return isinstance(answer, tuple)


def _size(answer: Any) -> int:
    if isinstance(answer, bytes):
        return len(answer)
    if isinstance(answer, list):
        return sum(_size(value) for ok, value in answer if ok)
    return 100


def takes_locks(method: str, args: tuple[Any, ...]) -> bool:
    """Whether a call of `method` with `args` (as `call` / `calls` get them) may take locks."""
    if method == "calls":
        batch = args[0] if args else None
        return isinstance(batch, (list, tuple)) and any(
            isinstance(e, (list, tuple)) and e and e[0] == "receive" for e in batch
        )
    return method in LOCKING


class _Kept:
    __slots__ = ("future", "at", "arrivals", "size")

    def __init__(self, future: asyncio.Future) -> None:
        self.future = future
        self.at = 0.0  # when it was answered
        self.arrivals = 1  # arrivals of the call that have (or wait for) this answer
        self.size = 0


class _Client:
    __slots__ = ("kept", "floor", "seen")

    def __init__(self, now: float) -> None:
        self.kept: dict[int, _Kept] = {}  # number -> its answer (or the run that makes it)
        self.floor = 0  # the highest floor seen: the client has every answer below it
        self.seen = now


class Replies:
    """The kept answers of one broker's lock-taking calls, by client and number."""

    def __init__(
        self,
        keep_s: float = KEEP_S,
        keep_bytes: int = KEEP_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.keep_s, self.keep_bytes, self.clock = keep_s, keep_bytes, clock
        self._clients: dict[str, _Client] = {}
        self._answered: OrderedDict[tuple[str, int], _Kept] = OrderedDict()  # oldest first
        self._bytes = 0
        self._sweep_at = 0.0
        self.repeats = 0  # arrivals answered with a kept answer (for tests and the metrics)

    def __len__(self) -> int:
        return sum(len(c.kept) for c in self._clients.values())

    async def once(self, order: tuple[str, int, int], run: Callable[[], Awaitable[Any]]) -> Any:
        """`run()`'s answer, run once for call `order` (a checked order): a later arrival of
        the same call gets the first one's answer, waiting for it if it is still running."""
        client, seq, _floor = order
        now = self.clock()
        if now >= self._sweep_at:
            self._sweep(now)
        c = self._clients.get(client)
        if c is None:
            c = self._clients[client] = _Client(now)
        c.seen = now
        while (kept := c.kept.get(seq)) is not None:
            kept.arrivals += 1
            try:
                await asyncio.wait([kept.future])  # its outcome, not raised here
            except asyncio.CancelledError:
                kept.arrivals -= 1  # this arrival will not carry the answer
                raise
            if not kept.future.cancelled():
                error = kept.future.exception()
                if error is None:
                    self.repeats += 1
                    return kept.future.result()
                if isinstance(error, BrokerError):
                    raise error  # refused: it took nothing, and is refused again
            # that run ended without an answer (cancelled, a fault): run it, unless another
            # arrival woken with this one already does (then wait for that run)
        if seq < c.floor:
            raise InvalidArgument(
                f"call {seq} of client {client} was answered already; it is not run again"
            )
        kept = c.kept[seq] = _Kept(asyncio.get_running_loop().create_future())
        try:
            answer = await run()
        except BaseException as exc:
            if c.kept.get(seq) is kept:
                del c.kept[seq]  # no answer to keep: an arrival after this runs afresh
            if isinstance(exc, Exception):
                kept.future.set_exception(exc)
                kept.future.exception()  # retrieved: asyncio need not warn of it
            else:
                kept.future.cancel()
            raise
        kept.future.set_result(answer)
        if c.kept.get(seq) is kept:
            if took(answer):
                self._keep(client, seq, kept, answer)
            else:
                del c.kept[seq]  # nothing to keep: run again, it takes what there is then
        return answer

    def _keep(self, client: str, seq: int, kept: _Kept, answer: Any) -> None:
        kept.at, kept.size = self.clock(), _size(answer)
        self._answered[(client, seq)] = kept
        self._bytes += kept.size
        while self._bytes > self.keep_bytes and self._answered:
            (old_client, old_seq), old = next(iter(self._answered.items()))
            self._forget(old_client, old_seq, old)

    def _forget(self, client: str, seq: int, kept: _Kept) -> None:
        """Drop a finished kept answer (from both indexes)."""
        c = self._clients.get(client)
        if c is not None and c.kept.get(seq) is kept:
            del c.kept[seq]
        if self._answered.pop((client, seq), None) is not None:
            self._bytes -= kept.size

    def passed(self, client: str, floor: int) -> None:
        """Client `client` has the answers of its calls below `floor`: forget them (not those
        still running: a caller that stopped waiting moves the floor on too, and what such a run
        takes is given back if its answer cannot be sent)."""
        c = self._clients.get(client)
        if c is None or floor <= c.floor:
            return
        c.floor = floor
        below = []
        for seq, kept in c.kept.items():  # in number order, near enough: calls start in order
            if seq >= floor:
                break  # (one kept out of order stays until KEEP_S)
            if kept.future.done():
                below.append((seq, kept))
        for seq, kept in below:
            self._forget(client, seq, kept)

    def lost(self, order: Any) -> bool:
        """An arrival of call `order` could not deliver its answer. True when no other arrival
        has it, nor will (the answer is forgotten, and what it took may be given back); False
        when another has, or the client's floor shows it has the answer."""
        try:
            client, seq, _floor = order
            c = self._clients.get(client)
        except (TypeError, ValueError):
            return True
        kept = c.kept.get(seq) if c is not None else None
        if kept is None:
            return c is None or seq >= c.floor
        kept.arrivals -= 1
        if kept.arrivals > 0:
            return False
        self._forget(client, seq, kept)
        return True

    def _sweep(self, now: float) -> None:
        self._sweep_at = now + self.keep_s / 10
        old = now - self.keep_s
        while self._answered:
            (client, seq), kept = next(iter(self._answered.items()))
            if kept.at >= old:
                break
            self._forget(client, seq, kept)
        for client in [k for k, c in self._clients.items() if not c.kept and c.seen < old]:
            del self._clients[client]
