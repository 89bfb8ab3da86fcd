"""What a direct channel carries (actors.client.channel, actors.service.channel): frames of a
4-byte length and a pickle, and how the broker reads them.

A frame is a pickle of plain data: (call id, order, method, the arguments' own pickle) one way,
(call id, status, the answer's own pickle) the other, so a call one side cannot read fails alone
(NOT_HERE: the broker did not run it; it goes through Ray). A lock holder's handle, the Ray
object its owner's death is noticed by, cannot travel in a pickle: the ticket carries it
(through Ray), and in a call it is named by reference (`holder`).

The broker reads frames with an unpickler that loads no code (`loads`): plain data, and of the
project's own classes only value types (dataclasses, NamedTuples, enums, exceptions) from
modules already loaded, so a frame can neither name a function for pickle to call (os.system,
say) nor make the broker import anything.

Pure asyncio and pickle.
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import enum
import io
import logging
import pickle
import socket
import struct
import sys
from typing import Any, cast

from actors.errors import rebuild_error

log = logging.getLogger("raybroker")

LENGTH = struct.Struct("<I")
MAX_FRAME = 1 << 30  # a call larger than this goes through Ray (the call limits are far below)
FRAME_SLACK = 1 << 20  # a call's frame beyond its bodies' max_call_bytes: names, numbers, pickle
READ_BYTES = 1 << 16  # a connection's receive buffer; it doubles while a larger frame arrives
KEEP_BYTES = 1 << 20  # a buffer grown beyond this goes back to READ_BYTES once it is read
# A dead peer is noticed within about KEEPIDLE + KEEPINTVL * KEEPCNT seconds of silence.
KEEPIDLE, KEEPINTVL, KEEPCNT = 5, 2, 3


class ChannelRefused(Exception):
    """The broker will not open channels (turned off there, or no port to listen on): calls go
    through Ray."""


def tune(sock: socket.socket | None) -> None:
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
DELIVER = "deliver"  # a call's method for another broker's bundles (actors.remote.peers)


def dumps(obj: Any, pickler: type[pickle.Pickler] = pickle.Pickler) -> bytes:
    buf = io.BytesIO()
    pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


# A frame whose payload (or whole, when read) is this large is written in pieces and read in
# place; a smaller one is pickled whole and copied once: cheaper for it (0.6 against 1.9 us).
IN_PLACE_BYTES = 64 << 10


class _Parts:
    """A pickler's file that keeps what it is given, in order: bytes of 64 KiB or more (a call's
    own pickle inside its frame, say) are handed to it as they are, not copied."""

    __slots__ = ("write",)

    def __init__(self, parts: list[bytes]) -> None:
        self.write = parts.append


def frame(obj: Any) -> list[bytes]:
    """A frame, as the pieces to write one after another (`Framed.write`): its length, then a
    pickle of plain data (numbers, strings, bytes, tuples). What a call carries is a pickle of
    its own inside it, so one that cannot be read fails alone. Made in pieces, a large frame is
    neither copied into one buffer nor joined to its length: a 400 KB frame took 255 us that
    way (the copies, and a fresh buffer's page faults), 2 us this way."""
    payload = obj[-1] if type(obj) is tuple and obj else None  # (..., a pickle or a value)
    if type(payload) is not bytes or len(payload) < IN_PLACE_BYTES:  # small: one pickle
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) > MAX_FRAME:
            raise pickle.PicklingError(f"a frame of {len(data)} bytes is over {MAX_FRAME}")
        return [LENGTH.pack(len(data)), data]
    parts: list[bytes] = []
    pickle.Pickler(_Parts(parts), protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    parts = [p if type(p) is bytes else bytes(p) for p in parts]  # none changes once handed on
    size = sum(map(len, parts))
    if size > MAX_FRAME:
        raise pickle.PicklingError(f"a frame of {size} bytes is over {MAX_FRAME}")
    return [LENGTH.pack(size), *parts]


class Framed(asyncio.BufferedProtocol):
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
        tune(transport.get_extra_info("socket"))

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
                (size,) = LENGTH.unpack_from(buf, self._start)
                if size > self.max_frame:
                    self.fail(f"a frame of {size} bytes is over {self.max_frame}")
                    return
                begin = self._start + 4
                if self._end - begin < size:  # the buffer grows as the rest arrives (get_buffer)
                    return
                self._start = begin + size
                piece = view[begin : self._start]
                try:  # read in place: a large frame is not copied out of the buffer first
                    self.frame(piece)
                finally:
                    piece.release()
                if self.transport is None or self.transport.is_closing():
                    return
        finally:
            view.release()
            if self._start == self._end:
                self._start = self._end = 0
                if len(self._buf) > KEEP_BYTES:  # a large frame passed: do not keep its room
                    self._buf = bytearray(READ_BYTES)

    def write(self, data: bytes | list[bytes]) -> bool:
        """Write `data` (bytes, or a frame's pieces); whether it could be (the connection is
        still open)."""
        if self.transport is None or self.transport.is_closing():
            return False
        if type(data) is list:
            self.transport.writelines(data)
        else:
            self.transport.write(data)
        return True

    def frame(self, data: memoryview) -> None:
        """One whole frame, a view of the connection's buffer: read it before returning (the
        buffer is reused after), keep none of it."""
        raise NotImplementedError

    def fail(self, why: str) -> None:
        log.warning("raybroker: closing a direct channel: %s", why)
        if self.transport is not None:
            self.transport.close()


# A lock holder's handle in a call: pickled by reference (`holder`), and read back as the handle
# its connection's ticket brought (`loads(..., holder=[handle])`). A call's arguments are read
# one at a time on the broker's loop.
_holder_here: list[Any] | None = None


def holder() -> Any:
    if _holder_here is None:
        raise pickle.UnpicklingError("a lock holder's handle outside a channel's call")
    return _holder_here[0]


def pickler_for(token: Any) -> type[pickle.Pickler]:
    """A pickler for a call's arguments that names `token` by reference and refuses other Ray
    objects."""

    class _Pickler(pickle.Pickler):
        # called for other objects than plain data (None, numbers, bytes, str, lists, tuples,
        # dicts and sets are not offered): cheap, unlike persistent_id, called for every one
        def reducer_override(self, obj: Any) -> Any:
            if obj is token:
                return holder, ()
            module = type(obj).__module__
            if module == "ray" or module.startswith("ray."):  # another Ray object: not here
                raise pickle.PicklingError(f"a {type(obj).__name__} cannot travel here")
            return NotImplemented

    return _Pickler


# What a broker reads from a channel: plain data, and of classes only the project's value types
# from modules it has loaded.
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


def _error(cls: type, message: str, attrs: dict) -> Any:
    """The project's errors travel as `actors.errors.rebuild_error(class, message, attributes)`;
    here the class must be an exception (it was itself read through `wire_class`)."""
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        raise pickle.UnpicklingError(f"{cls!r} is not an error")
    return rebuild_error(cls, message, attrs)


# the functions a frame may call: its lock holder's reference, an error's rebuilding
_FUNCTIONS: dict[tuple[str, str], Any] = {
    (__name__, "holder"): holder,
    ("actors.errors", "rebuild_error"): _error,
}


def _value_type(cls: type) -> bool:
    return (
        dataclasses.is_dataclass(cls)
        or (issubclass(cls, tuple) and hasattr(cls, "_fields"))  # a NamedTuple
        or issubclass(cls, (enum.Enum, BaseException))
    )


class _WireUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return wire_class(module, name)


def loads(data: bytes | memoryview, holder_handle: list[Any] | None = None) -> Any:
    """A frame's or a call's pickle, read as the broker reads them (see `wire_class`); a
    reference to the lock holder in it stands for `holder_handle[0]`."""
    global _holder_here
    _holder_here = holder_handle
    try:
        large = type(data) is memoryview and len(data) >= IN_PLACE_BYTES
        return _WireUnpickler(_InPlace(data) if large else io.BytesIO(data)).load()
    finally:
        _holder_here = None


class _InPlace:
    """A pickle's file over a view, read where it is (`io.BytesIO` would copy it whole first)."""

    __slots__ = ("_view", "_at")

    def __init__(self, view: memoryview) -> None:
        self._view, self._at = view, 0

    def read(self, n: int = -1) -> bytes:
        at = self._at
        end = len(self._view) if n < 0 else min(len(self._view), at + n)
        self._at = end
        return self._view[at:end].tobytes()

    def readinto(self, buffer: Any) -> int:
        at = self._at
        n = min(len(buffer), len(self._view) - at)
        buffer[:n] = self._view[at : at + n]
        self._at = at + n
        return n

    def readline(self) -> bytes:
        at = end = self._at
        view = self._view
        while end < len(view):  # the newline looked for a few KiB at a time, not byte by byte
            chunk = view[end : end + 4096].tobytes()
            found = chunk.find(b"\n")
            end += len(chunk) if found < 0 else found + 1
            if found >= 0:
                break
        self._at = end
        return view[at:end].tobytes()
