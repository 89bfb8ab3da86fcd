"""Locks are owned: a lock holder that dies — a driver script, a Ray task's worker, a restartable
actor's incarnation — loses its locks within about `owner_check_s` + 1 s, long before its lease.
Real Ray, real broker, real processes killed."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import ray

from actors import Broker, Contract, Limits, MessageType, Queue, Send, Service

LEASE = 600.0  # far beyond every deadline below: only the holder's death can release the locks
DEADLINE = 20.0


def define(b: Broker, dialogs: int = 3) -> None:
    b.create(MessageType("M"))
    b.create(Contract("C", {"M": "any"}))
    b.create(Queue("Q", poison_limit=0))  # the probes below roll back: not poison
    b.create(Service("S", "Q", ["C"]))
    handles = [b.begin_dialog("S", "S", "C") for _ in range(dialogs)]
    b.apply([Send(handles, "M", b"work")])


def receivable(b: Broker, groups: int) -> bool:
    got = b.receive("Q", max_groups=100)
    if got:
        b.rollback(got)
    return len(got) == groups


def wait_until_receivable(b: Broker, groups: int) -> float:
    t0 = time.monotonic()
    while not receivable(b, groups):
        assert time.monotonic() - t0 < DEADLINE, "the dead holder's locks were not released"
        time.sleep(0.2)
    return time.monotonic() - t0


@pytest.fixture
def b(make_broker) -> Broker:
    broker = make_broker()
    define(broker)
    return broker


def test_a_driver_that_exits_holding_locks_loses_them(b):
    code = (
        "import ray, sys\n"
        f"ray.init(address={ray.get_runtime_context().gcs_address!r}, logging_level='ERROR')\n"
        "from actors import start_broker\n"
        f"b = start_broker({b.name!r}, {b.info()['path']!r})\n"
        f"got = b.receive('Q', max_groups=100, lease={LEASE})\n"
        "print(len(got))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "3", out.stderr[-2000:]

    wait_until_receivable(b, 3)
    assert b.queues()["Q"]["locked_groups"] == 0


def test_a_task_whose_worker_dies_holding_locks_loses_them(b):
    @ray.remote(max_retries=0)
    def take_and_die(broker: Broker) -> None:
        got = broker.receive("Q", max_groups=2, lease=LEASE)
        assert len(got) == 2
        os._exit(1)

    with pytest.raises(ray.exceptions.WorkerCrashedError):
        ray.get(take_and_die.remote(b))
    assert b.queues()["Q"]["locked_groups"] in (0, 2)

    wait_until_receivable(b, 3)


@ray.remote(max_restarts=1, max_task_retries=0)
class Restartable:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def take(self, groups: int) -> int:
        return len(self.broker.receive("Q", max_groups=groups, lease=LEASE))

    def die(self) -> None:
        os._exit(1)


def test_a_restartable_actor_killed_holding_locks_loses_them_and_its_new_life_reads_on(b):
    reader = Restartable.remote(b)
    assert ray.get(reader.take.remote(2)) == 2
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(reader.die.remote())

    wait_until_receivable(b, 3)
    deadline = time.monotonic() + DEADLINE
    while True:  # the restarted incarnation answers and takes groups under its own name
        try:
            assert ray.get(reader.take.remote(3)) == 3
            break
        except ray.exceptions.RayActorError:
            assert time.monotonic() < deadline
            time.sleep(0.2)
    assert b.queues()["Q"]["locked_groups"] == 3


def test_a_live_driver_keeps_its_locks(b):
    got = b.receive("Q", max_groups=3, lease=LEASE)
    deadline = time.monotonic() + 3 * Limits().owner_check_s + 2
    while time.monotonic() < deadline:  # several owner checks pass; the locks stay
        assert b.queues()["Q"]["locked_groups"] == 3
        time.sleep(0.2)
    assert b.commit(got)["committed"] == 3
