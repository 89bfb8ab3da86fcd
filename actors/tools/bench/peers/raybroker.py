"""raybroker as a peer: one broker actor with its store in the run's temp dir; per workload a
fresh Queue + Service pair on each side and K dialogs. A call sends on one dialog (one
conversation's batch) or on all of them (a spread batch); consumers receive whole conversation
groups (the broker's locking keeps one conversation in one hand) and commit them in their next
call, so a message is acknowledged when that call returns."""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from itertools import groupby

from actors import Begin, Queue, Send, Service, start_broker
from actors.remote.client import Broker
from actors.tools.bench.peers.driver import Received, Recorder
from actors.tools.bench.peers.workloads import GROUPS_PER_CALL, Workload, decode

WAIT_S = 0.2  # how long an idle receive waits for messages


class RayBroker:
    name = "raybroker"
    ordered = True  # one client's calls are applied in the order issued (actors.calls.ordering)

    def __init__(self, workdir: str) -> None:
        self.broker: Broker = start_broker(
            f"bench-peers-{uuid.uuid4().hex[:8]}", os.path.join(workdir, "raybroker.sqlite")
        )
        info = self.broker.info()
        self.pid = info["pid"]
        self.detail = f"{info['compiled_modules']} modules compiled"  # (actors.compiled)
        self.handles: list[str] = []
        self.queue = ""
        self.w: Workload | None = None

    def consumers(self, w: Workload) -> int:
        return w.consumers

    def pids(self) -> Sequence[int]:
        return [self.pid]

    async def open(self, w: Workload) -> None:
        self.w = w
        tag = w.variant.replace("-", "_")
        self.queue = f"Target_{tag}"
        for queue, service, contracts in (
            (f"Initiator_{tag}", f"Init_{tag}", []),
            (self.queue, f"Svc_{tag}", ["DEFAULT"]),
        ):
            await self.broker.aio.create(Queue(queue))
            await self.broker.aio.create(Service(service, queue, contracts))
        begins = [Begin(f"Init_{tag}", f"Svc_{tag}") for _ in range(w.conversations)]
        self.handles = (await self.broker.aio.apply(begins))["handles"]

    async def send(self, bodies: list[tuple[int, bytes]]) -> None:
        # consecutive bodies of one conversation become one Send on its dialog
        ops = [
            Send(self.handles[conv], "DEFAULT", [b for _, b in run])
            for conv, run in groupby(bodies, key=lambda cb: cb[0])
        ]
        await self.broker.aio.apply(ops)

    async def consume(self, index: int, rec: Recorder) -> None:
        assert self.w is not None
        one = self.w.per_call == 1
        options = {"max_groups": 1, "top": 1} if one else {"max_groups": GROUPS_PER_CALL}
        groups: list = []
        pending: list[Received] = []
        while not rec.stopping:
            # commit what was received last turn and receive more in one call; with something
            # to commit, do not wait for new messages, so the commit is seen when it happens
            groups = await self.broker.aio.receive(
                self.queue, wait=0.0 if groups else WAIT_S, commit=groups, **options
            )
            if pending:
                rec.confirmed(pending)
            pending = [decode(m.body) for g in groups for m in g.messages]

    async def close(self) -> None:
        self.w = None

    def stop(self) -> None:
        self.broker.stop()
