"""Lock holders: a call names each holder's handle once and the holder's id alone after that
(actors.client.coalesce), and the broker reads an id alone as the holder introduced earlier in the
call. The coalescer's batches, and a real broker service on a real SQLite file, no Ray."""

from __future__ import annotations

import asyncio

import pytest

from actors import Begin, Queue, Send, Service
from actors.calls.envelope import pack_ops, unpack_received
from actors.calls.ordering import Issuer
from actors.client.coalesce import holders_once
from actors.errors import InvalidArgument
from actors.ids import new_request_id
from actors.model.catalog import kind_of, to_record
from actors.service.broker import BrokerService
from actors.service.holders import LockHolders

HANDLE = ["token"]  # stands for the Ray object the broker watches a holder by


def _receive(holder, queue: str = "T") -> tuple[str, tuple]:
    return ("receive", (queue, 0.0, {"max_groups": 1}, holder, None, None))


def test_a_batch_gives_each_holders_handle_once_and_its_id_after_that():
    calls = [
        ("apply", (b"ops", "request-1")),
        _receive(("driver-a", HANDLE)),
        _receive(("driver-b", HANDLE)),
        _receive(("driver-a", HANDLE)),
        _receive(None),
        _receive(("driver-b", HANDLE)),
    ]
    sent = holders_once(calls)
    assert [args[3] if m == "receive" else None for m, args in sent] == [
        None,
        ("driver-a", HANDLE),
        ("driver-b", HANDLE),
        "driver-a",
        None,
        "driver-b",
    ]
    assert sent[0] == calls[0]  # only the holder changes; everything else goes as it was
    assert all(s[1][:3] + s[1][4:] == c[1][:3] + c[1][4:] for s, c in zip(sent, calls, strict=True))


def test_an_id_alone_is_the_holder_known_by_that_id_and_an_unknown_one_is_refused():
    holders = LockHolders()
    assert holders.adopt(("driver-a", HANDLE)) == "driver-a"
    assert holders.full("driver-a") == ("driver-a", HANDLE)
    assert holders.adopt("driver-a") == "driver-a"
    with pytest.raises(InvalidArgument, match="'driver-x' is named by its id alone"):
        holders.adopt("driver-x")
    assert holders.keep_only({"driver-b"}) == []  # holds nothing now: forgotten
    with pytest.raises(InvalidArgument):
        holders.full("driver-a")


async def _service_with_messages(path: str, dialogs: int) -> BrokerService:
    service = BrokerService("holders", path)
    for d in (Queue("I"), Service("Init", "I", []), Queue("T"), Service("T", "T", ["DEFAULT"])):
        await service.define(kind_of(d), to_record(d), new_request_id())
    begins = pack_ops([Begin("Init", "T") for _ in range(dialogs)])
    handles = (await service.apply(begins, new_request_id()))["handles"]
    await service.apply(pack_ops([Send(handles, "DEFAULT", [b"m"])]), new_request_id())
    return service


def test_receives_naming_their_holder_by_id_take_under_that_holder(tmp_path):
    async def main():
        service = await _service_with_messages(str(tmp_path / "b.sqlite"), 3)
        try:
            issuer = Issuer()
            batch = holders_once([_receive(("driver-a", HANDLE)) for _ in range(3)])
            outcomes = await service.calls(issuer.order(issuer.issue()), batch)
            return outcomes, service.core.locks.owners(), service.holders.full("driver-a")
        finally:
            await service.close()

    outcomes, owners, known = asyncio.run(main())
    assert [ok for ok, _ in outcomes] == [True] * 3
    assert [len(unpack_received(v)) for _, v in outcomes] == [1, 1, 1]
    assert owners == {"driver-a"} and known == ("driver-a", HANDLE)


def test_a_receive_naming_an_unknown_holder_by_id_fails_alone_and_takes_nothing(tmp_path):
    async def main():
        service = await _service_with_messages(str(tmp_path / "b.sqlite"), 2)
        try:
            issuer = Issuer()
            batch = [_receive("driver-x"), _receive(("driver-a", HANDLE))]
            outcomes = await service.calls(issuer.order(issuer.issue()), batch)
            return outcomes, service.core.queues_view()["T"]
        finally:
            await service.close()

    [(bad_ok, bad), (good_ok, good)], queue = asyncio.run(main())
    assert not bad_ok and isinstance(bad, InvalidArgument) and "driver-x" in str(bad)
    assert good_ok and len(unpack_received(good)) == 1
    assert queue["locked_groups"] == 1  # the good receive's; the refused one took nothing
