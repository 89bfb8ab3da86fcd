"""`LocalBroker`: the in-process broker with the Ray handle's verbs, on a real SQLite file, without
Ray. (The scenario suite in tests/integration/test_broker.py runs on it and on the actor.)"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from actors import (
    Activation,
    BrokerHandle,
    Contract,
    InvalidArgument,
    LocalBroker,
    MessageType,
    Queue,
    Send,
    Service,
)
from actors.client import local
from actors.client.local import _Call
from actors.errors import BrokerError, UnknownQueue
from actors.store.audit import read_all
from tests.polling import wait_until


@pytest.fixture
def broker(tmp_path):
    with LocalBroker("unit-local", str(tmp_path / "b.sqlite")) as b:
        b.create(MessageType("M"))
        b.create(Contract("C", {"M": "any"}))
        b.create(Queue("Q"))
        b.create(Service("S", "Q", ["C"]))
        yield b


def test_importing_the_package_and_running_a_local_broker_loads_no_ray(tmp_path):
    code = (
        "import sys, actors\n"
        f"with actors.LocalBroker('x', {str(tmp_path / 'x.sqlite')!r}) as b: b.info()\n"
        "print('ray' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_local_broker_has_every_verb_of_the_handle_protocol_with_the_same_parameters():
    verbs = [n for n, v in vars(BrokerHandle).items() if callable(v) and not n.startswith("_")]
    assert len(verbs) > 25
    for name in verbs:
        want = list(inspect.signature(getattr(BrokerHandle, name)).parameters)
        have = list(inspect.signature(getattr(LocalBroker, name)).parameters)
        assert have == want, name


def test_a_dialog_round_trip_commits_once_and_the_audit_records_it(broker):
    h = broker.begin_dialog("S", "S", "C")
    broker.send(h, "M", b"hello")
    [g] = broker.receive("Q", wait=5)
    assert [m.body for m in g.messages] == [b"hello"]
    broker.commit(g)
    assert broker.queues()["Q"]["depth"] == 0
    [rec] = broker.audit()["records"]
    assert rec["message_type"] == "M" and rec["sequence_number"] == 0


# In a fresh interpreter: in a test process that runs a Spark session or Ray (other tests share
# the worker), SIGINT is not always Python's alone, and one lost there left the receive waiting.
_INTERRUPTED_RECEIVE = """
import os, signal, sys, threading
from actors import Contract, LocalBroker, MessageType, Queue, Service
from tests.polling import wait_until

# Python's own Ctrl-C handling, whatever this process inherited (a shell's background job
# starts with SIGINT ignored)
signal.signal(signal.SIGINT, signal.default_int_handler)

with LocalBroker("ctrl-c", sys.argv[1]) as broker:
    broker.create(MessageType("M"))
    broker.create(Contract("C", {"M": "any"}))
    broker.create(Queue("Q"))
    broker.create(Service("S", "Q", ["C"]))
    h = broker.begin_dialog("S", "S", "C")

    def ctrl_c():
        wait_until(lambda: "Q" in broker.service._waiters, what="the receive to wait")
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=ctrl_c, daemon=True).start()
    try:
        broker.receive("Q", wait=60)
        print("not interrupted")
    except KeyboardInterrupt:
        print("interrupted")
    broker.send(h, "M", b"after")
    # the interrupted receive is no longer waiting to take it (it would hold it for its lease)
    [g] = broker.receive("Q", wait=5)
    print(b"".join(m.body for m in g.messages).decode())
"""


def test_a_receive_interrupted_with_ctrl_c_stops_waiting_at_the_broker(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_RECEIVE, str(tmp_path / "c.sqlite")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    assert done.stdout.split() == ["interrupted", "after"], done.stderr


def test_ctrl_c_while_a_local_broker_starts_leaves_its_store_free(tmp_path, monkeypatch):
    path = str(tmp_path / "s.sqlite")
    started, handled, go_on = threading.Event(), threading.Event(), threading.Event()
    real_start = local._start

    async def held_start(*args):  # a start as slow as a big store's: the broker's thread is busy
        started.set()
        go_on.wait(30)  # (held until the caller has been interrupted)
        return await real_start(*args)

    def ctrl_c_handler(signum, frame):  # Python's own, which says when the interrupt landed
        handled.set()
        raise KeyboardInterrupt

    def ctrl_c() -> None:
        started.wait(30)
        os.kill(os.getpid(), signal.SIGINT)
        handled.wait(30)
        go_on.set()  # only now the start opens (and locks) the store

    monkeypatch.setattr(local, "_start", held_start)
    previous = signal.signal(signal.SIGINT, ctrl_c_handler)
    try:
        threading.Thread(target=ctrl_c, daemon=True).start()
        threads = threading.active_count()
        with pytest.raises(KeyboardInterrupt):
            LocalBroker("starting", path)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert handled.is_set()
    # what the start opened was closed: the store opens again in this process, and no broker
    # thread was left running
    with LocalBroker("again", path) as b:
        assert b.info()["name"] == "again"
    assert threading.active_count() <= threads


def test_a_receive_whose_caller_left_after_it_took_gives_its_groups_back(broker):
    h = broker.begin_dialog("S", "S", "C")
    broker.send(h, "M", b"taken")
    args = ("Q", 0.0, {}, None, None, None)
    call = _Call(broker.service.verb("receive", *args), "receive", args)
    asyncio.run_coroutine_threadsafe(call.run(), broker.loop).result()  # it took the group ...
    assert broker.queues()["Q"]["locked_groups"] == 1

    broker.loop.call_soon_threadsafe(
        call.leave, broker.service.core.give_back
    )  # ... as its caller left

    wait_until(lambda: broker.queues()["Q"]["locked_groups"] == 0, what="the group given back")
    [g] = broker.receive("Q", wait=5)
    assert [m.body for m in g.messages] == [b"taken"]
    assert broker.queues()["Q"]["rollbacks_in_a_row"] == 0  # not a rollback: no poison count


def test_a_receive_cancelled_between_its_answered_take_and_its_resuming_gives_it_back(broker):
    h = broker.begin_dialog("S", "S", "C")
    broker.send(h, "M", b"taken")
    service = broker.service
    locks = service.core.state.locks.by_group

    async def cancelled_in_that_moment() -> int:
        receive = asyncio.ensure_future(service.receive("Q", 0.0, {}, None, None, None))
        await asyncio.sleep(0)  # a yield: it starts, its take waits for the next group commit
        await asyncio.sleep(0)  # a yield: the group commit took for it; it has not resumed
        held = len(locks)
        receive.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await receive
        return held

    held = asyncio.run_coroutine_threadsafe(cancelled_in_that_moment(), broker.loop).result()

    assert held == 1  # taken for it before it was cancelled ...
    assert broker.queues()["Q"]["locked_groups"] == 0  # ... and given back, not held for nobody
    [g] = broker.receive("Q", wait=5)
    assert [m.body for m in g.messages] == [b"taken"]
    assert broker.queues()["Q"]["rollbacks_in_a_row"] == 0


def test_an_apply_retried_with_the_same_request_id_is_applied_once(broker):
    h = broker.begin_dialog("S", "S", "C")
    first = broker.apply([Send(h, "M", b"once")], request_id="task-7-attempt")
    again = broker.apply([Send(h, "M", b"once")], request_id="task-7-attempt")
    assert first == again == {"handles": [], "sent": 1}
    assert broker.queues()["Q"]["depth"] == 1


def test_a_commit_retried_with_the_same_request_id_is_applied_once(broker):
    h = broker.begin_dialog("S", "S", "C")
    broker.send(h, "M", b"a")
    [g] = broker.receive("Q")
    ops = [Send(h, "M", b"reply")]
    first = broker.commit(g, ops=ops, request_id="commit-1")
    assert broker.commit(g, ops=ops, request_id="commit-1") == first  # not LockNotHeld
    assert broker.queues()["Q"]["depth"] == 1  # the reply, once


@pytest.mark.parametrize("bad", ["", 7, "x" * 201])
def test_a_bad_request_id_is_refused_and_nothing_is_applied(broker, bad):
    h = broker.begin_dialog("S", "S", "C")
    with pytest.raises(InvalidArgument, match="request_id"):
        broker.apply([Send(h, "M", b"no")], request_id=bad)
    assert broker.queues()["Q"]["depth"] == 0


def test_a_route_lifetime_is_resolved_by_the_brokers_clock(broker):
    before = time.time()
    broker.create_route("R", "Elsewhere", address="LOCAL", lifetime=60)
    [route] = [r for r in broker.routes() if r["name"] == "R"]
    assert before + 60 <= route["expires_at"] <= time.time() + 60
    broker.alter_route("R", lifetime=None)
    [route] = [r for r in broker.routes() if r["name"] == "R"]
    assert route["expires_at"] is None


@pytest.mark.parametrize("life", [math.nan, math.inf, -1, 0, True, "soon"])
def test_a_bad_route_lifetime_is_refused_and_no_route_is_made(broker, life):
    with pytest.raises(InvalidArgument, match="lifetime"):
        broker.create_route("R", "Elsewhere", address="LOCAL", lifetime=life)
    assert "R" not in {r["name"] for r in broker.routes()}


def test_the_audit_cursor_pages_through_every_record_once(broker):
    h = broker.begin_dialog("S", "S", "C")
    for i in range(5):
        broker.send(h, "M", str(i).encode())
        broker.commit(broker.receive("Q"))
    first = broker.audit(limit=2)
    assert len(first["records"]) == 2 and first["next"] > 0
    rest = broker.audit(after_id=first["next"])
    seqs = [r["sequence_number"] for r in first["records"] + rest["records"]]
    assert seqs == [0, 1, 2, 3, 4]
    assert broker.audit(after_id=rest["next"]) == {"records": [], "next": rest["next"], "missed": 0}
    assert [r["sequence_number"] for r in read_all(broker.audit, page=1)[0]] == seqs


def test_an_audit_page_ends_with_the_commit_that_reaches_its_limit_in_records(broker):
    # a busy broker's commit holds thousands of records: a page of `limit` commits was built
    # and sent in one answer and held the broker for seconds (its mirror took over)
    h = broker.begin_dialog("S", "S", "C")
    for n in (3, 4, 2):  # three commits of 3, 4 and 2 messages
        broker.apply([Send(h, "M", [b"m"] * n)])
        broker.commit(broker.receive("Q"))
    page = broker.audit(limit=5)  # the second commit brings the records to 7 >= 5: it ends there
    assert len(page["records"]) == 7 and len({r["audit_id"] for r in page["records"]}) == 2
    rest = broker.audit(after_id=page["next"], limit=5)
    assert [r["sequence_number"] for r in page["records"] + rest["records"]] == list(range(9))
    assert len(broker.audit(limit=1)["records"]) == 3  # a commit is never split


def test_catalog_verbs_take_the_definition_class_or_its_kind_name(broker):
    broker.alter(Queue, "Q", poison_limit=2)
    assert broker.queues()["Q"]["enabled"]
    broker.create(Queue("Spare"))
    broker.drop(Queue, "Spare")
    with pytest.raises(UnknownQueue):
        broker.drop("queue", "Spare")
    with pytest.raises(InvalidArgument, match="not a catalog kind"):
        broker.drop(dict, "Q")


@pytest.mark.parametrize("placement", ["pool", "internal"])
def test_an_activated_queue_runs_its_readers_in_process_whatever_the_placement(broker, placement):
    act = Activation(
        "actors.activation.handlers:count_in_order", placement=placement, idle_timeout=0.5
    )
    broker.alter(Queue, "Q", activation=act.__dict__)
    h = broker.begin_dialog("S", "S", "C")
    broker.apply([Send(h, "M", [b"x"] * 20)])

    def counted():
        states = [json.loads(g["state"]) for g in broker.groups("Q") if g["state"]]
        return sum(s["count"] for s in states) == 20

    wait_until(counted)
    assert broker.queues()["Q"]["depth"] == 0


def test_a_stopped_local_broker_says_so(tmp_path):
    b = LocalBroker("gone", str(tmp_path / "g.sqlite"))
    b.stop()
    with pytest.raises(InvalidArgument, match="stopped"):
        b.queues()


@pytest.mark.parametrize(
    "options, named",
    [
        ({"path": ""}, "path"),
        ({"lease_s": math.nan}, "lease_s"),
        ({"max_body_bytes": "abc"}, "max_body_bytes"),
        ({"forward_buffer": -5}, "forward_buffer"),
        ({"no_such_limit": 1}, "no_such_limit"),
    ],
)
def test_bad_broker_options_are_refused_naming_the_option(options, named):
    with pytest.raises(InvalidArgument, match=named):
        LocalBroker("bad", **{"path": ":memory:", **options})


@pytest.mark.parametrize("name", ["", "B 1", "B\n", " B", 7, None, ["B"], "x" * 200])
def test_a_broker_name_that_cannot_be_an_address_is_refused(name):
    with pytest.raises(InvalidArgument, match="broker name"):
        LocalBroker(name, ":memory:")


@pytest.mark.parametrize("bad", [["R"], {"R": 1}, 7, None])
def test_a_route_named_by_a_value_that_is_no_name_is_refused_by_the_broker(broker, bad):
    """As another client that does not check might send them, past this handle's own checks."""
    before = broker.routes()
    for call in (
        ("alter_route", "routes", bad, {"address": "LOCAL"}, "r1"),
        ("drop_route", "routes", bad, "r2"),
        ("create_route", bad, {"name": "R", "address": "LOCAL"}, "r3"),
    ):
        with pytest.raises(BrokerError):
            broker._call(*call)
    assert broker.routes() == before


def test_the_newest_events_are_the_most_recent_ones_oldest_first(broker):
    for i in range(1_005):  # more than one page of the oldest
        broker.record_event("Tested", f"s{i}")

    assert [e["subject"] for e in broker.events(limit=3, newest=True)] == [
        "s1002",
        "s1003",
        "s1004",
    ]
    assert broker.events()[-1]["subject"] == "s999"  # the first page ends before them
    with pytest.raises(InvalidArgument, match="newest"):
        broker.events(newest="yes")


def _pages(view, key, limit):
    """Every row of a paged view, a page of `limit` at a time after the last one's `key`."""
    rows, after = [], None
    while page := view(after=after, limit=limit):
        assert len(page) <= limit
        rows += page
        after = page[-1][key]
    return rows


def test_endpoints_and_groups_come_in_pages_that_cover_every_one_once(broker):
    for _ in range(7):  # each dialog's two endpoints here, and the target's group of its own
        h = broker.begin_dialog("S", "S", "C")
        broker.send(h, "M", b"x")

    endpoints = broker.endpoints()  # up to 10,000: all of these
    handles = [e["conversation_handle"] for e in endpoints]
    assert len(handles) == 14 and handles == sorted(handles)
    assert _pages(broker.endpoints, "conversation_handle", 3) == endpoints
    groups = broker.groups("Q")
    assert len(groups) == 14  # the initiators' and the targets'
    assert _pages(lambda **p: broker.groups("Q", **p), "conversation_group_id", 3) == groups
    for bad in ({"after": 5}, {"limit": 0}, {"limit": "3"}):
        with pytest.raises(InvalidArgument):
            broker.endpoints(**bad)
        with pytest.raises(InvalidArgument):
            broker.groups(**bad)
