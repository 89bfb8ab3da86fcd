"""RabbitMQ as a peer: a durable queue per partition (conversation % R), persistent messages,
publisher confirms (a producer call publishes its messages concurrently and awaits every
confirm), one consumer per queue with manual acknowledgements and a prefetch window. A consumer
acknowledges what has arrived with one `multiple` ack, as soon as it has processed it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import aio_pika

from actors.tools.bench.peers.driver import Received, Recorder
from actors.tools.bench.peers.workloads import Workload, decode

WAIT_S = 0.2  # how often an idle consumer looks at whether the run is over


class RabbitMQ:
    name = "rabbitmq"
    detail = ""  # nothing to add to its notes
    ordered = True  # one channel: publishes go out, and are queued, in the order issued

    def __init__(self, port: int, pid: int) -> None:
        self.port = port
        self.pid = pid
        self.connection: aio_pika.abc.AbstractConnection | None = None
        self.publisher: aio_pika.abc.AbstractChannel | None = None
        self.queues: list[str] = []
        self.w: Workload | None = None

    def consumers(self, w: Workload) -> int:
        return w.consumers

    def pids(self) -> Sequence[int]:
        return [self.pid]

    async def open(self, w: Workload) -> None:
        self.w = w
        self.connection = await aio_pika.connect(host="127.0.0.1", port=self.port)
        self.publisher = await self.connection.channel(publisher_confirms=True)
        self.queues = [f"peers.{w.variant}.{p}" for p in range(w.consumers)]
        for name in self.queues:
            await self.publisher.declare_queue(name, durable=True)

    async def send(self, bodies: list[tuple[int, bytes]]) -> None:
        assert self.w is not None and self.publisher is not None
        exchange = self.publisher.default_exchange
        await asyncio.gather(
            *(
                exchange.publish(
                    aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                    routing_key=self.queues[self.w.partition(conv)],
                )
                for conv, body in bodies
            )
        )

    async def consume(self, index: int, rec: Recorder) -> None:
        assert self.w is not None and self.connection is not None
        channel = await self.connection.channel()
        await channel.set_qos(prefetch_count=self.w.per_call)
        queue = await channel.get_queue(self.queues[index])
        arrived: list[tuple[aio_pika.abc.AbstractIncomingMessage, Received]] = []
        ready = asyncio.Event()

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
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
                await taken[-1][0].ack(multiple=True)
                rec.confirmed(r for _, r in taken)
        finally:
            await queue.cancel(tag)
            await channel.close()

    async def close(self) -> None:
        if self.publisher is not None:
            for name in self.queues:
                await self.publisher.queue_delete(name)
        if self.connection is not None:
            await self.connection.close()
        self.connection = self.publisher = None
        self.w = None
