"""Ray's own queue (`ray.util.queue.Queue`) as a peer: one queue actor per partition
(conversation % R, at most MAX_ACTORS: each is a process), one consumer per queue. A producer
call is one `put_nowait_batch`; a consumer waits for one item (`get_async`), then takes what else
is waiting with `get_nowait_batch`. Not durable, and a get is final: there is no
acknowledgement, so a message counts as acknowledged when the get returns."""

from __future__ import annotations

import os
from collections.abc import Sequence

from ray.util.queue import Empty, Queue

from actors.tools.bench.peers.driver import Recorder
from actors.tools.bench.peers.workloads import Workload, decode

MAX_ACTORS = 4  # many-clients' 100 partitions would be 100 actor processes
WAIT_S = 0.2  # how long an idle consumer's get waits


class RayQueue:
    name = "ray-queue"
    detail = ""  # nothing to add to its notes
    # the queue actor is an async actor: a call whose items travel through the object store can
    # start before an earlier one, so a call waits for earlier calls on its conversations
    ordered = False

    def __init__(self) -> None:
        self.queues: list[Queue] = []
        self.actor_pids: list[int] = []
        self.w: Workload | None = None

    def consumers(self, w: Workload) -> int:
        return min(w.consumers, MAX_ACTORS)

    def pids(self) -> Sequence[int]:
        return self.actor_pids

    async def open(self, w: Workload) -> None:
        self.w = w
        self.queues = [Queue(actor_options={"num_cpus": 0}) for _ in range(self.consumers(w))]
        self.actor_pids = [
            await q.actor.__ray_call__.remote(lambda _self: os.getpid()) for q in self.queues
        ]

    async def send(self, bodies: list[tuple[int, bytes]]) -> None:
        by_queue: dict[int, list[bytes]] = {}
        for conv, body in bodies:
            by_queue.setdefault(conv % len(self.queues), []).append(body)
        for i, items in by_queue.items():
            await self.queues[i].actor.put_nowait_batch.remote(items)

    async def consume(self, index: int, rec: Recorder) -> None:
        assert self.w is not None
        queue, most = self.queues[index], self.w.per_call
        while not rec.stopping:
            try:
                items = [await queue.get_async(timeout=WAIT_S)]
            except Empty:
                continue
            if most > 1:
                waiting = await queue.actor.qsize.remote()
                if waiting:
                    items += await queue.actor.get_nowait_batch.remote(min(waiting, most - 1))
            rec.confirmed(decode(b) for b in items)

    async def close(self) -> None:
        for q in self.queues:
            q.shutdown(force=True)
        self.queues, self.actor_pids = [], []
        self.w = None
