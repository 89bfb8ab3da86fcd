"""Redis Streams as a peer: a stream per partition (conversation % R), a consumer group on each,
one consumer per stream. A producer call is one pipeline of XADDs; a consumer takes up to
`per_call` entries with XREADGROUP (COUNT, BLOCK) and acknowledges them with one XACK."""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as aioredis

from actors.tools.bench.peers.driver import Recorder
from actors.tools.bench.peers.workloads import Workload, decode

GROUP = "peers"
BLOCK_MS = 200  # how long an idle XREADGROUP blocks
MAX_CONNECTIONS = 512


class RedisStreams:
    name = "redis-streams"
    detail = ""  # nothing to add to its notes
    # pipelines go out on different pooled connections, so two calls in flight may be applied
    # in either order: a call waits for earlier calls on its conversations
    ordered = False

    def __init__(self, port: int, pid: int) -> None:
        # a connection per blocked consumer and per call in flight (many-clients: 100 of each)
        self.client = aioredis.Redis(host="127.0.0.1", port=port, max_connections=MAX_CONNECTIONS)
        self.pid = pid
        self.streams: list[str] = []
        self.w: Workload | None = None

    def consumers(self, w: Workload) -> int:
        return w.consumers

    def pids(self) -> Sequence[int]:
        return [self.pid]

    async def open(self, w: Workload) -> None:
        self.w = w
        self.streams = [f"peers:{w.variant}:{p}" for p in range(w.consumers)]
        await self.client.delete(*self.streams)
        for stream in self.streams:
            await self.client.xgroup_create(stream, GROUP, id="0", mkstream=True)

    async def send(self, bodies: list[tuple[int, bytes]]) -> None:
        assert self.w is not None
        if len(bodies) == 1:
            conv, body = bodies[0]
            await self.client.xadd(self.streams[self.w.partition(conv)], {"b": body})
            return
        pipe = self.client.pipeline(transaction=False)
        for conv, body in bodies:
            pipe.xadd(self.streams[self.w.partition(conv)], {"b": body})
        await pipe.execute()

    async def consume(self, index: int, rec: Recorder) -> None:
        assert self.w is not None
        stream, count = self.streams[index], self.w.per_call
        while not rec.stopping:
            got = await self.client.xreadgroup(
                GROUP, f"c{index}", {stream: ">"}, count=count, block=BLOCK_MS
            )
            entries = got[0][1] if got else []
            if not entries:
                continue
            received = [decode(fields[b"b"]) for _, fields in entries]
            await self.client.xack(stream, GROUP, *(entry_id for entry_id, _ in entries))
            rec.confirmed(received)

    async def close(self) -> None:
        if self.streams:
            await self.client.delete(*self.streams)
        self.w = None

    async def aclose(self) -> None:
        await self.client.aclose()
