"""A broker actor whose dialogs outnumber its working set (`Limits.endpoint_cache`): killed in
the middle of traffic and restarted by Ray, it reads its dialogs back from its store as they are
used, delivers every message once and in order, and holds no more of them than its bound."""

from __future__ import annotations

import pytest
import ray

from actors import Begin, Queue, Send, Service
from actors.errors import LockNotHeld
from tests.polling import wait_until

CACHE = 16  # endpoints in memory; the test's dialogs have 400
DIALOGS = 200
ROUNDS = 3


@pytest.mark.slow
def test_a_broker_with_more_dialogs_than_it_holds_survives_a_kill_exactly_once(make_broker):
    broker = make_broker(limits={"endpoint_cache": CACHE})
    broker.create(Queue("InitiatorQueue"))
    broker.create(Queue("TargetQueue"))
    broker.create(Service("Initiator", "InitiatorQueue"))
    broker.create(Service("Target", "TargetQueue", ["DEFAULT"]))
    handles = broker.apply([Begin("Initiator", "Target") for _ in range(DIALOGS)])["handles"]
    pid_before = broker.info()["pid"]
    taken: list[tuple[str, int, bytes]] = []

    def take() -> int:
        groups = broker.receive("TargetQueue", max_groups=50, wait=0.2)
        if groups:
            try:
                broker.commit(groups)
            except LockNotHeld:  # received from the process the kill had not reached yet
                return len(taken)  # nothing was applied: the messages come back
            taken.extend(
                (m.conversation_id, m.sequence_number, m.body) for g in groups for m in g.messages
            )
        return len(taken)

    for n in range(ROUNDS):
        if n == 1:  # Ray restarts it; the new process reads no endpoint until one is used
            ray.kill(broker.actor, no_restart=False)
        broker.apply([Send(h, "DEFAULT", b"%d" % n) for h in handles])
        take()

    wait_until(lambda: take() >= DIALOGS * ROUNDS, timeout=120, what="every message to arrive")

    assert broker.info()["pid"] != pid_before
    assert len(taken) == len(set(taken)) == DIALOGS * ROUNDS
    by_dialog: dict[str, list[tuple[int, bytes]]] = {}
    for conversation, seq, body in taken:
        by_dialog.setdefault(conversation, []).append((seq, body))
    assert all(got == [(n, b"%d" % n) for n in range(ROUNDS)] for got in by_dialog.values())
    held = broker.info()["working_set"]
    assert held["endpoints"] <= CACHE and held["groups"] <= CACHE
    assert held["reads"] > 0 and held["evicted"] > 0  # dialogs read back and let go again
    assert broker.queues()["TargetQueue"]["depth"] == 0
