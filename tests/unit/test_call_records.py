"""A change sent without a request id of its own is recorded under its place in its client's
order (actors.calls.ordering.call_key): the calls of one numbered client call (a coalesced batch)
share one row, and a retry of that client call, after a broker restart too, answers as the first
arrival did and applies nothing twice. A real broker service on a real SQLite file, no Ray."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from actors import Begin, Queue, Send, Service
from actors.calls.envelope import pack_ops, placed, unpack_received
from actors.calls.ordering import Issuer, call_key
from actors.errors import InvalidArgument
from actors.ids import new_request_id
from actors.model.catalog import kind_of, to_record
from actors.service.broker import BrokerService
from actors.store.database import Store

OWNER = ("reader", ["token"])


async def _open(path: str) -> BrokerService:
    return BrokerService("records", path)


async def _define(service: BrokerService, dialogs: int) -> list[str]:
    for d in (Queue("I"), Service("Init", "I", []), Queue("T"), Service("T", "T", ["DEFAULT"])):
        await service.define(kind_of(d), to_record(d), new_request_id())
    begins = pack_ops([Begin("Init", "T") for _ in range(dialogs)])
    return (await service.apply(begins, new_request_id()))["handles"]


def _rows(path: str, table: str) -> int:
    with sqlite3.connect(path) as db:
        return db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]


def _send(handle: str, body: bytes) -> tuple[str, tuple]:
    return ("apply", (pack_ops([Send(handle, "DEFAULT", [body])]), None))


def test_a_batch_of_changes_without_request_ids_is_recorded_in_one_row(tmp_path):
    path = str(tmp_path / "b.sqlite")

    async def main():
        service = await _open(path)
        try:
            handles = await _define(service, 5)
            issuer = Issuer()
            before = (_rows(path, "requests"), _rows(path, "call_requests"))
            outcomes = await service.calls(
                issuer.order(issuer.issue()), [_send(h, b"m") for h in handles]
            )
            return before, outcomes
        finally:
            await service.close()

    (requests_before, calls_before), outcomes = asyncio.run(main())
    assert [ok for ok, _ in outcomes] == [True] * 5
    assert _rows(path, "requests") == requests_before  # no row per call
    assert _rows(path, "call_requests") == calls_before + 1


def test_a_batch_retried_after_a_restart_answers_as_before_and_applies_nothing_twice(tmp_path):
    path = str(tmp_path / "b.sqlite")
    issuer = Issuer()

    async def first():
        service = await _open(path)
        try:
            handles = await _define(service, 3)
            order = issuer.order(issuer.issue())
            batch = [_send(h, f"m{i}".encode()) for i, h in enumerate(handles)]
            return order, batch, await service.calls(order, batch)
        finally:
            await service.close()

    order, batch, answers = asyncio.run(first())

    async def receive_then_retry():
        service = await _open(path)  # a new incarnation: nothing in memory
        try:
            got = await service.calls(issuer.order(issuer.issue()), [_take(), _take(), _take()])
            locks = [g.lock_id for _, v in got for g in unpack_received(v)]
            commit = issuer.order(issuer.issue())
            settle = [("settle", (locks, [], pack_ops([]), {}, None))]
            committed = await service.calls(commit, settle)
            again = await service.calls(order, batch)  # the sends' client call, once more
            return got, committed, again, await service.calls(commit, settle)
        finally:
            await service.close()

    got, committed, again, committed_again = asyncio.run(receive_then_retry())
    assert again == answers  # the recorded answers; nothing sent twice
    assert sorted(m.body for _, v in got for g in unpack_received(v) for m in g.messages) == [
        b"m0",
        b"m1",
        b"m2",
    ]
    assert committed_again == committed and committed[0][1]["committed"] == 3

    async def depth():
        service = await _open(path)
        try:
            return service.core.queues_view()["T"]["depth"]
        finally:
            await service.close()

    assert asyncio.run(depth()) == 0  # the three were committed once, none sent again


def _take() -> tuple[str, tuple]:
    return ("receive", ("T", 0.0, {"max_groups": 1}, OWNER, None, None))


def test_a_call_that_failed_is_applied_by_its_retry_and_both_records_are_found(tmp_path):
    store = Store(str(tmp_path / "s.sqlite"))
    try:
        with store.tx():
            store.put_requests([(("client", 7, 0), 1.0, b"zero"), (("client", 7, 1), 1.0, b"one")])
        with store.tx():  # the retry applied the call that had failed the first time
            store.put_requests([(("client", 7, 2), 2.0, b"two"), ("named", 2.0, b"own")])
        ids = [("client", 7, i) for i in range(4)] + [("client", 8, 0), "named", "other"]
        assert store.request_results(ids) == {
            ("client", 7, 0): b"zero",
            ("client", 7, 1): b"one",
            ("client", 7, 2): b"two",
            "named": b"own",
        }
    finally:
        store.close()


def test_pruning_forgets_old_client_calls_records_and_keeps_young_ones(tmp_path):
    store = Store(str(tmp_path / "s.sqlite"))
    try:
        with store.tx():
            for n in range(1, 6):
                store.put_requests([(("client", n, 0), float(n), b"x")])
        with store.tx():
            store.prune_requests(before=3.0)
        found = store.request_results([("client", n, 0) for n in range(1, 6)])
        assert sorted(k[1] for k in found) == [3, 4, 5]
    finally:
        store.close()


@pytest.mark.parametrize(
    "method, args",
    [
        ("apply", (b"ops", ("client", 1, 0))),
        ("settle", ([], [], b"ops", {}, ("client", 1, 0))),
        ("receive", ("T", 0.0, {}, None, ([], [], b"ops", {}, ["client", 1, 0]), None)),
        ("apply", (b"ops", "")),
    ],
)
def test_a_client_cannot_pass_a_place_in_the_order_as_its_request_id(method, args):
    with pytest.raises(InvalidArgument, match="request_id must be a non-empty string"):
        placed(method, args, call_key(("client", 1, 0), 0))


def test_a_request_id_the_caller_gave_is_kept_and_an_absent_one_becomes_the_calls_place():
    key = call_key(("client", 4, 2), 1)
    assert key == ("client", 4, 1)
    assert placed("apply", (b"ops", "mine"), key) == (b"ops", "mine")
    assert placed("apply", (b"ops", None), key) == (b"ops", key)
    settle = ([], [], b"ops", {}, None)
    assert placed("settle", settle, key) == ([], [], b"ops", {}, key)
    receive = ("T", 0.0, {}, None, settle, None)
    assert placed("receive", receive, key)[4] == ([], [], b"ops", {}, key)
    assert placed("receive", ("T", 0.0, {}, None, None, None), key)[4] is None  # no settle


def test_a_tuple_from_a_client_is_refused_as_the_request_id_of_any_verb(tmp_path):
    # a place in the order is made by the broker (`call_key`), never taken from a client: a
    # tuple sent as a catalog verb's request id is refused, and nothing is defined
    async def main():
        service = await _open(str(tmp_path / "b.sqlite"))
        try:
            q = Queue("Q")
            with pytest.raises(InvalidArgument, match="request_id must be a non-empty string"):
                await service.define(kind_of(q), to_record(q), ("client", 1, 0))
            return service.core.catalog.queues
        finally:
            await service.close()

    assert "Q" not in asyncio.run(main())
