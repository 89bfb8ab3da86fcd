"""One client, several calls in flight on the same dialogs: the broker applies them in the order
the client issued them, so every conversation's messages arrive in the order they were sent, also
when the broker restarts in the middle and the calls in flight are retried."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable

import pytest
import ray

from actors import Begin, Queue, Send, Service
from tests.polling import wait_until

DIALOGS = 10
PER_CALL = 100  # bodies per dialog per call: each call sends DIALOGS * PER_CALL messages
IN_FLIGHT = 5  # as many as Kafka's idempotent producer keeps in order


def _key(body: bytes) -> tuple[int, int]:
    return struct.unpack(">II", body)


def _late(keys: list[tuple[int, int]]) -> int:
    """How many messages arrived after one sent later than them on the same conversation."""
    late, most = 0, (-1, -1)
    for key in keys:
        if key < most:
            late += 1
        most = max(most, key)
    return late


def _dialogs(broker) -> list[str]:
    broker.create(Queue("InitiatorQueue"))
    broker.create(Queue("TargetQueue"))
    broker.create(Service("Initiator", "InitiatorQueue"))
    broker.create(Service("Target", "TargetQueue", ["DEFAULT"]))
    return broker.apply([Begin("Initiator", "Target") for _ in range(DIALOGS)])["handles"]


async def _send(
    broker, handles: list[str], calls: int, after: Callable[[int], None] = lambda call: None
) -> None:
    """Keep IN_FLIGHT calls in flight, issuing call 0, 1, 2, ... in turn (tasks start in the
    order they are created, and each issues its call before it first waits); every call sends
    PER_CALL messages on every dialog. `after(call)` runs once a call is issued."""
    pending: set[asyncio.Future] = set()
    for call in range(calls):
        if len(pending) >= IN_FLIGHT:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for d in done:
                d.result()
        bodies = [struct.pack(">II", call, j) for j in range(PER_CALL)]
        pending.add(asyncio.ensure_future(broker.aio.apply([Send(handles, "DEFAULT", bodies)])))
        await asyncio.sleep(0)  # let it issue its call
        after(call)
    for d in await asyncio.gather(*pending):
        assert d["sent"] == DIALOGS * PER_CALL


def _receive_and_check(broker, calls: int) -> None:
    """Receive everything; per conversation, nothing out of order, lost or doubled."""
    messages = calls * DIALOGS * PER_CALL
    seen: dict[str, list[tuple[int, int]]] = {}
    received = 0
    while received < messages:
        groups = broker.receive("TargetQueue", max_groups=DIALOGS, wait=5.0)
        assert groups, f"only {received:,} of {messages:,} messages arrived"
        for g in groups:
            for m in g.messages:
                seen.setdefault(m.conversation_id, []).append(_key(m.body))
                received += 1
        broker.commit(groups)

    out_of_order = sum(_late(keys) for keys in seen.values())
    expected = sorted((c, j) for c in range(calls) for j in range(PER_CALL))
    assert len(seen) == DIALOGS
    assert out_of_order == 0, f"{out_of_order:,} messages out of order of {messages:,}"
    for keys in seen.values():
        assert sorted(keys) == expected  # none lost, none doubled


@pytest.mark.slow
def test_pipelined_calls_on_shared_dialogs_are_applied_in_issue_order(make_broker):
    broker = make_broker()
    handles = _dialogs(broker)
    calls = 200_000 // (DIALOGS * PER_CALL)
    asyncio.run(_send(broker, handles, calls))
    _receive_and_check(broker, calls)


@pytest.mark.slow
def test_pipelined_calls_keep_their_order_when_the_broker_restarts_in_the_middle(make_broker):
    """The calls in flight fail together and are retried, each on its own backoff: the restarted
    broker knows from the client's floor which of them to wait for."""
    broker = make_broker()
    handles = _dialogs(broker)
    pid_before = broker.info()["pid"]
    calls = 60

    def kill_midway(call: int) -> None:
        if call == calls // 2:
            ray.kill(broker.actor, no_restart=False)  # Ray restarts it; it reopens its store

    asyncio.run(_send(broker, handles, calls, kill_midway))
    # it really restarted (Ray's kill lands when it lands: on a loaded machine, possibly only
    # after the last call was answered, so wait for it rather than assume it)
    wait_until(lambda: broker.info()["pid"] != pid_before, what="the broker's restart")
    _receive_and_check(broker, calls)
