"""Kill the broker in the middle of a stream: nothing is lost, nothing is processed twice, and every
dialog's messages are processed in order."""

from __future__ import annotations

import json
import threading

import pytest
import ray

from actors import Begin, Queue, Send, Service
from actors.errors import BrokerUnavailable, LockNotHeld
from tests.polling import wait_until

DIALOGS = 100
PER_DIALOG = 100  # 10,000 messages


@ray.remote(num_cpus=0)
class CountingReader:
    """Receives groups, counts each message into its group's state, checks sequence order, and
    commits the new state with the receive, so a count is kept exactly when the message is
    removed from the queue."""

    def __init__(self, broker) -> None:
        self.broker = broker
        self.running = True
        self.turns = 0

    async def run(self) -> int:
        held = []
        states: dict[str, bytes] = {}
        while self.running:
            try:
                groups = await self.broker.aio.receive(
                    "TargetQueue", max_groups=4, wait=0.2, commit=held, states=states
                )
            except (LockNotHeld, BrokerUnavailable):
                groups = []  # the broker restarted: those receives were rolled back
            held, states = groups, {}
            for g in groups:
                state = json.loads(g.state) if g.state else {"count": 0, "last": -1, "bad": 0}
                for m in g.messages:
                    if m.sequence_number != state["last"] + 1:
                        state["bad"] += 1
                    state["last"] = m.sequence_number
                    state["count"] += 1
                states[g.group_id] = json.dumps(state).encode()
            self.turns += 1
        if held:
            await self.broker.aio.commit(held, states=states)
        return self.turns

    def stop(self) -> None:
        self.running = False


@pytest.mark.slow
def test_killing_the_broker_mid_stream_loses_and_doubles_nothing(make_broker):
    broker = make_broker(lease_s=10.0)
    broker.create(Queue("InitiatorQueue"))
    broker.create(Queue("TargetQueue"))
    broker.create(Service("Initiator", "InitiatorQueue"))
    broker.create(Service("Target", "TargetQueue", ["DEFAULT"]))
    handles = broker.apply([Begin("Initiator", "Target") for _ in range(DIALOGS)])["handles"]
    pid_before = broker.info()["pid"]

    readers = [CountingReader.remote(broker) for _ in range(3)]
    runs = [r.run.remote() for r in readers]
    rounds_sent = 0

    def send_stream() -> None:
        nonlocal rounds_sent
        for n in range(PER_DIALOG):
            if n == PER_DIALOG // 3:  # mid-stream: Ray restarts it; it reopens its store
                ray.kill(broker.actor, no_restart=False)
            body = json.dumps({"n": n}).encode()
            broker.apply([Send(h, "DEFAULT", body) for h in handles])
            rounds_sent = n + 1

    # the driver's and the readers' calls go over direct channels (actors.client.channel), which the
    # kill breaks under them: their calls then go through Ray, and the channels open again
    wait_until(lambda: broker.info()["channels"]["open"] >= 4, what="four channels to open")
    sender = threading.Thread(target=send_stream)
    sender.start()
    sender.join(timeout=300)
    assert not sender.is_alive() and rounds_sent == PER_DIALOG

    def all_counted():
        groups = broker.groups("TargetQueue")
        done = sum(json.loads(g["state"])["count"] for g in groups if g["state"])
        return done >= DIALOGS * PER_DIALOG and groups

    groups = wait_until(all_counted, timeout=180, what="every message to be committed")
    wait_until(lambda: broker.info()["channels"]["open"] >= 4, what="the channels to reopen")
    for r in readers:
        r.stop.remote()
    ray.get(runs)

    assert broker.info()["pid"] != pid_before  # the broker really was restarted
    states = [json.loads(g["state"]) for g in groups]
    assert len(states) == DIALOGS
    assert all(s == {"count": PER_DIALOG, "last": PER_DIALOG - 1, "bad": 0} for s in states)
    assert broker.queues()["TargetQueue"]["depth"] == 0
    records = broker.audit(limit=1 << 30)["records"]
    delivered = {(r["conversation_id"], r["sequence_number"]) for r in records}
    assert len(records) == len(delivered) == DIALOGS * PER_DIALOG  # once each, none twice


def _one_dialog(broker):
    broker.create(Queue("InitiatorQueue"))
    broker.create(Queue("TargetQueue"))
    broker.create(Service("Initiator", "InitiatorQueue"))
    broker.create(Service("Target", "TargetQueue", ["DEFAULT"]))
    return broker.begin_dialog("Initiator", "Target")


def test_a_send_whose_reply_is_lost_in_a_crash_is_applied_once(make_broker):
    broker = make_broker()
    h = _one_dialog(broker)
    ray.get(broker.actor.arm_failpoint.remote("exit_after_commit"))
    broker.apply([Send(h, "DEFAULT", [b"a", b"b"])])  # the process dies after committing
    assert broker.queues()["TargetQueue"]["depth"] == 2
    [g] = broker.receive("TargetQueue")
    assert [m.body for m in g.messages] == [b"a", b"b"]


def test_a_commit_whose_reply_is_lost_in_a_crash_is_applied_once(make_broker):
    broker = make_broker()
    h = _one_dialog(broker)
    broker.send(h, "DEFAULT", b"a")
    [g] = broker.receive("TargetQueue")
    t = g.messages[0].conversation_handle
    ray.get(broker.actor.arm_failpoint.remote("exit_after_commit"))
    broker.commit(g, ops=[Send(t, "DEFAULT", b"reply")], states={g.group_id: b"done"})
    assert broker.queues()["TargetQueue"]["depth"] == 0
    [reply] = broker.receive("InitiatorQueue")
    assert [m.body for m in reply.messages] == [b"reply"]  # sent once
    assert len(broker.audit()["records"]) == 1
    [state] = [x["state"] for x in broker.groups("TargetQueue")]
    assert state == b"done"
