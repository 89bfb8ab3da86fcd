"""Locks are owned: a lock holder that dies — a driver script, a Ray task's worker, a restartable
actor's incarnation — loses its locks within about `owner_check_s` + 1 s, long before its lease.
Real Ray, real broker, real processes killed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import ray

from actors import Broker, Contract, MessageType, Queue, Send, Service
from tests.polling import wait_until

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


def wait_until_receivable(b: Broker, groups: int) -> None:
    wait_until(lambda: receivable(b, groups), DEADLINE, "the dead holder's locks to be released")


def take_in_a_driver_that_exits(b: Broker, groups: int, concurrent: bool = False) -> None:
    """A driver script that receives `groups` groups with a long lease and exits holding them:
    in one receive, or (`concurrent`) in as many concurrent async receives of one group each,
    which travel as one batch naming the holder's handle once (actors.client.coalesce)."""
    receive = (
        "import asyncio\n"
        "async def take():\n"
        f"    calls = [b.aio.receive('Q', lease={LEASE}) for _ in range({groups})]\n"
        "    return [g for got in await asyncio.gather(*calls) for g in got]\n"
        "got = asyncio.run(take())\n"
        if concurrent
        else f"got = b.receive('Q', max_groups={groups}, lease={LEASE})\n"
    )
    code = (
        "import ray, sys\n"
        f"ray.init(address={ray.get_runtime_context().gcs_address!r}, logging_level='ERROR')\n"
        "from actors import start_broker\n"
        f"b = start_broker({b.name!r}, {b.info()['path']!r})\n"
        f"{receive}"
        "print(len(got))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == str(groups), out.stderr[-2000:]


@pytest.fixture
def b(make_broker) -> Broker:
    broker = make_broker()
    define(broker)
    return broker


@pytest.mark.parametrize("concurrent", [False, True], ids=["one-receive", "concurrent-receives"])
def test_a_driver_that_exits_holding_locks_loses_them(b, concurrent):
    take_in_a_driver_that_exits(b, 3, concurrent)

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

    def new_life_takes() -> int | None:  # the restarted incarnation, under its own name
        try:
            return ray.get(reader.take.remote(3))
        except ray.exceptions.RayActorError:
            return None  # still restarting

    assert wait_until(new_life_takes, DEADLINE, "the restarted actor to answer") == 3
    assert b.queues()["Q"]["locked_groups"] == 3


def test_a_live_driver_keeps_its_locks_while_a_dead_ones_are_released(b):
    got = b.receive("Q", max_groups=1, lease=LEASE)
    take_in_a_driver_that_exits(b, 2)

    # the owner checks that release the dead driver's two groups pass over this live one's
    wait_until(lambda: b.queues()["Q"]["locked_groups"] == 1, DEADLINE, "the dead driver's locks")
    assert b.commit(got)["committed"] == 1
