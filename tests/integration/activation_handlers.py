"""Handlers for the activation integration tests (importable as tests.integration.*)."""

from __future__ import annotations

import json
import os
import threading
import time

import ray

RECORDER = "activation-recorder"
RECORDER_NAMESPACE = "raybroker-tests"


@ray.remote(num_cpus=0)
class Recorder:
    """Collects (group, reader pid, start, end) for every handler call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, float, float]] = []

    def add(self, call: tuple[str, int, float, float]) -> None:
        self.calls.append(call)

    def all(self) -> list[tuple[str, int, float, float]]:
        return self.calls


def order_entry(group, ctx) -> None:
    """An order's header and lines arrive on several dialogs of one group: a line processed
    before its order's header is counted as out of order. Each call is recorded, so a test can
    check that no two readers ever held one group at the same time."""
    start = time.time()
    state = json.loads(ctx.state) if ctx.state else {"header": False, "lines": 0, "bad": 0}
    for m in group.messages:
        if m.body.startswith(b"header"):
            state["header"] = True
        elif m.body.startswith(b"line"):
            state["bad"] += not state["header"]
            state["lines"] += 1
    ctx.set_state(json.dumps(state).encode())
    time.sleep(0.002)  # a little work, so that readers overlap in time
    recorder = ray.get_actor(RECORDER, namespace=RECORDER_NAMESPACE)
    ray.get(recorder.add.remote((group.group_id, os.getpid(), start, time.time())))


def always_fail(group, ctx) -> None:
    raise RuntimeError("this message can never be processed")


def hang(group, ctx) -> None:
    """A handler that never returns (in test time)."""
    threading.Event().wait(600)


def reply_to_orders(group, ctx) -> None:
    """A regional sales service: answers every Order with a Reply carrying the same body."""
    for m in group.messages:
        if m.message_type == "Order":
            ctx.send(m.conversation_handle, "Reply", m.body)
