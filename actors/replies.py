"""A call that takes locks runs once per (client, number); its answer is kept until the client
shows it has it.

A receive's answer can be lost after the broker sent it: its direct channel (actors.channel)
ends with the answer on the wire, or still in a buffer on either side. The client then sends the
call again, through Ray or a new channel, with the same number (actors.ordering). Run again, that
receive would take other groups and leave the first ones locked by a client that never saw them,
until their lease ran out or the client's process ended. So the broker keeps the answer of each
call that may take locks (`LOCKING`) under the call's (client id, number), and an arrival of the
same call, however it comes, gets that answer instead of a second run. An arrival while the
first still runs waits for it.

An answer that took nothing is not kept (running the call again harms nothing). One that took
something goes when the client's floor passes its number (the client has it: see
`Issuer.order`), or after `KEEP_S` (the client has long since stopped sending the call again; its
floor may stay put that long while an earlier call of its waits). An answer the channel could
not send at all is given back by the broker (`BatchVerbs.undelivered`) unless another arrival of
the call has it (`lost`).

Plain Python on the broker's event loop, no Ray.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .envelope import NOTHING_RECEIVED
from .errors import BrokerError

# A kept answer whose client never showed it has it goes after this long: well past the time a
# channel takes to notice it is dead (actors.channel: about 11 s) and the call to go again.
KEEP_S = 60.0
LOCKING = frozenset({"receive", "wait_take", "get_conversation_group"})  # and batches of them


def took(answer: Any) -> bool:
    """Whether a lock-taking call's answer holds anything taken (one that took nothing can run
    again harmlessly: it is not kept)."""
    if isinstance(answer, bytes):  # a receive's packed groups
        return answer != NOTHING_RECEIVED
    if isinstance(answer, list):  # a batch's or wait_take's outcomes
        return any(ok and took(value) for ok, value in answer)
    return answer is not None  # get_conversation_group: (group id, lock id) or None


def takes_locks(method: str, args: tuple[Any, ...]) -> bool:
    """Whether a call of `method` with `args` (as `call` / `calls` get them) may take locks."""
    if method == "calls":
        batch = args[0] if args else None
        return isinstance(batch, list | tuple) and any(
            isinstance(e, list | tuple) and e and e[0] == "receive" for e in batch
        )
    return method in LOCKING


class _Kept:
    __slots__ = ("future", "at", "arrivals")

    def __init__(self, future: asyncio.Future, at: float) -> None:
        self.future = future
        self.at = at
        self.arrivals = 1  # arrivals of the call that have (or will have) this answer


class _Client:
    __slots__ = ("kept", "floor", "seen")

    def __init__(self, now: float) -> None:
        self.kept: dict[int, _Kept] = {}  # number -> its answer
        self.floor = 0  # the highest floor seen: the client has every answer below it
        self.seen = now


class Replies:
    """The kept answers of one broker's lock-taking calls, by client and number."""

    def __init__(self, keep_s: float = KEEP_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.keep_s, self.clock = keep_s, clock
        self._clients: dict[str, _Client] = {}
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
        kept = c.kept.get(seq)
        if kept is not None:
            kept.arrivals += 1
            await asyncio.wait([kept.future])  # the first arrival's outcome, not raised here
            if not kept.future.cancelled():
                error = kept.future.exception()
                if error is None:
                    self.repeats += 1
                    return kept.future.result()
                if isinstance(error, BrokerError):
                    raise error  # refused: it took nothing, and is refused again
            # the first arrival ended without an answer (cancelled, a fault): this one runs
            if c.kept.get(seq) is kept:
                del c.kept[seq]
        kept = c.kept[seq] = _Kept(asyncio.get_running_loop().create_future(), now)
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
        if not took(answer) and c.kept.get(seq) is kept:
            del c.kept[seq]  # nothing to keep: run again, it takes what there is then
        return answer

    def passed(self, client: str, floor: int) -> None:
        """Client `client` has the answers of its calls below `floor`: forget them."""
        c = self._clients.get(client)
        if c is not None and floor > c.floor:
            c.floor = floor
            for seq in [s for s in c.kept if s < floor]:
                del c.kept[seq]

    def lost(self, order: Any) -> bool:
        """An arrival of call `order` could not deliver its answer. True when no other arrival
        has it, nor will (the answer is forgotten, and what it took may be given back); False
        when another has, or the client's floor shows it has the answer."""
        try:
            client, seq, _floor = order
            c = self._clients.get(client)
        except (TypeError, ValueError):
            return True
        if c is None:
            return True
        if seq < c.floor:
            return False
        kept = c.kept.get(seq)
        if kept is None:
            return True
        kept.arrivals -= 1
        if kept.arrivals > 0:
            return False
        del c.kept[seq]
        return True

    def _sweep(self, now: float) -> None:
        self._sweep_at = now + self.keep_s / 10
        old = now - self.keep_s
        for client, c in list(self._clients.items()):
            for seq in [s for s, k in c.kept.items() if k.at < old and k.future.done()]:
                del c.kept[seq]
            if not c.kept and c.seen < old:
                del self._clients[client]
