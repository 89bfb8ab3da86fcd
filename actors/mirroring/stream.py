"""The log stream: a principal's ships to its mirror over a TCP connection of their own.

Why not Ray's actor calls, which still find the mirror and carry everything else (`held`,
`rebuild`, and any ship the stream cannot): a ship is a group commit's worth of segments, most
often over Ray's 100 KB limit for arguments passed inline, so it went through the object store,
5-6 ms a round trip on an idle machine and ~13 ms under load; on a socket it is 0.1-0.2 ms. Every
commit's caller waits for that round trip, so it set the mirrored broker's rate.

The wire: frames of a 4-byte big-endian length and a msgpack body.

- hello, the principal's first frame: `[caller, proof, line]` (the proof is the one the pair's
  key makes for `apply`, checked before anything else is read);
- a ship: `[epoch, new_sql, entries]`, each entry `[seq, at, [[many, sql_no, params], ...]]`.
  A statement's SQL text crosses once per connection (`new_sql`, numbered in order of arrival
  from 0); after that only its number does, so a ship is its values;
- the mirror's answer to each ship, in order: `[held]`, or `[-1, why]` when it refused (a stale
  epoch, a gap, not a mirror): the principal then sends that ship over Ray, whose answer is the
  typed error the shipper acts on.

Plain asyncio, no Ray, so the whole protocol is tested in process.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import struct
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgpack

from actors.errors import BrokerError, LogStreamLost
from actors.mirroring.capture import Entry

log = logging.getLogger("raybroker")

_LENGTH = struct.Struct(">I")
MAX_FRAME = 1 << 30  # a frame claiming more is not one of ours: the connection is dropped

Applier = Callable[[int, list[Entry]], Awaitable[int]]


class LogEncoder:
    """Ships as frames' bodies; remembers which SQL texts this connection has carried."""

    def __init__(self) -> None:
        self._numbers: dict[str, int] = {}

    def encode(self, epoch: int, entries: Sequence[Entry]) -> bytes:
        numbers, new_sql = self._numbers, []
        out = []
        for entry in entries:
            statements = []
            for many, sql, params in entry.statements:
                no = numbers.get(sql)
                if no is None:
                    no = numbers[sql] = len(numbers)
                    new_sql.append(sql)
                statements.append((many, no, params))
            out.append((entry.seq, entry.at, statements))
        return msgpack.packb((epoch, new_sql, out), use_bin_type=True)


class LogDecoder:
    """The mirror's side of `LogEncoder`: a frame's body back to the epoch and the entries."""

    def __init__(self) -> None:
        self._sql: list[str] = []

    def decode(self, body: bytes) -> tuple[int, list[Entry]]:
        epoch, new_sql, entries = msgpack.unpackb(body, raw=False)
        sql = self._sql
        sql.extend(new_sql)
        return epoch, [
            Entry(seq, at, [(many, sql[no], params) for many, no, params in statements])
            for seq, at, statements in entries
        ]


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    if size > MAX_FRAME:
        raise ValueError(f"a frame of {size} bytes: not the log stream")
    return await reader.readexactly(size)


def write_frame(writer: asyncio.StreamWriter, body: bytes) -> None:
    writer.write(_LENGTH.pack(len(body)))
    writer.write(body)


class LogStream:
    """The principal's end: ships go out as they come; their answers come back in order."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._encoder = LogEncoder()
        self._waiting: collections.deque[asyncio.Future[int]] = collections.deque()
        self._why = ""  # why it closed
        self._answers = asyncio.get_running_loop().create_task(self._read_answers())

    @classmethod
    async def connect(cls, host: str, port: int, hello: list[Any], timeout: float) -> LogStream:
        """Connect and say who is shipping (`[caller, proof, line]`). Raises `OSError` or
        `TimeoutError` when the mirror cannot be reached."""
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        write_frame(writer, msgpack.packb(hello, use_bin_type=True))
        return cls(reader, writer)

    @property
    def closed(self) -> bool:
        return bool(self._why)

    async def ship(self, epoch: int, entries: Sequence[Entry], timeout: float) -> int:
        """The mirror's answer to `entries`: the last entry it holds. Raises `LogStreamLost`
        (the stream is closed; the ship may or may not have been applied: send it another way,
        the mirror skips what it holds) or `TimeoutError` (closed too)."""
        if self._why:
            raise LogStreamLost(self._why)
        answer = asyncio.get_running_loop().create_future()
        self._waiting.append(answer)
        write_frame(self._writer, self._encoder.encode(epoch, entries))
        try:
            await self._writer.drain()
            return await asyncio.wait_for(asyncio.shield(answer), timeout)
        except TimeoutError:
            self.close(f"no answer within {timeout:g} s")
            raise
        except (OSError, RuntimeError) as exc:  # the connection broke under the write
            self.close(f"the connection broke: {exc!r}")
            raise LogStreamLost(self._why) from None

    async def _read_answers(self) -> None:
        try:
            while True:
                held, *why = msgpack.unpackb(await read_frame(self._reader), raw=False)
                answer = self._waiting.popleft()
                if held < 0:
                    self.close(f"the mirror refused a ship: {why[0] if why else '?'}")
                    answer.set_exception(LogStreamLost(self._why))
                    return
                if not answer.done():
                    answer.set_result(held)
        except (OSError, EOFError, ValueError, IndexError) as exc:
            self.close(f"the connection broke: {exc!r}")

    def close(self, why: str = "closed") -> None:
        """Close the connection; ships still waiting for an answer hear `LogStreamLost`."""
        if not self._why:
            self._why = why
        while self._waiting:
            answer = self._waiting.popleft()
            if not answer.done():
                answer.set_exception(LogStreamLost(self._why))
        self._writer.close()
        if self._answers is not asyncio.current_task():
            self._answers.cancel()


async def serve(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    admit: Callable[[list[Any]], Applier],
) -> None:
    """The mirror's end of one connection. `admit` checks the hello and returns what applies a
    ship (or raises, and the connection is closed unread). Ships are applied one after another,
    in the order they came; each is answered before the next is read."""
    decoder = LogDecoder()
    try:
        apply = admit(msgpack.unpackb(await read_frame(reader), raw=False))
        while True:
            epoch, entries = decoder.decode(await read_frame(reader))
            try:
                answer: list[Any] = [await apply(epoch, entries)]
            except BrokerError as exc:
                answer = [-1, str(exc)]
            write_frame(writer, msgpack.packb(answer, use_bin_type=True))
            await writer.drain()
    except (OSError, EOFError, ValueError, TypeError, BrokerError):
        pass  # the principal went, or this was not one: its ships go another way
    except Exception:  # an apply that failed unlike a refusal: the principal's Ray call says why
        log.exception("the log stream: a ship could not be applied; the connection is closed")
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
