"""The broker's side of the direct channel (actors.client.channel): it listens once a client
asks, takes each connection's ticket, then runs its calls through the broker's dispatch.

What the broker reads from a connection is bounded (docs/security.md): connections without a
ticket yet are capped in all and per source address, and get a buffer of a ticket's size; a
ticket is good once, for TICKET_S; a frame is at most the broker's max_call_bytes and its buffer
grows as its bytes arrive; a connection's calls in flight are capped, and reading pauses while
answers wait for a client that does not read them. Frames are read by an unpickler that loads no
code (actors.calls.frames.loads): a call that carries anything else is not run here (NOT_HERE:
the client sends it through Ray). The port is any free one, or one of `RAYBROKER_CHANNEL_PORTS`
("7100" or "7100-7199") on the broker's node, so an operator can open just those in a firewall.

Pure asyncio.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

from actors.calls.frames import (
    ERROR,
    FRAME_SLACK,
    MAX_FRAME,
    NOT_HERE,
    OK,
    ChannelRefused,
    Framed,
    dumps,
    frame,
    loads,
)
from actors.errors import InvalidArgument

log = logging.getLogger("raybroker")

CONNECT_S = 3.0  # a connection that shows no ticket within this long is closed
TICKET_S = 60.0  # a ticket is good for one connection made within this long
TICKET_BYTES = 64  # a ticket frame's most (ours are 32)
UNTICKETED_MAX = 64  # connections without a ticket yet, at most; more are closed at once
UNTICKETED_PER_SOURCE = 16  # of those, from one address
# connections the kernel completes before the broker accepts them (asyncio's default: 100):
# a burst of connections without a ticket, which the broker closes as it accepts them, must
# not fill the queue and leave a client's connect unanswered (capped by net.core.somaxconn)
ACCEPT_BACKLOG = 1024
INFLIGHT_MAX = 128  # a connection's calls running at once; reading pauses at this many
PORTS_ENV = "RAYBROKER_CHANNEL_PORTS"

Dispatch = Callable[[Any, str, tuple[Any, ...]], Awaitable[Any]]  # (order, method, args)
Undelivered = Callable[[Any, str, Any, Any], None]  # (order, method, args, result) not sent


def channel_ports(text: str | None) -> range:
    """The ports a broker's channel may listen on, from RAYBROKER_CHANNEL_PORTS: "7100" or
    "7100-7199"; any free port (range(0, 1)) when unset or empty."""
    if text is None or not text.strip():
        return range(0, 1)
    first, dash, last = text.strip().partition("-")
    try:
        low = int(first)
        high = int(last) if dash else low
    except ValueError:
        low = high = -1
    if not 1 <= low <= high <= 65535:
        raise InvalidArgument(
            f"{PORTS_ENV} must be a port or a range of ports between 1 and 65535 (as 7100 or "
            f"7100-7199), not {text!r}"
        )
    return range(low, high + 1)


class ChannelServer:
    """Listens for a broker's clients and runs their calls through `dispatch`. A call whose
    answer cannot be sent (its connection ended meanwhile; the client sends it again through
    Ray) is handed to `undelivered`, so what it took can be given back. `max_call_bytes`: the
    broker's limit on a call's bodies, which bounds a frame; `ports`: where it may listen."""

    def __init__(
        self,
        dispatch: Dispatch,
        host: str,
        undelivered: Undelivered | None = None,
        max_call_bytes: int = MAX_FRAME - FRAME_SLACK,
        ports: range = range(0, 1),
    ) -> None:
        self.dispatch = dispatch
        self.undelivered = undelivered
        self.host = host
        self.port = 0
        self.ports = ports
        self.max_frame = min(MAX_FRAME, max_call_bytes + FRAME_SLACK)
        self._server: asyncio.AbstractServer | None = None
        self._starting = asyncio.Lock()
        self.tickets: dict[str, tuple[float, Any]] = {}  # ticket -> (made at, holder handle)
        self.served: set[_Served] = set()  # connections open now, with a ticket
        self.calls = 0  # calls received over them, ever
        self.refused = 0  # connections closed at once: too many without a ticket
        self.unticketed: dict[str, int] = {}  # source address -> its connections without one
        self.running: set[asyncio.Task] = set()  # calls being answered (held: asyncio does not)

    async def ticket(self, holder_handle: Any) -> tuple[str, int, str]:
        """(host, port, ticket) for one connection; `holder_handle`: what a frame's reference
        to the lock holder stands for on that connection. `ChannelRefused` if no port of
        `ports` is free."""
        async with self._starting:  # one listener, however many clients ask at once
            if self._server is None:
                self._server = await self._listen()
                self.port = self._server.sockets[0].getsockname()[1]
        now = time.monotonic()
        for stale in [t for t, (at, _) in self.tickets.items() if at < now - TICKET_S]:
            del self.tickets[stale]
        ticket = os.urandom(16).hex()
        self.tickets[ticket] = (now, holder_handle)
        return self.host, self.port, ticket

    async def _listen(self) -> asyncio.AbstractServer:
        loop = asyncio.get_running_loop()
        error: OSError | None = None
        for port in self.ports:
            try:
                return await loop.create_server(
                    lambda: _Served(self), self.host, port, backlog=ACCEPT_BACKLOG
                )
            except OSError as exc:  # in use: the next one
                error = exc
        raise ChannelRefused(
            f"no port of {self.ports.start}-{self.ports.stop - 1} is free on {self.host} "
            f"({PORTS_ENV}): {error}"
        )

    @property
    def connections(self) -> int:
        """Connections open now, with a ticket."""
        return len(self.served)

    def take_ticket(self, ticket: str) -> list[Any] | None:
        """[the holder handle] of a ticket still good (used once, within TICKET_S); else None."""
        entry = self.tickets.pop(ticket, None)
        if entry is None or entry[0] < time.monotonic() - TICKET_S:
            return None
        return [entry[1]]

    def admit(self, source: str) -> bool:
        """Whether a connection from `source` may wait for its ticket (then counted until it
        shows one or closes: `release`)."""
        mine = self.unticketed.get(source, 0)
        if sum(self.unticketed.values()) >= UNTICKETED_MAX or mine >= UNTICKETED_PER_SOURCE:
            self.refused += 1
            return False
        self.unticketed[source] = mine + 1
        return True

    def release(self, source: str) -> None:
        left = self.unticketed.get(source, 0) - 1
        if left > 0:
            self.unticketed[source] = left
        else:
            self.unticketed.pop(source, None)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()


class _Served(Framed):
    """One client's connection at the broker: a ticket first, then calls."""

    def __init__(self, server: ChannelServer) -> None:
        super().__init__(4 + TICKET_BYTES)  # a ticket's room, until one is shown
        self.max_frame = TICKET_BYTES  # nobody unknown makes the broker buffer more
        self.server = server
        self.holder: list[Any] | None = None  # [the holder handle], once the ticket is in
        self.source: str | None = None  # the address, while counted as without a ticket
        self._deadline: asyncio.TimerHandle | None = None
        self.inflight = 0  # calls running for this connection
        self._paused: set[str] = set()  # why reading is paused: "calls", "writes"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        source = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        if not self.server.admit(source):
            cast(asyncio.Transport, transport).abort()  # at once: its descriptor is free again
            return
        self.source = source
        loop = asyncio.get_running_loop()
        self._deadline = loop.call_later(CONNECT_S, self._no_ticket)

    def _no_ticket(self) -> None:
        if self.holder is None and self.transport is not None:
            self.transport.abort()

    def _ticketed(self) -> None:
        if self.source is not None:
            self.server.release(self.source)
            self.source = None

    def frame(self, data: memoryview) -> None:
        server = self.server
        if self.holder is None:
            holder = server.take_ticket(bytes(data).decode("ascii", "replace"))
            if holder is None:  # not a client Ray let in (or its ticket is spent or stale)
                assert self.transport is not None
                self.transport.abort()
                return
            self._ticketed()
            self.holder = holder
            self.max_frame = server.max_frame
            server.served.add(self)
            return
        try:
            call_id, order, method, blob = loads(data)
            if not isinstance(method, str) or not isinstance(blob, bytes):
                raise pickle.UnpicklingError("a call frame is (id, order, method, bytes)")
        except Exception as exc:  # not a frame of this protocol: the connection ends
            self.fail(repr(exc)[:500])
            return
        server.calls += 1
        # tasks start in the order made; the broker's order check, not this, is what keeps a
        # client's calls in the order it issued them. A call outlives its connection, as an
        # actor call outlives its caller.
        task = asyncio.ensure_future(self._answer(call_id, order, method, blob))
        server.running.add(task)
        task.add_done_callback(self._call_done)
        self.inflight += 1
        if self.inflight >= INFLIGHT_MAX:
            self._pause("calls")

    def _call_done(self, task: asyncio.Task) -> None:
        self.server.running.discard(task)
        self.inflight -= 1
        if self.inflight < INFLIGHT_MAX:
            self._resume("calls")

    # Back-pressure: the transport calls these as its unsent answers cross its high and low
    # marks; a client that does not read its answers is not read from either.
    def pause_writing(self) -> None:
        self._pause("writes")

    def resume_writing(self) -> None:
        self._resume("writes")

    def _pause(self, why: str) -> None:
        if not self._paused and self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
        self._paused.add(why)

    def _resume(self, why: str) -> None:
        if why not in self._paused:
            return
        self._paused.discard(why)
        if not self._paused and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    async def _answer(self, call_id: int, order: Any, method: str, blob: bytes) -> None:
        try:
            args = loads(blob, self.holder)
        except Exception as exc:  # code, or a class only the client has: not run; through Ray
            self.write(frame((call_id, NOT_HERE, repr(exc)[:500])))
            return
        try:
            status, value = OK, await self.server.dispatch(order, method, args)
        except Exception as exc:  # the caller's error, raised in the caller
            status, value = ERROR, exc
        try:
            data = frame((call_id, status, dumps(value)))
            if status == ERROR:  # an error that will not unpickle cannot be raised there
                pickle.loads(b"".join(data[1:]))
        except Exception as exc:  # an answer that cannot travel: say so rather than hang
            error = RuntimeError(f"the broker's answer to {method} cannot be sent: {exc!r}"[:2000])
            data = frame((call_id, ERROR, dumps(error)))
            sent = False  # what it took, if anything, does not reach the caller
        else:
            sent = True
        sent = self.write(data) and sent
        if not sent and status == OK and self.server.undelivered is not None:
            try:
                self.server.undelivered(order, method, args, value)
            except Exception:
                log.exception("raybroker: giving back what an unanswered %s took", method)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._ticketed()
        self.server.served.discard(self)
        self.transport = None
