"""Redis Streams as a peer, run as its users run it: redis-py with the hiredis parser, a stream per
partition (conversation % R) with a consumer group, one consumer per stream.

Producer: a call's messages are XADDed in pipelines, one per stream the call touches, and up to
INFLIGHT calls are in flight. Order per stream holds because each stream has a connection of its
own for the producer, and a lock that lets its pipelines through one after another in the order
the calls were issued, while the other streams' connections go on in parallel. Many
clients: each process's clients share one pooled client, an XADD per message.

Consumer: the previous batch's XACK goes in one pipeline with the next XREADGROUP (COUNT; BLOCK
only when there is nothing to acknowledge), so a batch is acknowledged when the read after it
returns, one round trip per batch.

Durability: the default is AOF with `appendfsync everysec`; power-safe is `appendfsync always`
(an fsync before each write is answered)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from actors.tools.bench.peers import servers
from actors.tools.bench.peers.driver import Recorder
from actors.tools.bench.peers.workloads import INFLIGHT, Workload, decode

GROUP = "peers"
BLOCK_MS = 200  # how long an idle XREADGROUP blocks
MAX_CONNECTIONS = 512
FSYNC = {"default": "everysec", "power-safe": "always"}


def client_versions() -> dict[str, Any]:
    import redis

    try:
        import hiredis

        hiredis_version = hiredis.__version__
    except ImportError:
        hiredis_version = None
    from redis.utils import HIREDIS_AVAILABLE

    return {"redis-py": redis.__version__, "hiredis": hiredis_version,
            "hiredis_in_use": bool(HIREDIS_AVAILABLE)}  # fmt: skip


class RedisStreams:
    name = "redis-streams"
    detail = ""
    client = "actors.tools.bench.peers.redis_streams:RedisClient"

    def __init__(self, server: servers.Server, durability: str = "default") -> None:
        import redis

        self.durability = durability
        self.server = server
        self.admin = redis.Redis(host="127.0.0.1", port=server.port)
        self.admin.config_set("appendfsync", FSYNC[durability])

    def consumers(self, w: Workload) -> int:
        return w.consumers

    def pids(self) -> Sequence[int]:
        return [self.server.pid]

    def settings(self) -> dict[str, Any]:
        info = self.admin.info("server")
        return {
            "appendonly": self.admin.config_get("appendonly")["appendonly"],
            "appendfsync": self.admin.config_get("appendfsync")["appendfsync"],
            "redis_version": info["redis_version"],
            **client_versions(),
        }

    def open(self, w: Workload) -> dict[str, Any]:
        streams = [f"peers:{w.variant}:{p}" for p in range(w.consumers)]
        self.admin.delete(*streams)
        for stream in streams:
            self.admin.xgroup_create(stream, GROUP, id="0", mkstream=True)
        return {"port": self.server.port, "streams": streams, "per_call": w.per_call,
                "partitions": w.consumers}  # fmt: skip

    def close(self, w: Workload) -> None:
        self.admin.delete(*(f"peers:{w.variant}:{p}" for p in range(w.consumers)))

    def stop(self) -> None:
        self.admin.close()


class RedisClient:
    ordered = True  # a stream's pipelines go one after another on its own connection
    inflight = INFLIGHT

    def __init__(self, params: dict[str, Any]) -> None:
        self.p = params
        self.pool: Any = None  # many clients, and the consumers' blocking reads
        self.per_stream: dict[int, Any] = {}  # the producer's connection per stream
        self.locks: dict[int, asyncio.Lock] = {}  # its pipelines one at a time, in issue order

    async def start(self) -> None:
        import redis.asyncio as aioredis

        self.pool = aioredis.Redis(
            host="127.0.0.1", port=self.p["port"], max_connections=MAX_CONNECTIONS
        )
        await self.pool.ping()
        if self.p["per_call"] > 1:  # a producer of batches: a connection per stream
            for s in range(len(self.p["streams"])):
                self.per_stream[s] = aioredis.Redis(
                    host="127.0.0.1", port=self.p["port"], max_connections=1
                )
                self.locks[s] = asyncio.Lock()
            await asyncio.gather(*(c.ping() for c in self.per_stream.values()))

    async def send(self, bodies: list[tuple[int, bytes]]) -> None:
        streams, n = self.p["streams"], self.p["partitions"]
        if len(bodies) == 1:  # one client's one message
            conv, body = bodies[0]
            await self.pool.xadd(streams[conv % n], {"b": body})
            return
        by_stream: dict[int, list[bytes]] = {}
        for conv, body in bodies:
            by_stream.setdefault(conv % n, []).append(body)
        await asyncio.gather(*(self._pipeline(s, b) for s, b in by_stream.items()))

    async def _pipeline(self, stream: int, bodies: list[bytes]) -> None:
        # the stream's own connection; its lock (first come, first served) lets the pipelines
        # through in the order they were issued
        pipe = self.per_stream[stream].pipeline(transaction=False)
        for body in bodies:
            pipe.xadd(self.p["streams"][stream], {"b": body})
        async with self.locks[stream]:
            await pipe.execute()

    async def consume(self, index: int, rec: Recorder) -> None:
        stream, count = self.p["streams"][index], self.p["per_call"]
        taken: list[bytes] = []  # entry ids read last turn, acknowledged with the next read
        received: list = []
        while not rec.stopping:
            issued = time.perf_counter()
            pipe = self.pool.pipeline(transaction=False)
            if taken:
                pipe.xack(stream, GROUP, *taken)
            # with an acknowledgement to make, read without blocking, so it is confirmed now
            block = None if taken else BLOCK_MS
            pipe.xreadgroup(GROUP, f"c{index}", {stream: ">"}, count=count, block=block)
            got = (await pipe.execute())[-1]
            if taken:
                rec.confirmed(received, issued)
            entries = got[0][1] if got else []
            taken = [entry_id for entry_id, _ in entries]
            received = [decode(fields[b"b"]) for _, fields in entries]
        if taken:
            issued = time.perf_counter()
            await self.pool.xack(stream, GROUP, *taken)
            rec.confirmed(received, issued)

    async def stop(self) -> None:
        await asyncio.gather(self.pool.aclose(), *(c.aclose() for c in self.per_stream.values()))
