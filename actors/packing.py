"""msgpack packing for the hot path: one reusable `Packer` per thread.

`msgpack.packb` builds a new `Packer` on every call, about as much work as packing a small
object itself; the broker packs several small objects per message (each call's request record,
each receive's answer, each batch of operations). A packer is not safe to share between threads
(in-process brokers run on threads of their own), so each thread keeps its own. A packer never
shrinks its buffer, so one that packed something big is dropped rather than kept for the
thread's life.
"""

from __future__ import annotations

import threading
from typing import Any

import msgpack

_local = threading.local()
KEEP_BYTES = 1 << 20  # a packer whose last output was bigger is not kept


def packb(obj: Any) -> bytes:
    """`msgpack.packb(obj, use_bin_type=True)`, without making a packer each time."""
    try:
        packer = _local.packer
    except AttributeError:
        packer = _local.packer = msgpack.Packer(use_bin_type=True)
    out = packer.pack(obj)
    if len(out) > KEEP_BYTES:
        del _local.packer  # its buffer is as big as this output: let it go
    return out


# a named tuple from its fields' tuple, on the hot path: its class's own constructor (and
# `_replace`) run as Python even where this package runs compiled
made = tuple.__new__


def one_or_all(values: list[Any]) -> Any:
    """A column packed as its one value when every entry has it (the usual case: one message
    type, one time for a run), else the list itself."""
    return values[0] if values.count(values[0]) == len(values) else values


def first_or_all(seqs: list[int]) -> int | list[int]:
    """Sequence numbers packed as the first when they count up by one from it (the usual case:
    a run), else the list itself. Compared whole: numbers whose ends alone look like a run
    ([0, 2, 1, 3]) stay a list."""
    first = seqs[0]
    return first if seqs == list(range(first, first + len(seqs))) else seqs
