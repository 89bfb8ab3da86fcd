"""The direct channel on a real broker actor: a handle's calls go over it once it is open (sync
and async alike), errors arrive as themselves, and a lock holder whose receive went over it is
still watched by its Ray token, so its death releases its locks. (A broker killed under a stream
of channel calls is tests/integration/test_crash.py.)"""

from __future__ import annotations

import asyncio
import os

import pytest
import ray

from actors import Broker, Send
from actors.errors import ConversationNotFound
from actors.remote.client import direct_allowed
from actors.service.channel import UNTICKETED_PER_SOURCE
from tests.integration.test_holders import LEASE, define, wait_until_receivable
from tests.polling import apoll, wait_until


def channels(b: Broker) -> dict[str, int]:
    return b.info()["channels"]


# Ray runs the broker on uvloop when it is installed (a dependency), else on asyncio's loop
LOOPS = {"uvloop": {}, "asyncio": {"runtime_env": {"env_vars": {"RAY_USE_UVLOOP": "0"}}}}


@pytest.mark.parametrize("loop", LOOPS)
def test_a_handles_calls_go_over_its_direct_channel_sync_and_async(make_broker, loop):
    b = make_broker(**LOOPS[loop])
    assert b.info()["event_loop"] == loop
    define(b)
    wait_until(lambda: channels(b)["open"] >= 1, what="the sync handle's channel to open")
    before = channels(b)["calls"]
    handle = b.begin_dialog("S", "S", "C")
    b.apply([Send(handle, "M", b"one")])
    with pytest.raises(ConversationNotFound):  # the broker's error, as itself
        b.apply([Send("0" * 32, "M", b"nobody")])
    got = b.receive("Q", max_groups=10)
    b.commit(got)
    assert sorted(m.body for g in got for m in g.messages) == [b"one", b"work", b"work", b"work"]
    # begin, two applies, receive, commit: each one call over the channel (+ this info call)
    assert channels(b)["calls"] - before == 6

    async def concurrent() -> list:
        await asyncio.gather(*(b.aio.apply([Send(handle, "M", b"%d" % i)]) for i in range(50)))
        groups = await b.aio.receive("Q", max_groups=10)
        await b.aio.commit(groups)
        return [m.body for g in groups for m in g.messages]

    async def on_channel() -> tuple[list, int]:
        await b.aio.info()  # a new loop's first call opens its channel
        await apoll(lambda: channels(b)["open"] >= 2, "this loop's channel to open")
        before = channels(b)["calls"]
        bodies = await concurrent()
        return bodies, channels(b)["calls"] - before

    bodies, calls = asyncio.run(on_channel())
    assert bodies == [b"%d" % i for i in range(50)]
    assert 3 <= calls < 50  # over the channel, the 50 applies coalesced into a few calls
    assert b.queues()["Q"]["depth"] == 0


@ray.remote(max_restarts=0, max_task_retries=0)
class Holder:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def ping(self) -> None:
        self.broker.info()

    def take(self, groups: int) -> int:
        return len(self.broker.receive("Q", max_groups=groups, lease=LEASE))

    def die(self) -> None:
        os._exit(1)


def test_a_holder_that_took_over_its_channel_and_died_loses_its_locks(make_broker):
    b = make_broker()
    define(b)
    wait_until(lambda: channels(b)["open"] >= 1, what="the driver's channel to open")
    holder = Holder.remote(b)

    def holder_connected() -> bool:  # its ping went over its channel (+1 for this info call)
        before = channels(b)["calls"]
        ray.get(holder.ping.remote())
        return channels(b)["calls"] - before == 2

    wait_until(holder_connected, what="the holder's channel to open")
    before = channels(b)["calls"]
    assert ray.get(holder.take.remote(2)) == 2
    assert channels(b)["calls"] - before == 2  # the take (and this info call) went over it
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(holder.die.remote())

    wait_until_receivable(b, 3)  # its token, carried by the channel's ticket, was watched
    wait_until(lambda: channels(b)["open"] == 1, what="the dead holder's connection to close")


def test_direct_channels_are_off_when_asked_or_under_tls(monkeypatch):
    monkeypatch.delenv("RAYBROKER_DIRECT", raising=False)
    monkeypatch.delenv("RAY_USE_TLS", raising=False)
    assert direct_allowed()
    monkeypatch.setenv("RAYBROKER_DIRECT", "0")
    assert not direct_allowed()
    monkeypatch.setenv("RAYBROKER_DIRECT", "1")
    monkeypatch.setenv("RAY_USE_TLS", "1")
    assert not direct_allowed()


def test_with_direct_channels_off_calls_go_through_ray(make_broker, monkeypatch):
    monkeypatch.setenv("RAYBROKER_DIRECT", "0")
    b = make_broker()
    define(b)

    async def calls() -> list:
        await asyncio.gather(*(b.aio.info() for _ in range(5)))
        got = await b.aio.receive("Q", max_groups=10)
        await b.aio.commit(got)
        return got

    assert len(asyncio.run(calls())) == 3
    assert channels(b) == {"open": 0, "calls": 0, "refused": 0}


def test_a_receive_under_a_lock_its_caller_holds_goes_over_the_channel_too(make_broker):
    """Were its answer lost there, the retry would get that answer again (actors.service.replies),
    not read on past what it carried."""
    b = make_broker()
    define(b)
    wait_until(lambda: channels(b)["open"] >= 1, what="the sync handle's channel to open")
    group_id, lock_id = b.get_conversation_group("Q")
    before = channels(b)["calls"]
    got = b.receive("Q", lock=lock_id)
    assert channels(b)["calls"] - before == 2  # the receive, and this info call
    assert [g.lock_id for g in got] == [lock_id] and [m.body for m in got[0].messages] == [b"work"]
    b.commit(got)


def _flood(b: Broker, host: str, port: int, connections: int, wave: int = 500) -> None:
    """`connections` TCP connections to the channel's port that never show a ticket, `wave` held
    open at a time (as a client that connects and says nothing), each wave until the broker has
    turned away all of it but the few one address may keep waiting."""
    import socket

    for start in range(0, connections, wave):
        held = []
        refused = channels(b)["refused"]
        for _ in range(min(wave, connections - start)):
            s = socket.socket()
            s.settimeout(5)
            try:
                s.connect((host, port))
            except OSError:  # refused, or the backlog full for a moment: it tried
                s.close()
                continue
            held.append(s)
        turned_away = refused + len(held) - UNTICKETED_PER_SOURCE
        wait_until(
            lambda n=turned_away: channels(b)["refused"] >= n,
            what=f"the broker to close all but {UNTICKETED_PER_SOURCE} of {len(held)} connections",
        )
        for s in held:
            s.close()


def test_a_flood_of_connections_without_a_ticket_leaves_callers_served_and_memory_as_it_was(
    make_broker,
):
    import psutil

    b = make_broker()
    define(b)
    wait_until(lambda: channels(b)["open"] >= 1, what="the sync handle's channel to open")
    host, port, _ticket = ray.get(b.actor.open_channel.remote([None]))
    broker = psutil.Process(b.info()["pid"])
    before = broker.memory_info().rss

    _flood(b, host, port, 3000)

    # every connection past the cap was closed at once (_flood waited for it), and those
    # waiting for a ticket in time
    flood = channels(b)
    assert flood["refused"] >= 3000 - 6 * UNTICKETED_PER_SOURCE - 8, flood  # 6 waves
    # a caller still gets its answers: the open channel's, and a new loop's (a new connection,
    # or through Ray while the cap is full)
    got = b.receive("Q", max_groups=10)
    b.commit(got)

    async def fresh_loop() -> dict:
        return await b.aio.info()

    assert asyncio.run(fresh_loop())["name"] == b.name
    # and the broker's memory comes back to what it was (the issue: +122 MiB for 1,900 of them)
    wait_until(
        lambda: broker.memory_info().rss <= 1.1 * before,
        timeout=30,
        what=f"the broker's RSS back within 10% of {before:,} bytes",
    )
    assert [m.body for g in got for m in g.messages] == [b"work"] * 3
