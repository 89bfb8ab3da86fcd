"""Seed 003's priority pattern, deployed from topologies/priority.yaml: a backlog of
low-priority jobs never delays the high-priority ones."""

from __future__ import annotations

import json

from actors import Begin, Send
from tests.polling import wait_until
from topologies.deploy import deploy
from topologies.loader import load


def processed(broker, queue: str) -> int:
    return sum(json.loads(g["state"])["count"] for g in broker.groups(queue) if g["state"])


def test_high_priority_jobs_finish_while_low_priority_ones_wait(ray_session, tmp_path):
    brokers = deploy(load("topologies/priority.yaml"), str(tmp_path)).brokers
    b = brokers["priority"]
    try:
        wait_until(lambda: b.queues()["HighPriorityQueue"]["readers"] == 0, what="deployed")
        low = [Begin("Client", "LowPriority", "JobContract") for _ in range(150)]
        b.apply([*low, *(Send(op.handle, "Job", b'{"job": "low"}') for op in low)])
        high = [Begin("Client", "HighPriority", "JobContract") for _ in range(20)]
        b.apply([*high, *(Send(op.handle, "Job", b'{"job": "high"}') for op in high)])

        wait_until(lambda: processed(b, "HighPriorityQueue") == 20, what="the urgent jobs")
        assert b.queues()["LowPriorityQueue"]["depth"] > 0  # the backlog is still there
        assert b.queues()["LowPriorityQueue"]["readers"] <= 1
        wait_until(
            lambda: processed(b, "LowPriorityQueue") == 150,
            timeout=60,
            what="the backlog, in its own time",
        )
    finally:
        for broker in brokers.values():
            broker.stop()
