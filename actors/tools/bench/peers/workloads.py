"""The workloads every system runs, and the message bodies they carry (pure: no Ray, no servers).

Every body is 100 bytes: conversation, sequence number in that conversation and the send time
(`time.perf_counter()` in the driver, which is also where it is read back), padded. Consumers learn
everything the checker and the latency figures need from the body alone.
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from actors.tools.bench.report import Load

BODY_BYTES = 100
_HEAD = struct.Struct("<IId")  # conversation, sequence, send time
_PAD = bytes(range(BODY_BYTES - _HEAD.size))  # the same filler for every system

CONSUMERS = 4  # R: parallel consumers of the bulk workloads
CLIENTS = 100  # many-clients: concurrent producers, and as many consumers
PACED_RATE = 10_000.0  # messages/s the paced producer is held to
PACED_BATCH = 100  # paced: one message per conversation per call, a call every 10 ms
INFLIGHT = 4  # producer calls in flight at once (bulk and paced), where a system keeps order
PROCESSES = 4  # many-clients: producer processes, and consumer processes, the clients over them
GROUPS_PER_CALL = 32  # conversations one bulk consume takes at most (raybroker, raw-sqlite)

Pair = tuple[int, int]  # (conversation, sequence number)


def encode(conversation: int, seq: int, sent_at: float) -> bytes:
    return _HEAD.pack(conversation, seq, sent_at) + _PAD


def decode(body: bytes) -> tuple[int, int, float]:
    """(conversation, seq, sent_at) of a body made by `encode`."""
    return _HEAD.unpack_from(body)


@dataclass(frozen=True)
class Workload:
    """One workload. `consumers` is also how many partitions (streams, queues) a peer uses:
    conversation c goes to partition c % consumers, read by one consumer, which is how a Redis
    or RabbitMQ user keeps one conversation's messages in order and never in two hands at once."""

    variant: str
    messages: int
    conversations: int
    consumers: int
    batch: int  # messages per producer call
    spread: bool = False  # each call spread evenly over all conversations
    per_call: int = 1000  # most messages a consumer takes in one call
    rate: float | None = None  # producer held to this many messages/s
    clients: int = 0  # >0: that many producers, one conversation each, one message per call

    def partition(self, conversation: int) -> int:
        return conversation % self.consumers


def plan(load: Load) -> list[Workload]:
    """The four workloads of one run: bulk (both batch shapes) at `load.messages`, many-clients
    at a tenth (at least 200), paced at a quarter."""
    n, k, batch = load.messages, load.dialogs, load.batch
    clients_n = max(2 * CLIENTS, n // 10 // CLIENTS * CLIENTS)
    paced_batch = min(PACED_BATCH, batch)
    return [
        Workload("bulk-one-conversation", n, k, CONSUMERS, batch),
        Workload("bulk-spread", n, k, CONSUMERS, max(k, batch // k * k), spread=True),
        Workload("many-clients", clients_n, CLIENTS, CLIENTS, 1, per_call=1, clients=CLIENTS),
        Workload(
            "paced",
            max(paced_batch, n // 4 // paced_batch * paced_batch),
            k,
            CONSUMERS,
            paced_batch,
            spread=True,
            rate=PACED_RATE,
        ),
    ]


def batches(w: Workload) -> Iterator[list[Pair]]:
    """The producer's calls, in order: (conversation, seq) pairs, each conversation numbered
    0, 1, 2, ... With `spread`, every call carries batch/K messages of every conversation;
    otherwise call i carries `batch` messages of conversation i % K. Many-clients: one message
    per call, client c sending on conversation c (the caller runs the clients concurrently)."""
    next_seq = [0] * w.conversations
    sent = 0
    while sent < w.messages:
        size = min(w.batch, w.messages - sent)
        if w.clients:
            convs = [(sent // w.batch) % w.conversations]
        elif w.spread:
            per = max(1, size // w.conversations)
            convs = [c for c in range(w.conversations) for _ in range(per)][:size]
        else:
            convs = [(sent // w.batch) % w.conversations] * size
        out = []
        for c in convs:
            out.append((c, next_seq[c]))
            next_seq[c] += 1
        sent += len(out)
        yield out


def expected(w: Workload) -> dict[int, int]:
    """Messages each conversation gets: the checker's expectation."""
    return dict(Counter(c for batch in batches(w) for c, _ in batch))
