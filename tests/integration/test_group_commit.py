"""Many small callers on a broker actor: their calls travel together and commit together, each
answered on its own; a broker killed mid-group loses none of the answered calls and applies
none twice. A real Ray broker on a real SQLite file."""

from __future__ import annotations

import asyncio

import ray

from actors import Begin, Queue, Send, Service
from actors.errors import UnknownMessageType


def _dialogs(broker, n: int) -> list[str]:
    broker.create(Queue("InitiatorQueue"))
    broker.create(Queue("TargetQueue"))
    broker.create(Service("Initiator", "InitiatorQueue"))
    broker.create(Service("Target", "TargetQueue", ["DEFAULT"]))
    return broker.apply([Begin("Initiator", "Target") for _ in range(n)])["handles"]


def _drain(broker) -> dict[str, list[bytes]]:
    """Every waiting message by conversation, in sequence order, committed."""
    got: dict[str, list[bytes]] = {}
    while groups := broker.receive("TargetQueue", max_groups=100):
        for g in groups:
            for m in g.messages:
                got.setdefault(m.conversation_id, []).append(m.body)
        broker.commit(groups)
    return got


def test_concurrent_small_callers_share_calls_and_one_with_bad_input_fails_alone(make_broker):
    broker = make_broker()
    handles = _dialogs(broker, 100)

    async def clients():
        async def client(i: int, h: str) -> dict:
            mt = "NoSuchType" if i == 42 else "DEFAULT"
            return await broker.aio.apply([Send(h, mt, [f"{i}".encode()])])

        answers = await asyncio.gather(
            *(client(i, h) for i, h in enumerate(handles)), return_exceptions=True
        )
        return answers, broker.aio._coalescer().batches

    answers, batches = asyncio.run(clients())
    failed = {i: a for i, a in enumerate(answers) if isinstance(a, Exception)}
    assert list(failed) == [42] and isinstance(failed[42], UnknownMessageType)
    assert batches < len(handles) / 4  # they travelled together
    got = _drain(broker)
    assert sorted(b for bodies in got.values() for b in bodies) == sorted(
        f"{i}".encode() for i in range(100) if i != 42
    )
    assert broker.apply([Send(handles[42], "DEFAULT", [b"again"])])  # its dialog carries on


def test_a_broker_killed_after_a_group_commits_answers_every_caller_once(make_broker):
    broker = make_broker()
    handles = _dialogs(broker, 50)
    ray.get(broker.actor.arm_failpoint.remote("exit_after_commit"))
    pid = broker.info()["pid"]

    async def clients():
        async def client(h: str) -> dict:
            # two calls each, the second after the first was answered (by whichever incarnation)
            await broker.aio.apply([Send(h, "DEFAULT", [b"one"])])
            return await broker.aio.apply([Send(h, "DEFAULT", [b"two"])])

        return await asyncio.gather(*(client(h) for h in handles))

    answers = asyncio.run(clients())
    assert len(answers) == 50 and broker.info()["pid"] != pid  # it died mid-way and came back
    got = _drain(broker)
    assert len(got) == 50 and all(bodies == [b"one", b"two"] for bodies in got.values())
