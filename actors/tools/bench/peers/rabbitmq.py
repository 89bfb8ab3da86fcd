"""RabbitMQ as a peer, run as its users run it: aio-pika, a durable queue per partition
(conversation % R), classic or quorum, persistent messages. Power-safe either way: a publisher
confirm comes after the message is on disk (classic) or on a quorum of logs, fsynced (quorum).

Producer: one channel with publisher confirms, awaited asynchronously: a call publishes its
messages without waiting, and up to CONFIRM_WINDOW calls await their confirms at once (one
channel keeps the order of publishes to a queue). Many clients: each process's clients share
one connection and channel.

Consumer: one per queue, manual acknowledgements, a prefetch of at least PREFETCH; what has
arrived is acknowledged with one `multiple` ack as soon as it is processed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from actors.tools.bench.peers import servers
from actors.tools.bench.peers.driver import Received, Recorder
from actors.tools.bench.peers.workloads import Workload, decode

WAIT_S = 0.2  # how often an idle consumer looks at whether the run is over
CONFIRM_WINDOW = 16  # producer calls awaiting their confirms at once
PREFETCH = 100  # unacknowledged messages a consumer may hold, at least


def _arguments(kind: str) -> dict[str, Any]:
    return {"x-queue-type": kind}


class RabbitMQ:
    durability = "power-safe"
    detail = ""
    client = "actors.tools.bench.peers.rabbitmq:RabbitClient"

    def __init__(self, server: servers.Server, kind: str = "classic") -> None:
        self.server, self.kind = server, kind
        self.name = f"rabbitmq-{kind}"

    def consumers(self, w: Workload) -> int:
        return w.consumers

    def pids(self) -> Sequence[int]:
        return [self.server.pid]

    def settings(self) -> dict[str, Any]:
        import aio_pika

        async def ask() -> dict[str, Any]:
            connection = await aio_pika.connect(host="127.0.0.1", port=self.server.port)
            try:
                props = connection.transport.connection.server_properties
                return {"rabbitmq_version": props.get("version"), "queue_type": self.kind}
            finally:
                await connection.close()

        return {**asyncio.run(ask()), "aio-pika": aio_pika.__version__}

    def _queues(self, w: Workload) -> list[str]:
        return [f"peers.{self.kind}.{w.variant}.{p}" for p in range(w.consumers)]

    def _admin(self, w: Workload, declare: bool) -> None:
        import aio_pika

        async def go() -> None:
            connection = await aio_pika.connect(host="127.0.0.1", port=self.server.port)
            try:
                channel = await connection.channel()
                for name in self._queues(w):
                    if declare:
                        await channel.declare_queue(
                            name, durable=True, arguments=_arguments(self.kind)
                        )
                    else:
                        await channel.queue_delete(name)
            finally:
                await connection.close()

        asyncio.run(go())

    def open(self, w: Workload) -> dict[str, Any]:
        self._admin(w, declare=True)
        return {"port": self.server.port, "queues": self._queues(w), "per_call": w.per_call,
                "kind": self.kind}  # fmt: skip

    def close(self, w: Workload) -> None:
        self._admin(w, declare=False)

    def stop(self) -> None:
        pass


class RabbitClient:
    ordered = True  # one channel: publishes go out, and are queued, in the order issued
    inflight = CONFIRM_WINDOW

    def __init__(self, params: dict[str, Any]) -> None:
        self.p = params
        self.connection: Any = None
        self.exchange: Any = None

    async def start(self) -> None:
        import aio_pika

        self.connection = await aio_pika.connect(host="127.0.0.1", port=self.p["port"])
        channel = await self.connection.channel(publisher_confirms=True)
        self.exchange = channel.default_exchange

    async def send(self, bodies: list[tuple[int, bytes]]) -> None:
        import aio_pika

        queues, n = self.p["queues"], len(self.p["queues"])
        persistent = aio_pika.DeliveryMode.PERSISTENT
        await asyncio.gather(
            *(
                self.exchange.publish(
                    aio_pika.Message(body, delivery_mode=persistent), routing_key=queues[conv % n]
                )
                for conv, body in bodies
            )
        )

    async def consume(self, index: int, rec: Recorder) -> None:
        channel = await self.connection.channel()
        await channel.set_qos(prefetch_count=max(PREFETCH, self.p["per_call"]))
        queue = await channel.get_queue(self.p["queues"][index])
        arrived: list[tuple[Any, Received]] = []
        ready = asyncio.Event()

        async def on_message(message: Any) -> None:
            arrived.append((message, decode(message.body)))
            ready.set()

        tag = await queue.consume(on_message)
        try:
            while not rec.stopping:
                try:
                    await asyncio.wait_for(ready.wait(), WAIT_S)
                except TimeoutError:
                    continue
                ready.clear()
                taken = arrived[:]
                del arrived[:]
                if not taken:
                    continue
                issued = time.perf_counter()
                await taken[-1][0].ack(multiple=True)
                rec.confirmed((r for _, r in taken), issued)
        finally:
            await queue.cancel(tag)
            await channel.close()

    async def stop(self) -> None:
        await self.connection.close()
