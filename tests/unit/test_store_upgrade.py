"""A store written before segments (schema 1: a message a row) opens as it was: the views show
what they showed, and every waiting message is received once, in order (tests/data/)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from actors.calls.envelope import Send
from actors.core import BrokerCore, Limits
from actors.store.database import SCHEMA_VERSION, Store
from tests.fakes import FakeClock
from tests.unit.conftest import core_snapshot, stored_messages

DATA = Path(__file__).parents[1] / "data"


@pytest.fixture
def old_store(tmp_path) -> str:
    path = tmp_path / "broker.sqlite"
    shutil.copy(DATA / "store-schema1.sqlite", path)
    return str(path)


def _open(path: str) -> tuple[Store, BrokerCore]:
    store = Store(path)
    return store, BrokerCore(store, FakeClock(2_000_000.0), Limits())


def _received(core: BrokerCore, queue: str) -> list[bytes]:
    bodies = []
    while groups := core.receive(queue, max_groups=10):
        for g in groups:
            bodies += [m.body for m in g.messages]
        core.settle([g.lock_id for g in groups])
    return bodies


def test_an_old_store_moves_its_messages_into_segments_and_shows_what_it_showed(old_store):
    store, core = _open(old_store)
    try:
        tables = {n for (n,) in store.db.execute("SELECT name FROM sqlite_master")}
        assert "messages" not in tables and "segments" in tables
        assert store.get_meta("schema") == SCHEMA_VERSION
        shown = json.loads(json.dumps(core_snapshot(core), default=repr))
        # what the release that wrote it showed, and since then: its dialogs in the clear
        for ep in shown["endpoints"]:
            assert (ep.pop("encryption"), ep.pop("secured")) == (False, False)
        for q in shown["queues"].values():  # and what was removed since the broker started
            assert q.pop("removed") == 0
        assert shown == json.loads((DATA / "store-schema1.json").read_text())
        # the three received on the retention queue are kept as received
        assert [m[6] for m in stored_messages(store) if m[5].startswith(b"c")] == [1, 1, 1, 0]
    finally:
        store.close()


def test_an_old_stores_waiting_messages_are_received_once_in_order_and_ids_go_on(old_store):
    store, core = _open(old_store)
    try:
        highest = max(m[0] for m in stored_messages(store))
        assert _received(core, "TargetQ") == [b"a0", b"a1", b"a2", b"a3", b"a4", b"b2", b"b3"]
        assert _received(core, "RetainQ") == [b"c3"]
        assert _received(core, "InitQ") == [b"r0"]
        handle = core.endpoints_view()[0]["conversation_handle"]
        core.apply([Send(handle, "Json", [b"{}"])])
        assert min(m[0] for m in stored_messages(store) if m[5] == b"{}") > highest
    finally:
        store.close()
    store, core = _open(old_store)  # opened again: nothing left to move, nothing moved twice
    try:
        assert _received(core, "TargetQ") + _received(core, "InitQ") == [b"{}"]
    finally:
        store.close()
