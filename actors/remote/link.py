"""Calls between a mirrored broker's partners: the principal's `MirrorLink` to its mirror (ships
over the log stream, `actors.mirroring.stream`, everything else and any ship the stream cannot
carry over Ray), and `unwrap`, which turns an actor call's failure into raybroker's errors (a
partner's or the witness's own error as itself; anything that kept the call from being answered
as `PeerUnreachable`)."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

import ray

from actors.errors import BrokerError, LogStreamLost, PeerUnreachable
from actors.mirroring.capture import Entry
from actors.mirroring.pairkey import PairKey
from actors.mirroring.stream import LogStream

log = logging.getLogger("raybroker")

APPLY_S = 3.0  # a ship: a batch of transactions applied in one SQLite transaction (a mirror
# slower than this is taken for lost: the principal goes on alone, fenced by the witness)
REBUILD_S = 120.0  # a whole store copied
STREAM_RETRY_S = 1.0  # after the log stream closed, ships go over Ray this long before it is
# opened again (a mirror that refuses, restarts or cannot be connected to is not hammered)


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
        self._stream: LogStream | None = None
        self._stream_at = 0.0  # when the log stream may next be opened
        self.stream_state = "not opened yet"  # for the status: how ships travel, and why
        self._opening = asyncio.Lock()

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
        stream = await self._open_stream()
        if stream is not None:
            try:
                return await stream.ship(epoch, entries, APPLY_S)
            except TimeoutError:
                raise PeerUnreachable.no_answer(self.mirror, APPLY_S) from None
            except LogStreamLost as exc:  # Ray carries it, and says why if it is refused
                self._stream_at = time.monotonic() + STREAM_RETRY_S
                self.stream_state = f"over Ray: {exc.why}"
                log.info("mirror %s: %s", self.mirror, exc)
        ref = self._handle().apply.remote(*self._proved("apply"), epoch, self.line, entries)
        return await unwrap(ref, APPLY_S, self.mirror)

    async def _open_stream(self) -> LogStream | None:
        """The log stream to the mirror, opened if need be; None while ships go over Ray."""
        if self._stream is not None and not self._stream.closed:
            return self._stream
        if time.monotonic() < self._stream_at:
            return None
        async with self._opening:
            if self._stream is not None and not self._stream.closed:
                return self._stream
            try:
                ref = self._handle().log_address.remote(*self._proved("log_address"))
                host, port = await unwrap(ref, APPLY_S, self.mirror)
                hello = [self.caller, self.key.prove(self.caller, "apply"), self.line]
                self._stream = await LogStream.connect(host, port, hello, APPLY_S)
            except (BrokerError, OSError, TimeoutError) as exc:
                self._stream_at = time.monotonic() + STREAM_RETRY_S
                self.stream_state = f"over Ray: the log stream could not be opened: {exc!r}"
                log.info("mirror %s: %s", self.mirror, self.stream_state)
                return None
            self.stream_state = f"log stream to {host}:{port}"
        return self._stream

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()

    async def rebuild(self, epoch: int, seq: int, parts: list[bytes]) -> int:
        proved = self._proved("rebuild")
        ref = self._handle().rebuild.remote(*proved, epoch, self.line, seq, parts, self.broker_id)
        return await unwrap(ref, REBUILD_S, self.mirror)
