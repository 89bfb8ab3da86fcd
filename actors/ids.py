"""Fresh identifiers, time first; and the random bytes behind keys, nonces and tokens.

The store indexes conversation handles and group ids (unique text columns), conversation ids,
and request ids (the requests table's key). A random id lands anywhere in its index, so a group
commit of a thousand new dialogs dirties a thousand scattered index pages, and more of them miss
the page cache as the tables grow (measured, 50,000 dialogs begun 1,000 per call: random ids
12,450 begins/s for the first 10,000 and 6,201 for the last; time-first ids ~12,000 throughout,
and first sends 3,200-4,000/s against 4,700-5,900). Ids that begin with the time are appended
at the end of their index instead: a few pages per commit, however large the store.
"""

from __future__ import annotations

import os
import random
import threading
import time

_bits = random.getrandbits
_RAND_A = (1 << 12) - 1
_RAND_B = (1 << 62) - 1


def new_uuid() -> str:
    """A UUID version 7 (RFC 9562) as its usual 36-character string: the Unix time in
    milliseconds, then 74 random bits. Unique as a random UUID is; ordered by time. The bits
    come from `random` (seeded from the OS, and again in a forked child): an `os.urandom` call
    per id cost more than the rest of it, and a dialog takes five ids."""
    rand = _bits(74)
    n = (
        (time.time_ns() // 1_000_000) << 80
        | 0x7 << 76
        | (rand >> 62 & _RAND_A) << 64
        | 0b10 << 62
        | rand & _RAND_B
    )
    h = f"{n:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class RandomBytes:
    """Bytes from the OS's random source, read a few kilobytes at a time and handed out in
    order, never twice: an `os.urandom` call per nonce or key is a system call that also lets go
    of the GIL (a busy broker's other threads then hold it), per sealed bundle, dialog key and
    received group."""

    CHUNK = 4096  # bytes per read

    def __init__(self) -> None:
        self._buffer = b""
        self._at = 0

    def take(self, n: int) -> bytes:
        at = self._at
        if at + n > len(self._buffer):
            if n > self.CHUNK:
                return os.urandom(n)
            self._buffer, at = os.urandom(self.CHUNK), 0
        self._at = at + n
        return self._buffer[at : at + n]


_local = threading.local()  # a RandomBytes per thread (in-process brokers run on threads)


def random_bytes(n: int) -> bytes:
    """`n` bytes from the OS's random source (as `os.urandom`), for keys, nonces and tokens:
    this thread's, none handed out twice, none shared with a forked child."""
    try:
        source = _local.source
    except AttributeError:
        source = _local.source = RandomBytes()
    return source.take(n)


def _forget_after_fork() -> None:
    global _local  # a fork's child must not repeat its parent's next bytes
    _local = threading.local()


os.register_at_fork(after_in_child=_forget_after_fork)


def new_request_id() -> str:
    """A fresh request id: the time in nanoseconds, then 64 random bits (32 hex digits, like a
    uuid's); time first, as the module says."""
    return f"{time.time_ns():016x}{random.getrandbits(64):016x}"  # random: reseeded on fork
