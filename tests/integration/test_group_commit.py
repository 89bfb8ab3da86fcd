"""Many small callers on a broker actor: their calls travel together and commit together, each
answered on its own; a broker killed mid-group loses none of the answered calls and applies
none twice. A real Ray broker on a real SQLite file."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import ray

from actors import Begin, Queue, Send, Service
from actors.calls.ordering import Issuer
from actors.client.calloop import call_loop
from actors.errors import UnknownMessageType
from actors.remote.client import lock_holder
from tests.polling import apoll


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


def test_threads_sharing_a_sync_handle_share_calls_and_one_with_bad_input_fails_alone(
    make_broker,
):
    broker = make_broker()
    handles = _dialogs(broker, 100)
    start = threading.Barrier(len(handles), timeout=60)
    answers: dict[int, object] = {}

    def client(i: int, h: str) -> None:
        start.wait()
        try:
            mt = "NoSuchType" if i == 42 else "DEFAULT"
            answers[i] = broker.apply([Send(h, mt, [b"%d" % i])])
        except Exception as exc:  # noqa: BLE001 - the answer under test
            answers[i] = exc

    before = _sync_batches(broker)
    _run_threads([(client, (i, h)) for i, h in enumerate(handles)])
    failed = {i: a for i, a in answers.items() if isinstance(a, Exception)}
    assert len(answers) == 100 and list(failed) == [42], failed
    assert isinstance(failed[42], UnknownMessageType)
    # the 100 applies went as a few actor calls, not one each
    assert 0 < _sync_batches(broker) - before < len(handles) / 4

    # readers on short waits, several at a time on the same handle, take every message once;
    # a wait that runs out as messages are taken for it hands them back, without poison
    received: list[bytes] = []

    def reader() -> None:
        groups: list = []
        while groups or broker.queues()["TargetQueue"]["depth"]:
            groups = broker.receive("TargetQueue", wait=0.05, commit=groups, max_groups=5)
            received.extend(m.body for g in groups for m in g.messages)

    _run_threads([(reader, ())] * 10)
    assert sorted(received) == sorted(b"%d" % i for i in range(100) if i != 42)  # each once
    queue = broker.queues()["TargetQueue"]
    assert queue["enabled"] and queue["rollbacks_in_a_row"] == 0, queue


def test_what_is_given_back_returns_to_the_queue_without_counting_toward_poison(make_broker):
    broker = make_broker()
    broker.create(Queue("Q", poison_limit=2))
    broker.create(Service("S", "Q", ["DEFAULT"]))
    broker.create(Service("Init", "Q"))
    [h] = broker.apply([Begin("Init", "S")])["handles"]
    broker.send(h, "DEFAULT", b"m")
    issuer = Issuer()  # the verb as the coalescer sends it, on the wire
    for _ in range(4):  # twice the poison limit
        [group] = broker.receive("Q")
        seq = issuer.issue()
        call = broker.actor.call.remote(issuer.order(seq), "give_back", [group.lock_id])
        assert ray.get(call) == 1
        issuer.answered(seq)
    queue = broker.queues()["Q"]
    assert queue["enabled"] and queue["rollbacks_in_a_row"] == 0, queue
    [group] = broker.receive("Q")
    assert [m.body for m in group.messages] == [b"m"]  # the same message, waiting again
    broker.commit(group)


def test_a_lone_receive_whose_caller_left_gives_back_what_the_broker_then_took(make_broker):
    """A sync handle's receive goes alone over the call loop (`aio.one_call`); its caller's
    KeyboardInterrupt cancels it there. One cancelled while it waits at the broker: what the
    broker takes for it when a message comes goes back to the queue at once, not when its
    lease runs out, and counts toward no poison limit."""
    broker = make_broker()
    broker.create(Queue("Q", poison_limit=1))
    broker.create(Service("S", "Q", ["DEFAULT"]))
    broker.create(Service("Init", "Q"))
    [h] = broker.apply([Begin("Init", "S")])["handles"]
    options = {"max_groups": 1, "top": None, "group_id": None, "handle": None, "lease_s": 300.0}

    async def leave_while_it_waits(body: bytes) -> list:
        args = ("Q", 120.0, options, lock_holder(), None, None)
        receive = asyncio.ensure_future(broker.aio.one_call("receive", args, None))
        await asyncio.sleep(0)  # a yield: it starts, and its call is numbered first
        await broker.aio.queues()  # answered once the receive has started at the broker
        receive.cancel()  # its caller leaves while it waits there
        with contextlib.suppress(asyncio.CancelledError):
            await receive
        await broker.aio.send(h, "DEFAULT", body)  # taken for the departed receive
        deadline = time.monotonic() + 30  # far inside its 300 s lease
        while not (groups := await broker.aio.receive("Q", wait=0.5)):
            assert time.monotonic() < deadline, "what it took did not come back"
        return groups

    for body in (b"one", b"two"):  # twice the poison limit
        [group] = asyncio.run(leave_while_it_waits(body))
        assert [m.body for m in group.messages] == [body]
        broker.commit(group)
    queue = broker.queues()["Q"]
    assert queue["enabled"] and queue["rollbacks_in_a_row"] == 0, queue


def _run_threads(work: list) -> None:
    threads = [threading.Thread(target=fn, args=args, daemon=True) for fn, args in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "threads still running after 120 s"


def _sync_batches(broker) -> int:
    """Batches the sync handle's coalescer (on this process's call loop) has sent."""
    coalescer = broker.aio._coalescers.get(call_loop().loop)
    return 0 if coalescer is None else coalescer.batches


def test_waiting_async_receives_get_what_arrives_in_the_round_trip_that_brings_it(make_broker):
    """The broker takes for a handle's waiting receives as messages come (actors.client.coalesce):
    no receive of theirs goes after the one that found nothing."""
    broker = make_broker()
    handles = _dialogs(broker, 5)

    async def main():
        coalescer = broker.aio._coalescer()
        readers = [
            asyncio.ensure_future(broker.aio.receive("TargetQueue", wait=30)) for _ in handles
        ]
        watch = await apoll(lambda: coalescer._watches.get("TargetQueue"), "a watch")
        await apoll(lambda: watch.waiting == len(handles), "every reader to wait")
        before = coalescer.batches  # the readers' receives (that found nothing) went in these
        await broker.aio.apply([Send(h, "DEFAULT", [h.encode()]) for h in handles])
        got = await asyncio.wait_for(asyncio.gather(*readers), 30)
        await broker.aio.commit([g for groups in got for g in groups])
        return got, coalescer.batches - before

    got, batches = asyncio.run(main())
    assert sorted(m.body for groups in got for g in groups for m in g.messages) == sorted(
        h.encode() for h in handles
    )
    assert batches == 2  # the send and the commit: no reader asked again
    assert broker.receive("TargetQueue") == []  # all committed


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
