"""Broker actors and their store files on a real Ray: one broker per store file, a broker name is
free again after a failed start, and a full disk under the broker's process is a `StoreError` the
broker recovers from without a restart."""

from __future__ import annotations

import json
import os
import resource
import signal
import uuid

import pytest
import ray

from actors import Broker, Send, start_broker
from actors.errors import BrokerUnavailable, StoreError, StoreInUse
from tests.polling import wait_until

from .conftest import define_orders


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _name_is_free(name: str) -> bool:
    try:
        ray.get_actor(name, namespace="raybroker")
    except ValueError:
        return True
    return False


def test_a_second_broker_on_a_store_in_use_is_refused_and_the_first_carries_on(
    make_broker, tmp_path
):
    path = str(tmp_path / "shared.sqlite")
    first = make_broker(path, name=_name("first"))
    define_orders(first)
    second = _name("second")
    with pytest.raises(StoreInUse) as err:
        start_broker(second, path)
    assert err.value.path == path and err.value.holder == first.name
    assert err.value.pid == first.info()["pid"]
    assert _name_is_free(second)
    h = first.begin_dialog("Orders", "Fulfilment", "OrderContract")
    first.send(h, "Order", b'{"order": 1}')
    [g] = first.receive("FulfilmentQueue")
    assert [m.sequence_number for m in g.messages] == [0]
    first.commit(g)
    # the refused name works with a store of its own
    make_broker(str(tmp_path / "own.sqlite"), name=second)


@pytest.mark.parametrize("fault", ["a missing directory", "a store in use"])
def test_a_broker_name_is_free_again_after_a_failed_start(make_broker, tmp_path, fault):
    name = _name("retry")
    if fault == "a store in use":
        bad = str(tmp_path / "held.sqlite")
        make_broker(bad)
        error = StoreInUse
    else:
        bad = str(tmp_path / "no" / "such" / "dir.sqlite")
        error = StoreError
    with pytest.raises(error, match="cannot open") as err:
        start_broker(name, bad)
    assert err.value.path == bad
    assert _name_is_free(name)
    b = make_broker(str(tmp_path / "good.sqlite"), name=name)
    assert b.info()["path"] == str(tmp_path / "good.sqlite")


def _ignores_sigxfsz(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigIgn:"))
    return bool(mask & (1 << (signal.SIGXFSZ - 1)))


def _views(b: Broker) -> dict:
    return {
        "endpoints": sorted(b.endpoints(), key=lambda e: e["conversation_handle"]),
        "queues": b.queues(),
        "rows": {q: b.queue(q) for q in ("OrdersQueue", "FulfilmentQueue")},
        "groups": sorted(b.groups(), key=lambda g: g["conversation_group_id"]),
        "transmission": b.transmission_queue(),
        "definitions": b.definitions(),
    }


@pytest.mark.skipif(not hasattr(resource, "prlimit"), reason="needs prlimit (Linux)")
def test_a_full_disk_under_the_broker_is_a_store_error_and_the_same_broker_recovers(
    make_broker, tmp_path
):
    path = str(tmp_path / "full.sqlite")
    b = make_broker(path)
    define_orders(b)
    h = b.begin_dialog("Orders", "Fulfilment", "OrderContract")
    b.send(h, "Order", json.dumps({"order": 1}).encode())
    pid = b.info()["pid"]
    assert pid != os.getpid()
    # with SIGXFSZ ignored (CPython's default), a write past the limit fails with EFBIG
    assert _ignores_sigxfsz(pid)
    before = _views(b)
    limit = resource.prlimit(pid, resource.RLIMIT_FSIZE)
    call = [Send(h, "Order", [json.dumps({"order": 2}).encode()])]
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (0, limit[1]))  # no file of it may grow
    try:
        with pytest.raises(StoreError) as err:
            b.apply(call)
    finally:
        resource.prlimit(pid, resource.RLIMIT_FSIZE, limit)
    assert err.value.path == path and repr(path) in str(err.value)
    assert _views(b) == before
    b.apply(call)  # the same call on the same broker process, now the disk has room
    assert b.info()["pid"] == pid
    [g] = b.receive("FulfilmentQueue")
    assert [(m.sequence_number, json.loads(m.body)) for m in g.messages] == [
        (0, {"order": 1}),
        (1, {"order": 2}),
    ]
    b.commit(g)


def test_a_broker_whose_restart_cannot_reopen_its_store_frees_its_name(make_broker, tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    name = _name("lost")
    b = make_broker(str(gone / "b.sqlite"), name=name)
    for f in gone.iterdir():  # the store's directory vanishes under the running broker
        f.unlink()
    gone.rmdir()
    pid = b.info()["pid"]
    ray.kill(b.actor, no_restart=False)  # Ray restarts it; the restart cannot reopen the store

    def restart_failed() -> str | None:
        try:
            assert b.info()["pid"] == pid  # the old process, not yet gone
        except BrokerUnavailable as exc:
            return str(exc)
        return None

    assert "does not exist" in wait_until(restart_failed, what="the restart to fail")
    with pytest.raises(BrokerUnavailable, match="could not start"):
        start_broker(name, str(tmp_path / "new.sqlite"))  # tells why, and frees the name
    assert _name_is_free(name)
    again = make_broker(str(tmp_path / "new.sqlite"), name=name)
    assert again.queues() == {}
