"""The direct channel: a process's calls to a broker over one TCP connection, beside Ray.

An actor call through Ray costs about a millisecond of the broker's CPU and 1-3 ms of round trip
on these machines, whatever it carries; the same call over a plain socket costs the broker under
a tenth of that (measured: an empty call, 1.7 ms of the actor's CPU and 3.0 ms round trip
through Ray, 0.08 ms and 0.14 ms over a socket). Busy brokers spend much of their time on calls,
so a process's handles call a broker over one connection per event loop (`Channels`), and Ray
stays what finds the broker, starts and restarts it, and carries a call when the connection
cannot:

- The broker listens on its node's address once a client asks (`open_channel`, an actor call);
  the answer is the address and a ticket, one use, which the client's first frame presents. A
  connection without a valid ticket is closed, so only a client Ray let in can call. Calls on one
  connection run concurrently, each answered by its id.
- Frames, and how the broker reads them without loading code, are actors.calls.frames; the
  broker's side, with its bounds on what a connection may make it hold, is
  actors.service.channel (docs/security.md).
- A call whose connection breaks (the broker restarted, its node went) goes again through Ray,
  with its number and request id (actors.calls.ordering), so it is applied once; the process's slot
  opens a new connection on a later call. Keepalives and a user timeout end a connection to a
  node that vanished without a word (within about 11 s).

Pure asyncio and pickle; the one Ray object it names is the process's lock-holder token.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import pickle
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from actors.calls import frames
from actors.calls.frames import ChannelRefused

log = logging.getLogger("raybroker")

CONNECT_S = 3.0  # opening a connection (and its ticket) gives up after this long
RETRY_S = 5.0  # after a failed open, calls go through Ray this long before the next try


class ChannelBroken(Exception):
    """The connection ended before the call's answer came: send the call another way."""


__all__ = ["Channel", "ChannelBroken", "ChannelRefused", "ChannelSlot", "Channels"]


# asks the broker for (host, port, ticket); None: it has channels turned off
Opener = Callable[[], Awaitable[tuple[str, int, str] | None]]


class Channel(frames.Framed):
    """One open connection to a broker, on one event loop."""

    def __init__(self, holder_token: Any) -> None:
        super().__init__()
        self.holder_token = holder_token
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future] = {}
        self._pickler = frames.pickler_for(holder_token)
        self.broken = False

    @classmethod
    async def open(cls, opener: Opener, holder_token: Any) -> Channel:
        """Ask the broker for a ticket and connect; `ChannelRefused` if it has channels off."""
        answer = await opener()
        if answer is None:
            raise ChannelRefused("the broker has direct channels turned off")
        host, port, ticket = answer
        loop = asyncio.get_running_loop()
        _, channel = await asyncio.wait_for(
            loop.create_connection(lambda: cls(holder_token), host, port), CONNECT_S
        )
        data = ticket.encode("ascii")
        channel.write(frames.LENGTH.pack(len(data)) + data)
        return channel

    def send(self, order: Any, method: str, args: tuple[Any, ...]) -> asyncio.Future:
        """Send a call; its answer's future (the broker's error raised from it, or
        `ChannelBroken`: it did not run, send it another way). Raises `ChannelBroken` at once if
        the call cannot be sent here."""
        if self.broken:
            raise ChannelBroken("the connection is closed")
        call_id = next(self._ids)
        try:
            data = frames.frame((call_id, order, method, frames.dumps(args, self._pickler)))
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise ChannelBroken(f"the call cannot travel as a pickle: {exc}") from None
        if not self.write(data):
            raise ChannelBroken("the connection is closing")
        future = asyncio.get_running_loop().create_future()
        future.add_done_callback(_retrieve)  # an answer nobody awaits any more is no error
        self._pending[call_id] = future
        return future

    def frame(self, data: memoryview) -> None:
        try:
            call_id, status, payload = pickle.loads(data)
        except Exception as exc:
            self.fail(repr(exc))
            return
        future = self._pending.pop(call_id, None)
        if future is None or future.done():
            return
        if status == frames.NOT_HERE:
            future.set_exception(ChannelBroken(f"the broker could not read the call: {payload}"))
            return
        try:
            value = pickle.loads(payload)
        except Exception as exc:  # (a class only the broker has, say): this call's error
            future.set_exception(RuntimeError(f"the broker's answer cannot be read: {exc!r}"))
            return
        if status == frames.OK:
            future.set_result(value)
        else:
            future.set_exception(value)

    def connection_lost(self, exc: Exception | None) -> None:
        self.close(repr(exc) if exc else "closed by the broker")

    def close(self, why: str = "closed") -> None:
        self.broken = True
        if self.transport is not None:
            self.transport.close()
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(ChannelBroken(f"the connection to the broker ended ({why})"))


def _retrieve(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


class ChannelSlot:
    """A channel to one broker on one event loop: opened in the background on first use (calls
    go through Ray meanwhile), reopened after it breaks, not tried again for RETRY_S after an
    open that failed."""

    def __init__(self, opener: Opener, holder_token: Any) -> None:
        self.opener = opener
        self.holder_token = holder_token
        self.channel: Channel | None = None
        self.opening: asyncio.Task | None = None
        self.next_try = 0.0

    def get(self) -> Channel | None:
        """The open channel, or None (then one is being opened, or not tried again yet)."""
        channel = self.channel
        if channel is not None and not channel.broken:
            return channel
        self.channel = None
        if self.opening is None and time.monotonic() >= self.next_try:
            self.opening = asyncio.ensure_future(self._open())
        return None

    async def _open(self) -> None:
        try:
            self.channel = await asyncio.wait_for(
                Channel.open(self.opener, self.holder_token), 2 * CONNECT_S
            )
        except ChannelRefused:
            self.next_try = float("inf")  # not asked again
        except Exception as exc:  # calls go on through Ray
            log.debug("raybroker: no direct channel to the broker (%s); calls go through Ray", exc)
            self.next_try = time.monotonic() + RETRY_S
        finally:
            self.opening = None

    def close(self) -> None:
        if self.opening is not None:
            self.opening.cancel()
        if self.channel is not None:
            self.channel.close()


class Channels:
    """A process's channels: one per broker per event loop, shared by every handle on that
    broker (a call carries its handle's order, so handles need no connection of their own).
    A loop's channels close when it shuts down its async generators (`asyncio.run` does); those
    of a loop closed without that are dropped when the next loop opens one (their sockets then
    close as their transports are collected)."""

    def __init__(self) -> None:
        self._by_loop: dict[asyncio.AbstractEventLoop, dict[Any, ChannelSlot]] = {}
        self._closers: dict[asyncio.AbstractEventLoop, AsyncIterator[None]] = {}

    def slot(self, broker: Any, holder_token: Any, opener: Opener) -> ChannelSlot:
        """The slot for `broker` (any hashable key) on the running loop, made if needed; a
        slot made for an older holder token (Ray started again in this process) is replaced."""
        loop = asyncio.get_running_loop()
        slots = self._by_loop.get(loop)
        if slots is None:
            for closed in [other for other in self._by_loop if other.is_closed()]:
                del self._by_loop[closed]
                self._closers.pop(closed, None)
            slots = self._by_loop[loop] = {}
            # an async generator, not a task: the loop finalizes it at shutdown_asyncgens, and
            # it is not among the loop's tasks (which a shutdown may gather)
            closer = self._closers[loop] = self._close_at_end(loop)
            loop.create_task(closer.__anext__())  # type: ignore[arg-type]
        slot = slots.get(broker)
        if slot is None or slot.holder_token is not holder_token:
            if slot is not None:
                slot.close()
            slot = slots[broker] = ChannelSlot(opener, holder_token)
        return slot

    async def _close_at_end(self, loop: asyncio.AbstractEventLoop) -> AsyncIterator[None]:
        try:
            yield
        finally:  # the loop is shutting down
            self._closers.pop(loop, None)
            for slot in self._by_loop.pop(loop, {}).values():
                slot.close()
