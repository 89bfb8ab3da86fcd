"""Redis Streams as a peer, run as its users run it: redis-py with the hiredis parser, a stream per
partition (conversation % R) with a consumer group, one consumer per stream.

Producer: a call's messages are XADDed in pipelines, one per stream the call touches, and up to
INFLIGHT calls are in flight. Order per stream holds because each stream has a connection and a
thread of its own for the producer, which sends that stream's pipelines one after another in the
order the calls were issued, while the other streams' threads go on in parallel. The pipelines go
through redis-py's synchronous client: its asynchronous one reads a pipeline's replies one at a
time through asyncio, at over twice the CPU per message. Many
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
from concurrent.futures import ThreadPoolExecutor
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
    """Batches go through redis-py's synchronous client, each stream's on a thread of its own
    (the asynchronous client reads a pipeline's replies one at a time through asyncio, at over
    twice the CPU per message); many clients' single messages through the asynchronous pool."""

    ordered = True  # a stream's pipelines go one after another on its own thread and connection
    inflight = INFLIGHT

    def __init__(self, params: dict[str, Any]) -> None:
        self.p = params
        self.pool: Any = None  # many clients' calls, one message each
        self.per_stream: dict[int, Any] = {}  # a batch producer's connection per stream ...
        self.threads: dict[int, ThreadPoolExecutor] = {}  # ... and its thread, first come first
        self.reader: Any = None  # a batch consumer's connection

    async def start(self) -> None:
        import redis
        import redis.asyncio as aioredis

        port = self.p["port"]
        self.pool = aioredis.Redis(host="127.0.0.1", port=port, max_connections=MAX_CONNECTIONS)
        await self.pool.ping()
        if self.p["per_call"] > 1:
            for s in range(len(self.p["streams"])):
                self.per_stream[s] = redis.Redis(host="127.0.0.1", port=port)
                self.threads[s] = ThreadPoolExecutor(1, thread_name_prefix=f"stream-{s}")
            self.reader = redis.Redis(host="127.0.0.1", port=port)
            for client in [*self.per_stream.values(), self.reader]:
                client.ping()

    async def send(self, bodies: list[tuple[int, bytes]]) -> None:
        streams, n = self.p["streams"], self.p["partitions"]
        if len(bodies) == 1:  # one client's one message
            conv, body = bodies[0]
            await self.pool.xadd(streams[conv % n], {"b": body})
            return
        by_stream: dict[int, list[bytes]] = {}
        for conv, body in bodies:
            by_stream.setdefault(conv % n, []).append(body)
        loop = asyncio.get_running_loop()
        # handed to each stream's one thread now, in the order the calls were issued: that
        # thread sends them in that order
        await asyncio.gather(
            *(loop.run_in_executor(self.threads[s], self._pipeline, s, b)
              for s, b in by_stream.items())
        )  # fmt: skip

    def _pipeline(self, stream: int, bodies: list[bytes]) -> None:
        pipe = self.per_stream[stream].pipeline(transaction=False)
        name = self.p["streams"][stream]
        for body in bodies:
            pipe.xadd(name, {"b": body})
        pipe.execute()

    async def consume(self, index: int, rec: Recorder) -> None:
        batches = self.p["per_call"] > 1  # else one of many clients' consumers: on the pool
        taken: list[bytes] = []  # entry ids read last turn, acknowledged with the next read
        received: list = []
        while not rec.stopping:
            issued = time.perf_counter()
            if batches:
                got = await asyncio.to_thread(self._read, self.reader.pipeline, index, taken)
            else:
                got = await self._read_async(index, taken)
            if taken:
                rec.confirmed(received, issued)
            entries = got[0][1] if got else []
            taken = [entry_id for entry_id, _ in entries]
            received = [decode(fields[b"b"]) for _, fields in entries]
        if taken:
            issued = time.perf_counter()
            await self.pool.xack(self.p["streams"][index], GROUP, *taken)
            rec.confirmed(received, issued)

    def _read(self, pipeline: Any, index: int, taken: list[bytes]) -> Any:
        pipe = self._read_pipeline(pipeline(transaction=False), index, taken)
        return pipe.execute()[-1]

    async def _read_async(self, index: int, taken: list[bytes]) -> Any:
        pipe = self._read_pipeline(self.pool.pipeline(transaction=False), index, taken)
        return (await pipe.execute())[-1]

    def _read_pipeline(self, pipe: Any, index: int, taken: list[bytes]) -> Any:
        """The last read's XACK, then the next XREADGROUP; with an acknowledgement to make, the
        read does not block, so the acknowledgement is confirmed now."""
        stream = self.p["streams"][index]
        if taken:
            pipe.xack(stream, GROUP, *taken)
        block = None if taken else BLOCK_MS
        pipe.xreadgroup(GROUP, f"c{index}", {stream: ">"}, count=self.p["per_call"], block=block)
        return pipe

    async def stop(self) -> None:
        for executor in self.threads.values():
            executor.shutdown()
        for client in [*self.per_stream.values(), *([self.reader] if self.reader else [])]:
            client.close()
        await self.pool.aclose()
