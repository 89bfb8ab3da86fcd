"""`actors.calls.ordering`: one client's calls start in the order it issued them, however they
arrive, and a lost call, a restarted broker or a cancelled call never blocks the ones after it for
long."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import struct
import threading
from pathlib import Path

import pytest

from actors import LocalBroker, Queue, Send, Service
from actors.calls.envelope import Begin, pack_ops
from actors.calls.ordering import Issuer, Sequencer, check_order
from actors.client import verbs
from actors.errors import InvalidArgument
from actors.ids import new_request_id
from actors.service.calls import CLIENT_VERBS
from tests.fakes import FakeClock


async def _arrive(seqr: Sequencer, calls: list[tuple[str, int, int]], started: list) -> None:
    """The calls reach the broker in the given order; each records itself when it starts."""

    async def one(order: tuple[str, int, int]) -> None:
        await seqr.turn(order)
        started.append(order[1])

    await asyncio.gather(*(one(o) for o in calls))


def test_calls_arriving_out_of_order_start_in_the_order_the_client_numbered_them():
    seqr, started = Sequencer(), []
    arrival = [3, 1, 0, 4, 2, 5]
    asyncio.run(_arrive(seqr, [("c", n, 0) for n in arrival], started))
    assert started == [0, 1, 2, 3, 4, 5]
    assert seqr.skipped == 0


def test_a_call_in_its_turn_starts_at_once_and_a_late_or_repeated_number_too():
    seqr = Sequencer()
    assert seqr.admit("c", 0, 0) and seqr.admit("c", 1, 0)
    assert not seqr.admit("c", 3, 2)  # 2 has not started yet
    assert seqr.admit("c", 1, 0)  # a retry of a call that started: at once (its request id dedups)


def test_a_call_that_waits_inside_does_not_hold_back_the_calls_after_it():
    """The turn passes when a call starts, not when it ends (a long-poll receive waits for
    messages a later call sends)."""

    async def scenario() -> list[str]:
        seqr, log = Sequencer(gap_s=30.0), []
        sent = asyncio.Event()

        async def long_poll() -> None:
            await seqr.turn(("c", 0, 0))
            log.append("receive started")
            await sent.wait()
            log.append("receive got it")

        async def send() -> None:
            await seqr.turn(("c", 1, 0))
            log.append("send started")
            sent.set()

        await asyncio.wait_for(asyncio.gather(long_poll(), send()), 5.0)
        return log

    assert asyncio.run(scenario()) == ["receive started", "send started", "receive got it"]


def test_clients_are_ordered_apart_and_one_clients_gap_does_not_hold_another():
    async def scenario() -> list[tuple[str, int]]:
        seqr, started = Sequencer(gap_s=30.0), []

        async def one(client: str, seq: int) -> None:
            await seqr.turn((client, seq, 0))
            started.append((client, seq))

        waiting = asyncio.ensure_future(one("a", 1))  # a's call 0 has not come
        await asyncio.wait_for(asyncio.gather(one("b", 1), one("b", 0)), 5.0)
        assert not waiting.done()
        await one("a", 0)
        await asyncio.wait_for(waiting, 5.0)
        return started

    assert asyncio.run(scenario()) == [("b", 0), ("b", 1), ("a", 0), ("a", 1)]


def test_a_lost_predecessor_is_given_up_after_the_gap_and_the_rest_keep_their_order():
    seqr, started = Sequencer(gap_s=0.05), []
    asyncio.run(asyncio.wait_for(_arrive(seqr, [("c", 3, 0), ("c", 2, 0)], started), 5.0))
    assert started == [2, 3]
    assert seqr.skipped == 2  # 0 and 1 never came
    assert seqr.admit("c", 0, 0)  # if one comes after all, it is late: it starts at once


def test_a_broker_that_does_not_know_the_client_starts_at_its_floor():
    """A restarted broker (a new Sequencer) waits for the unanswered calls below, not for 0."""
    seqr, started = Sequencer(gap_s=30.0), []
    calls = [("c", 7, 5), ("c", 5, 5), ("c", 6, 5)]  # retries of 5 and 6 come after 7
    asyncio.run(asyncio.wait_for(_arrive(seqr, calls, started), 5.0))
    assert started == [5, 6, 7]
    assert seqr.skipped == 0


def test_a_floor_above_the_expected_number_releases_the_waiting_calls_in_order():
    """The client was answered for every call below its floor (by an earlier incarnation):
    nothing below it is worth waiting for."""

    async def scenario() -> list[int]:
        seqr, started = Sequencer(gap_s=30.0), []
        seqr.admit("c", 0, 0)  # next is 1; 1 and 2 are lost (answered by another incarnation)

        async def one(seq: int, floor: int) -> None:
            await seqr.turn(("c", seq, floor))
            started.append(seq)

        first = asyncio.ensure_future(one(3, 1))
        await asyncio.sleep(0)  # it waits for 1
        assert not first.done()
        await asyncio.wait_for(asyncio.gather(first, one(4, 3)), 5.0)
        return started

    assert asyncio.run(scenario()) == [3, 4]


def test_a_call_cancelled_at_its_turn_passes_the_turn_on():
    async def scenario() -> list[int]:
        seqr, started = Sequencer(gap_s=30.0), []

        async def one(seq: int) -> None:
            await seqr.turn(("c", seq, 0))
            started.append(seq)

        one_task = asyncio.ensure_future(one(1))
        two_task = asyncio.ensure_future(one(2))
        await asyncio.sleep(0)
        await one(0)  # 1 is released, but is cancelled before it runs
        one_task.cancel()
        await asyncio.wait_for(two_task, 5.0)  # not the 30 s gap
        with contextlib.suppress(asyncio.CancelledError):
            await one_task
        return started

    started = asyncio.run(scenario())
    assert started[0] == 0 and 2 in started and started == sorted(started)


def test_a_call_cancelled_while_waiting_is_a_lost_call_the_gap_rule_steps_over():
    async def scenario() -> tuple[list[int], int]:
        seqr, started = Sequencer(gap_s=0.05), []

        async def one(seq: int) -> None:
            await seqr.turn(("c", seq, 0))
            started.append(seq)

        one_task = asyncio.ensure_future(one(1))
        await asyncio.sleep(0)
        one_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await one_task
        await asyncio.wait_for(asyncio.gather(one(2), one(0)), 5.0)
        return started, seqr.skipped

    assert asyncio.run(scenario()) == ([0, 2], 1)


def test_idle_clients_are_forgotten_and_a_forgotten_client_starts_again_at_its_floor():
    clock = FakeClock()
    seqr = Sequencer(idle_s=60.0, clock=clock)
    assert seqr.admit("old", 0, 0) and seqr.admit("old", 1, 0)
    clock.advance(61.0)
    assert seqr.admit("new", 0, 0)
    assert seqr.clients() == 1  # "old" went when a new client came
    assert seqr.admit("old", 9, 9)  # every call below 9 was answered: 9 goes first


@pytest.mark.parametrize(
    "order",
    [None, ("c", 1), ("c", "1", 0), ("", 1, 0), ("c" * 65, 1, 0), ("c", 1, 2), ("c", -1, -1)],
)
def test_a_malformed_order_is_refused_and_touches_no_client(order):
    seqr = Sequencer()
    with pytest.raises(InvalidArgument, match="client id"):
        asyncio.run(seqr.turn(order))
    with pytest.raises(InvalidArgument):
        check_order(order)
    assert seqr.clients() == 0


def test_the_issuer_numbers_calls_and_its_floor_is_the_lowest_unanswered_call():
    a, b = Issuer(), Issuer()
    assert a.client != b.client
    s0, s1, s2 = a.issue(), a.issue(), a.issue()
    assert (s0, s1, s2) == (0, 1, 2)
    assert a.order(s2) == (a.client, 2, 0)
    a.answered(s1)
    assert a.order(s2)[2] == 0  # 0 is still unanswered
    a.answered(s0)
    assert a.order(s2)[2] == 2
    a.answered(s2)
    assert a.order(a.issue()) == (a.client, 3, 3)


def test_the_issuer_is_safe_to_share_between_threads():
    issuer, got = Issuer(), []

    def work() -> None:
        for _ in range(2000):
            seq = issuer.issue()
            client, n, floor = issuer.order(seq)
            assert floor <= n == seq
            got.append(seq)
            issuer.answered(seq)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(8000))
    assert issuer.order(issuer.issue())[2] == 8000


def test_a_forked_child_numbers_its_calls_as_a_client_of_its_own():
    """Parent and child sharing one client id would take each other's calls for retries."""
    import multiprocessing

    issuer = Issuer()
    issuer.issue()  # in flight at the fork: the parent's, not the child's
    ctx = multiprocessing.get_context("fork")
    parent_end, child_end = ctx.Pipe()

    def child() -> None:
        child_end.send(issuer.order(issuer.issue()))

    proc = ctx.Process(target=child)
    proc.start()
    assert parent_end.poll(10), "the child did not answer"
    client, seq, floor = parent_end.recv()
    proc.join(10)
    assert proc.exitcode == 0
    assert client != issuer.client
    assert floor == seq  # the parent's unanswered call does not hold the child's floor
    assert issuer.order(issuer.issue())[0] == issuer.client  # the parent's id is unchanged


def _constant_args(source: str, callee: str, at: int) -> set[str]:
    """The constant string at position `at` of every call of `callee` in `source`."""
    return {
        node.args[at].value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and getattr(node.func, "attr", getattr(node.func, "id", None)) == callee
        and len(node.args) > at
        and isinstance(node.args[at], ast.Constant)
    }


def test_the_broker_takes_through_call_exactly_the_verbs_a_handle_calls():
    source = Path(verbs.__file__).parent / "verbs.py"  # (its module may run compiled)
    called = _constant_args(source.read_text(), "_call", 0)
    # and what the async handle calls itself (its waiting receives' `wait_take`); a batch
    # goes through the actor's `calls`, not `call`
    client = (Path(verbs.__file__).parents[1] / "remote" / "client.py").read_text()
    called |= _constant_args(client, "_Call", 1) - {"calls"}
    assert called == CLIENT_VERBS


def _apply(b: LocalBroker, order, ops) -> asyncio.Future:
    coro = b.service.call(order, "apply", pack_ops(ops), new_request_id())
    return asyncio.run_coroutine_threadsafe(coro, b.loop)


def test_the_service_applies_one_clients_calls_in_number_order_whatever_order_they_arrive(
    tmp_path,
):
    with LocalBroker("order", str(tmp_path / "b.sqlite")) as b:
        b.create(Queue("IQ"))
        b.create(Queue("TQ"))
        b.create(Service("I", "IQ"))
        b.create(Service("T", "TQ", ["DEFAULT"]))
        (h,) = b.apply([Begin("I", "T")])["handles"]
        arrival = [2, 0, 3, 1]  # as Ray may hand an async actor a client's pipelined calls
        sent = [
            _apply(b, ("client", n, 0), [Send(h, "DEFAULT", struct.pack(">I", n))]) for n in arrival
        ]
        for f in sent:
            assert f.result(timeout=10)["sent"] == 1
        (g,) = b.receive("TQ", max_groups=1)
        assert [struct.unpack(">I", m.body)[0] for m in g.messages] == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "method", ["close", "_failpoint", "deliver", "arm_failpoint", "nope", ["apply"], None]
)
def test_the_service_refuses_to_call_anything_but_a_client_verb(tmp_path, method):
    with LocalBroker("order", str(tmp_path / "b.sqlite")) as b:
        before = b.info()
        before.pop("uptime_s")
        coro = b.service.call(("client", 0, 0), method)
        with pytest.raises(InvalidArgument, match="not a broker verb"):
            asyncio.run_coroutine_threadsafe(coro, b.loop).result(timeout=10)
        after = b.info()
        assert after.pop("uptime_s") > 0 and after == before  # still running, unchanged
