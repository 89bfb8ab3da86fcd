"""Calls between a mirrored broker's partners: the principal's `MirrorLink` to its mirror, and
`unwrap`, which turns an actor call's failure into raybroker's errors (a partner's or the
witness's own error as itself; anything that kept the call from being answered as
`PeerUnreachable`).

Ships go over a direct channel to the mirror (actors.client.channel, as a client's calls to a
broker) when one is open, else through Ray. A ship is a group commit's worth of the store's
writes, most often more than the 100 KB Ray passes inline, and larger arguments go through the
object store: 5-6 ms a round trip on an idle machine and ~13 ms under load, against 0.2-0.5 ms
on the channel, and every commit's caller waits for that round trip. A ship whose channel
breaks goes again through Ray (the mirror skips what it already holds)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

import ray

from actors.client.channel import Channel, ChannelBroken, ChannelSlot
from actors.errors import BrokerError, PeerUnreachable
from actors.mirroring.capture import Entry
from actors.mirroring.pairkey import PairKey

APPLY_S = 3.0  # a ship: a batch of transactions applied in one SQLite transaction (a mirror
# slower than this is taken for lost: the principal goes on alone, fenced by the witness)
REBUILD_S = 120.0  # a whole store copied
SHIP = "ship"  # a ship's method on the channel: the mirror's `apply` (not a client's verb)
SHIP_BYTES = 256 << 20  # the most a ship over the channel may carry (larger ones: through Ray)


async def unwrap(ref: Any, timeout: float = 10.0, who: str = "the witness") -> Any:
    try:
        return await asyncio.wait_for(ref, timeout)
    except TimeoutError:
        raise PeerUnreachable.no_answer(who, timeout) from None
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, BrokerError):
            raise cause.with_traceback(None) from None
        raise PeerUnreachable.failed(who) from None
    except ray.exceptions.RayError:
        raise PeerUnreachable.stopped(who) from None


def _settle(out: asyncio.Future, done: asyncio.Future) -> None:
    """`out` answered as `done` was."""
    if done.cancelled():
        out.cancel()
    elif done.exception() is not None:
        out.set_exception(done.exception())  # type: ignore[arg-type]
    else:
        out.set_result(done.result())


class RayLink:
    """The principal's calls to the mirror partner `mirror` (see `actors.mirroring.shipper`)."""

    def __init__(
        self, mirror: str, namespace: str, broker_id: str, caller: str, key: PairKey
    ) -> None:
        self.mirror, self.namespace, self.broker_id = mirror, namespace, broker_id
        self.caller, self.key = caller, key  # who this principal is, and its start's key
        # this principal's incarnation: a mirror rebuilt by an earlier one (before a restart of
        # this partner's process) is rebuilt again, since writes made while the broker opened
        # its store were never shipped
        self.line = os.urandom(8).hex()
        # opened on the first ship, reopened after it breaks (calls go through Ray meanwhile)
        self._channel = ChannelSlot(self._open_channel, None)

    async def _open_channel(self) -> tuple[str, int, str] | None:
        ref = self._handle().open_channel.remote([None])
        return await unwrap(ref, APPLY_S, self.mirror)

    @property
    def ships_travel(self) -> str:
        """How ships go to the mirror now (for the status)."""
        return "direct channel" if self._channel.get() is not None else "through Ray"

    def _handle(self) -> Any:
        try:
            return ray.get_actor(self.mirror, namespace=self.namespace)
        except ValueError:
            raise PeerUnreachable.not_running(self.mirror) from None

    def _proved(self, method: str) -> tuple[str, bytes]:
        return self.caller, self.key.prove(self.caller, method)

    async def held(self, epoch: int) -> int:
        ref = self._handle().held.remote(*self._proved("held"), epoch, self.line)
        return await unwrap(ref, APPLY_S, self.mirror)

    async def apply(self, epoch: int, entries: list[Entry]) -> int:
        return await self.ship(epoch, entries)

    def ship(self, epoch: int, entries: list[Entry]) -> asyncio.Future[int]:
        """The ship on its way (written to the channel before this returns, when one is open);
        the future is its answer, set as soon as the answer comes, not a step later."""
        args = (*self._proved("apply"), epoch, self.line, entries)
        channel = self._channel.get()
        if channel is not None:
            with contextlib.suppress(ChannelBroken):
                return self._answered(channel, channel.send(None, SHIP, args), args)
        return asyncio.ensure_future(self._through_ray(args))

    def _answered(self, channel: Channel, answer: asyncio.Future, args: tuple) -> asyncio.Future:
        """`answer`, or `PeerUnreachable` if it does not come within APPLY_S; a ship whose
        channel broke goes again through Ray (the mirror skips what it already holds)."""
        loop = asyncio.get_running_loop()
        out: asyncio.Future[int] = loop.create_future()

        def late() -> None:
            if not out.done():
                out.set_exception(PeerUnreachable.no_answer(self.mirror, APPLY_S))
                channel.close("a ship was not answered in time")

        timer = loop.call_later(APPLY_S, late)

        def came(done: asyncio.Future) -> None:
            timer.cancel()
            if out.done():
                return
            failure = None if done.cancelled() else done.exception()
            if isinstance(failure, ChannelBroken) or done.cancelled():
                again = asyncio.ensure_future(self._through_ray(args))
                again.add_done_callback(lambda r: out.done() or _settle(out, r))
            else:
                _settle(out, done)

        answer.add_done_callback(came)
        return out

    async def _through_ray(self, args: tuple) -> int:
        return await unwrap(self._handle().apply.remote(*args), APPLY_S, self.mirror)

    def close(self) -> None:
        self._channel.close()

    async def rebuild(self, epoch: int, seq: int, parts: list[bytes]) -> int:
        proved = self._proved("rebuild")
        ref = self._handle().rebuild.remote(*proved, epoch, self.line, seq, parts, self.broker_id)
        return await unwrap(ref, REBUILD_S, self.mirror)
