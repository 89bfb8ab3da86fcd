"""Ray's own queue (`ray.util.queue.Queue`) as a peer: one queue actor per partition
(conversation % R, at most MAX_ACTORS: each is a process), named so that the producer and
consumer processes find it, one consumer per queue. A producer call is one `put_nowait_batch`
per queue it touches; a consumer waits for one item (`get`), then takes what else is waiting
with `get_nowait_batch`. Not durable, and a get is final: there is no acknowledgement, so a
message counts as acknowledged when the get returns."""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Sequence
from typing import Any

from ray.util.queue import Empty, Queue

from actors.tools.bench.peers.driver import Recorder
from actors.tools.bench.peers.workloads import INFLIGHT, Workload, decode

MAX_ACTORS = 4  # many-clients' 100 partitions would be 100 actor processes
WAIT_S = 0.2  # how long an idle consumer's get waits
NAMESPACE = "raybroker-bench-peers"


class RayQueue:
    name = "ray-queue"
    durability = "none"
    detail = ""
    client = "actors.tools.bench.peers.ray_queue:RayQueueClient"

    def __init__(self) -> None:
        import ray

        self.address = ray.get_runtime_context().gcs_address
        # made once for every run (each actor is a process to start); a run takes what it sends
        self.names = [f"q-{uuid.uuid4().hex[:8]}" for _ in range(MAX_ACTORS)]
        self.queues = [
            Queue(actor_options={"num_cpus": 0, "name": n, "namespace": NAMESPACE})
            for n in self.names
        ]
        self.actor_pids: list[int] = ray.get(
            [q.actor.__ray_call__.remote(lambda _self: os.getpid()) for q in self.queues]
        )

    def consumers(self, w: Workload) -> int:
        return min(w.consumers, MAX_ACTORS)

    def pids(self) -> Sequence[int]:
        return self.actor_pids

    def settings(self) -> dict[str, Any]:
        import ray

        return {"ray": ray.__version__}

    def open(self, w: Workload) -> dict[str, Any]:
        return {"address": self.address, "names": self.names[: self.consumers(w)],
                "per_call": w.per_call}  # fmt: skip

    def close(self, w: Workload) -> None:
        pass  # each run takes what it sent: the queues are empty again

    def stop(self) -> None:
        for q in self.queues:
            q.shutdown(force=True)


class RayQueueClient:
    # the queue actor is an async actor: a call whose items travel through the object store can
    # start before an earlier one, so a call waits for earlier calls on its conversations
    ordered = False
    inflight = INFLIGHT

    def __init__(self, params: dict[str, Any]) -> None:
        self.p = params
        self.actors: list[Any] = []

    async def start(self) -> None:
        import ray

        if not ray.is_initialized():  # a pool process keeps its connection from run to run
            ray.init(address=self.p["address"], logging_level=logging.ERROR, log_to_driver=False)
        self.actors = [ray.get_actor(n, namespace=NAMESPACE) for n in self.p["names"]]

    async def send(self, bodies: list[tuple[int, bytes]]) -> None:
        by_queue: dict[int, list[bytes]] = {}
        for conv, body in bodies:
            by_queue.setdefault(conv % len(self.actors), []).append(body)
        for i, items in by_queue.items():
            await self.actors[i].put_nowait_batch.remote(items)

    async def consume(self, index: int, rec: Recorder) -> None:
        actor, most = self.actors[index], self.p["per_call"]
        while not rec.stopping:
            issued = time.perf_counter()
            try:
                items = [await actor.get.remote(WAIT_S)]
            except Empty:
                continue
            if most > 1:
                waiting = await actor.qsize.remote()
                if waiting:
                    items += await actor.get_nowait_batch.remote(min(waiting, most - 1))
            rec.confirmed((decode(b) for b in items), issued)

    async def stop(self) -> None:
        pass  # the process's Ray connection serves its next run
