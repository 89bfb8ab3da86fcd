"""raybroker as a peer: one broker actor with its store in the run's temp dir, at the default
durability (SQLite WAL, synchronous=NORMAL) or power-safe (`durability="full"`: an fsync per
commit). Per workload a fresh Queue + Service pair on each side and K dialogs. Each producer and
consumer process connects to the cluster and holds one handle on the broker, which coalesces the
concurrent calls of a process's clients. A call sends on one dialog (one conversation's batch)
or on several (a spread batch); consumers receive whole conversation groups (the broker's locking
keeps one conversation in one hand) and commit them in their next call, so a message is
acknowledged when that call returns."""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Sequence
from itertools import groupby
from typing import Any

from actors import Begin, Queue, Send, Service, start_broker
from actors.tools.bench.peers.driver import Received, Recorder
from actors.tools.bench.peers.workloads import GROUPS_PER_CALL, INFLIGHT, Workload, decode

WAIT_S = 0.2  # how long an idle receive waits for messages
DURABILITY = {"default": "normal", "power-safe": "full"}


class RayBroker:
    name = "raybroker"
    client = "actors.tools.bench.peers.raybroker:RayBrokerClient"

    def __init__(self, workdir: str, durability: str = "default") -> None:
        import ray

        self.durability = durability
        self.broker = start_broker(
            f"bench-peers-{uuid.uuid4().hex[:8]}",
            os.path.join(workdir, f"raybroker-{durability}.sqlite"),
            durability=DURABILITY[durability],
        )
        info = self.broker.info()
        self.pid = info["pid"]
        self.detail = f"{info['compiled_modules']} modules compiled"  # (actors.compiled)
        self.address = ray.get_runtime_context().gcs_address
        self.info = info
        self.runs = 0

    def consumers(self, w: Workload) -> int:
        return w.consumers

    def pids(self) -> Sequence[int]:
        return [self.pid]

    def settings(self) -> dict[str, Any]:
        import ray

        return {"durability": self.info["durability"], "ray": ray.__version__}

    def open(self, w: Workload) -> dict[str, Any]:
        self.runs += 1  # each run its own queues and dialogs
        tag = f"{w.variant.replace('-', '_')}_{self.runs}"
        queue = f"Target_{tag}"
        for q, service, contracts in (
            (f"Initiator_{tag}", f"Init_{tag}", []),
            (queue, f"Svc_{tag}", ["DEFAULT"]),
        ):
            self.broker.create(Queue(q))
            self.broker.create(Service(service, q, contracts))
        begins = [Begin(f"Init_{tag}", f"Svc_{tag}") for _ in range(w.conversations)]
        handles = self.broker.apply(begins)["handles"]
        return {
            "address": self.address,
            "name": self.broker.name,
            "namespace": self.broker.namespace,
            "handles": handles,
            "queue": queue,
            "per_call": w.per_call,
        }

    def close(self, w: Workload) -> None:
        pass  # each workload has queues of its own; the broker goes at `stop`

    def stop(self) -> None:
        self.broker.stop()


class RayBrokerClient:
    ordered = True  # one handle's calls are applied in the order issued (actors.calls.ordering)
    inflight = INFLIGHT

    def __init__(self, params: dict[str, Any]) -> None:
        self.p = params
        self.broker: Any = None

    async def start(self) -> None:
        import ray

        from actors.remote.client import connect

        if not ray.is_initialized():  # a pool process keeps its connection from run to run
            ray.init(address=self.p["address"], logging_level=logging.ERROR, log_to_driver=False)
        self.broker = connect(self.p["name"], self.p["namespace"])
        await self.broker.aio.info()  # connected before the clock starts

    async def send(self, bodies: list[tuple[int, bytes]]) -> None:
        # consecutive bodies of one conversation become one Send on its dialog
        handles = self.p["handles"]
        ops = [
            Send(handles[conv], "DEFAULT", [b for _, b in run])
            for conv, run in groupby(bodies, key=lambda cb: cb[0])
        ]
        await self.broker.aio.apply(ops)

    async def consume(self, index: int, rec: Recorder) -> None:
        one = self.p["per_call"] == 1
        options = {"max_groups": 1, "top": 1} if one else {"max_groups": GROUPS_PER_CALL}
        groups: list = []
        pending: list[Received] = []
        while not rec.stopping:
            # commit what was received last turn and receive more in one call; with something
            # to commit, do not wait for new messages, so the commit is seen when it happens
            issued = time.perf_counter()
            groups = await self.broker.aio.receive(
                self.p["queue"], wait=0.0 if groups else WAIT_S, commit=groups, **options
            )
            if pending:
                rec.confirmed(pending, issued)
            pending = [decode(m.body) for g in groups for m in g.messages]
        if groups:  # what the last turn took goes back, committed
            issued = time.perf_counter()
            await self.broker.aio.commit(groups)
            rec.confirmed(pending, issued)

    async def stop(self) -> None:
        pass  # the process's Ray connection serves its next run
