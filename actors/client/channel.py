"""The direct channel: a process's calls to a broker over one TCP connection, beside Ray.

An actor call through Ray costs about a millisecond of the broker's CPU and 1-3 ms of round trip
on these machines, whatever it carries; the same call over a plain socket costs the broker under
a tenth of that (measured: an empty call, 1.7 ms of the actor's CPU and 3.0 ms round trip
through Ray, 0.08 ms and 0.14 ms over a socket). Busy brokers spend much of their time on calls,
so a process's handles call a broker over one connection per event loop (`Channels`), and Ray
stays what finds the broker, starts and restarts it, and carries a call when the connection
cannot:

- The broker listens on its node's address once a client asks (`open_channel`, an actor call);
  the answer is the address and a ticket, one use, which the client's first frame presents (at
  most 64 bytes before it). A connection without a valid ticket is closed, so only a client Ray
  let in can call.
- A frame is a 4-byte length and a pickle of plain data: (call id, order, method, the arguments'
  own pickle) one way, (call id, status, the answer's own pickle) the other, so a call one side
  cannot read fails alone (NOT_HERE: the broker did not run it; it goes through Ray). Calls on
  one connection run concurrently, each answered by its id. A lock holder's handle, the Ray
  object its owner's death is noticed by, cannot travel in a pickle: the ticket carries it
  (through Ray), and in a call it is named by reference.
- What the broker reads from a connection is bounded (docs/security.md): connections without
  a ticket yet are capped in all and per source address, and get a buffer of a ticket's size;
  a ticket is good once, for TICKET_S; a frame is at most the broker's max_call_bytes and its
  buffer grows as its bytes arrive; a connection's calls in flight are capped, and reading
  pauses while answers wait for a client that does not read them. Frames are read by an
  unpickler that loads no code: plain data, and of the project's own classes only value types
  (dataclasses, NamedTuples, enums, exceptions) from modules already loaded. A call that
  carries anything else is not run here (NOT_HERE: the client sends it through Ray).
- The port is any free one, or one of `RAYBROKER_CHANNEL_PORTS` ("7100" or "7100-7199") on
  the broker's node, so an operator can open just those in a firewall.
- A call whose connection breaks (the broker restarted, its node went) goes again through Ray,
  with its number and request id (actors.calls.ordering), so it is applied once; the process's slot
  opens a new connection on a later call. Keepalives and a user timeout end a connection to a
  node that vanished without a word (within about 11 s).

Pure asyncio and pickle; the one Ray object it names is the process's lock-holder token.
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import enum
import io
import itertools
import logging
import os
import pickle
import socket
import struct
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

from actors.errors import InvalidArgument, _rebuild

log = logging.getLogger("raybroker")

_LENGTH = struct.Struct("<I")
MAX_FRAME = 1 << 30  # a call larger than this goes through Ray (the call limits are far below)
FRAME_SLACK = 1 << 20  # a call's frame beyond its bodies' max_call_bytes: names, numbers, pickle
READ_BYTES = 1 << 16  # a connection's receive buffer; it doubles while a larger frame arrives
KEEP_BYTES = 1 << 20  # a buffer grown beyond this goes back to READ_BYTES once it is read
CONNECT_S = 3.0  # opening a connection (and its ticket) gives up after this long
RETRY_S = 5.0  # after a failed open, calls go through Ray this long before the next try
TICKET_S = 60.0  # a ticket is good for one connection made within this long
TICKET_BYTES = 64  # a ticket frame's most (ours are 32)
UNTICKETED_MAX = 64  # connections without a ticket yet, at most; more are closed at once
UNTICKETED_PER_SOURCE = 16  # of those, from one address
INFLIGHT_MAX = 128  # a connection's calls running at once; reading pauses at this many
PORTS_ENV = "RAYBROKER_CHANNEL_PORTS"
# A dead peer is noticed within about KEEPIDLE + KEEPINTVL * KEEPCNT seconds of silence.
KEEPIDLE, KEEPINTVL, KEEPCNT = 5, 2, 3


class ChannelBroken(Exception):
    """The connection ended before the call's answer came: send the call another way."""


class ChannelRefused(Exception):
    """The broker will not open channels (turned off there): calls go through Ray."""


def _tune(sock: socket.socket | None) -> None:
    if sock is None:
        return
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (
        ("TCP_KEEPIDLE", KEEPIDLE),
        ("TCP_KEEPINTVL", KEEPINTVL),
        ("TCP_KEEPCNT", KEEPCNT),
        # and a call sent to a peer that stopped acknowledging (keepalives wait while data is
        # unacknowledged, and retransmissions go on for many minutes)
        ("TCP_USER_TIMEOUT", (KEEPIDLE + KEEPINTVL * KEEPCNT) * 1000),
    ):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


OK, ERROR, NOT_HERE = 0, 1, 2  # an answer's status; NOT_HERE: not run, send it through Ray


def _dumps(obj: Any, pickler: type[pickle.Pickler] = pickle.Pickler) -> bytes:
    buf = io.BytesIO()
    pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def _frame(obj: Any) -> bytes:
    """A frame: length, then a pickle of plain data (numbers, strings, bytes, tuples). What a
    call carries is a pickle of its own inside it, so one that cannot be read fails alone."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) > MAX_FRAME:
        raise pickle.PicklingError(f"a frame of {len(data)} bytes is over {MAX_FRAME}")
    return _LENGTH.pack(len(data)) + data


class _Framed(asyncio.BufferedProtocol):
    """A connection's bytes as frames: `frame` is called with each whole one. Read into one
    buffer kept for the connection: with a plain Protocol asyncio reads each time into a new
    256 KiB bytes object, which glibc maps and unmaps (mmap, mremap, munmap and their page
    faults: a loopback ping-pong took 95 us of CPU per round trip on these VMs, 56 without)."""

    max_frame = MAX_FRAME

    def __init__(self, buffer_bytes: int = READ_BYTES) -> None:
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray(buffer_bytes)
        self._start = 0  # unread bytes are _buf[_start:_end]
        self._end = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport, though not always asyncio's class (uvloop's is its own)
        self.transport = cast(asyncio.Transport, transport)
        _tune(transport.get_extra_info("socket"))

    def get_buffer(self, sizehint: int) -> memoryview:
        buf, start, end = self._buf, self._start, self._end
        if end == len(buf):  # full: move what is unread to the front, or into a larger buffer
            unread = end - start
            if unread >= len(buf) // 2:
                self._buf = bytearray(max(2 * len(buf), unread + READ_BYTES))
            self._buf[:unread] = buf[start:end]
            self._start, self._end = 0, unread
        return memoryview(self._buf)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        self._end += nbytes
        buf, view = self._buf, memoryview(self._buf)
        try:
            while self._end - self._start >= 4:
                (size,) = _LENGTH.unpack_from(buf, self._start)
                if size > self.max_frame:
                    self.fail(f"a frame of {size} bytes is over {self.max_frame}")
                    return
                begin = self._start + 4
                if self._end - begin < size:  # the buffer grows as the rest arrives (get_buffer)
                    return
                self._start = begin + size
                self.frame(bytes(view[begin : self._start]))
                if self.transport is None or self.transport.is_closing():
                    return
        finally:
            view.release()
            if self._start == self._end:
                self._start = self._end = 0
                if len(self._buf) > KEEP_BYTES:  # a large frame passed: do not keep its room
                    self._buf = bytearray(READ_BYTES)

    def write(self, data: bytes) -> bool:
        """Whether it could be written (the connection is still open)."""
        if self.transport is None or self.transport.is_closing():
            return False
        self.transport.write(data)
        return True

    def frame(self, data: bytes) -> None:
        raise NotImplementedError

    def fail(self, why: str) -> None:
        log.warning("raybroker: closing a direct channel: %s", why)
        if self.transport is not None:
            self.transport.close()


# The broker's side ---------------------------------------------------------------------------

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
                return await loop.create_server(lambda: _Served(self), self.host, port)
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


class _Served(_Framed):
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

    def frame(self, data: bytes) -> None:
        server = self.server
        if self.holder is None:
            holder = server.take_ticket(data.decode("ascii", "replace"))
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
        global _holder_here
        _holder_here = self.holder[0] if self.holder else None  # what `_holder` stands for
        try:
            args = loads(blob)
        except Exception as exc:  # code, or a class only the client has: not run; through Ray
            self.write(_frame((call_id, NOT_HERE, repr(exc)[:500])))
            return
        finally:
            _holder_here = None
        try:
            status, value = OK, await self.server.dispatch(order, method, args)
        except Exception as exc:  # the caller's error, raised in the caller
            status, value = ERROR, exc
        try:
            data = _frame((call_id, status, _dumps(value)))
            if status == ERROR:
                pickle.loads(data[4:])  # an error that will not unpickle cannot be raised there
        except Exception as exc:  # an answer that cannot travel: say so rather than hang
            error = RuntimeError(f"the broker's answer to {method} cannot be sent: {exc!r}"[:2000])
            data = _frame((call_id, ERROR, _dumps(error)))
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


# What a broker reads from a channel: plain data, and of classes only the project's value types
# from modules it has loaded, so a frame cannot name a function to call (pickle's REDUCE calls
# whatever its global names: os.system, say) nor make the broker import anything.
_OWN_PACKAGES = ("actors", "spark_bridge", "topologies")
_PLAIN_BUILTINS = frozenset({"set", "frozenset", "bytearray", "complex", "range", "slice"})


def wire_class(module: str, name: str) -> Any:
    """The class a channel frame may name as `module.name`; `pickle.UnpicklingError` for
    anything else."""
    if (module, name) in _FUNCTIONS:
        return _FUNCTIONS[module, name]
    if module == "builtins":
        found = getattr(builtins, name, None)
        if name in _PLAIN_BUILTINS or (
            isinstance(found, type) and issubclass(found, BaseException)
        ):
            return found
    elif module.partition(".")[0] in _OWN_PACKAGES and name.isidentifier():
        found = getattr(sys.modules.get(module), name, None)
        if isinstance(found, type) and found.__module__ == module and _value_type(found):
            return found
    raise pickle.UnpicklingError(f"{module}.{name} may not travel on a direct channel")


def _rebuild_error(cls: type, message: str, attrs: dict) -> Any:
    """The project's errors travel as `actors.errors._rebuild(class, message, attributes)`;
    here the class must be an exception (it was itself read through `wire_class`)."""
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        raise pickle.UnpicklingError(f"{cls!r} is not an error")
    return _rebuild(cls, message, attrs)


# the functions a frame may call: its lock holder's reference, an error's rebuilding
_FUNCTIONS: dict[tuple[str, str], Any] = {
    (__name__, "_holder"): lambda: _holder(),
    ("actors.errors", "_rebuild"): _rebuild_error,
}


def _value_type(cls: type) -> bool:
    return (
        dataclasses.is_dataclass(cls)
        or (issubclass(cls, tuple) and hasattr(cls, "_fields"))  # a NamedTuple
        or issubclass(cls, enum.Enum | BaseException)
    )


class _WireUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return wire_class(module, name)


def loads(data: bytes) -> Any:
    """A frame's or a call's pickle, read as the broker reads them (see `wire_class`)."""
    return _WireUnpickler(io.BytesIO(data)).load()


# The client's side ---------------------------------------------------------------------------

# asks the broker for (host, port, ticket); None: it has channels turned off
Opener = Callable[[], Awaitable[tuple[str, int, str] | None]]


class Channel(_Framed):
    """One open connection to a broker, on one event loop."""

    def __init__(self, holder_token: Any) -> None:
        super().__init__()
        self.holder_token = holder_token
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future] = {}
        self._pickler = _pickler_for(holder_token)
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
        channel.write(_LENGTH.pack(len(data)) + data)
        return channel

    def send(self, order: Any, method: str, args: tuple[Any, ...]) -> asyncio.Future:
        """Send a call; its answer's future (the broker's error raised from it, or
        `ChannelBroken`: it did not run, send it another way). Raises `ChannelBroken` at once if
        the call cannot be sent here."""
        if self.broken:
            raise ChannelBroken("the connection is closed")
        call_id = next(self._ids)
        try:
            data = _frame((call_id, order, method, _dumps(args, self._pickler)))
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise ChannelBroken(f"the call cannot travel as a pickle: {exc}") from None
        if not self.write(data):
            raise ChannelBroken("the connection is closing")
        future = asyncio.get_running_loop().create_future()
        future.add_done_callback(_retrieve)  # an answer nobody awaits any more is no error
        self._pending[call_id] = future
        return future

    def frame(self, data: bytes) -> None:
        try:
            call_id, status, payload = pickle.loads(data)
        except Exception as exc:
            self.fail(repr(exc))
            return
        future = self._pending.pop(call_id, None)
        if future is None or future.done():
            return
        if status == NOT_HERE:
            future.set_exception(ChannelBroken(f"the broker could not read the call: {payload}"))
            return
        try:
            value = pickle.loads(payload)
        except Exception as exc:  # (a class only the broker has, say): this call's error
            future.set_exception(RuntimeError(f"the broker's answer cannot be read: {exc!r}"))
            return
        if status == OK:
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


# A lock holder's handle in a call: pickled by reference (`_holder`), and read back as the handle
# its connection's ticket brought. A call's arguments are read one at a time on the broker's loop.
_holder_here: Any = None


def _holder() -> Any:
    if _holder_here is None:
        raise pickle.UnpicklingError("a lock holder's handle outside a channel's call")
    return _holder_here


def _pickler_for(token: Any) -> type[pickle.Pickler]:
    class _Pickler(pickle.Pickler):
        # called for other objects than plain data (None, numbers, bytes, str, lists, tuples,
        # dicts and sets are not offered): cheap, unlike persistent_id, called for every one
        def reducer_override(self, obj: Any) -> Any:
            if obj is token:
                return _holder, ()
            module = type(obj).__module__
            if module == "ray" or module.startswith("ray."):  # another Ray object: not here
                raise pickle.PicklingError(f"a {type(obj).__name__} cannot travel here")
            return NotImplemented

    return _Pickler


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
