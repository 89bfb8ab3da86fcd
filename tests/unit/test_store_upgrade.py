"""A store written before segments (schema 1: a message a row) opens as it was: the views show
what they showed, and every waiting message is received once, in order (tests/data/)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from actors.calls.envelope import Send
from actors.core import BrokerCore, Limits
from actors.model.catalog import Service
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


@pytest.fixture
def schema2_store(tmp_path) -> str:
    """A store with messages waiting in the transmission queue, a row each (schema 2)."""
    path = tmp_path / "broker.sqlite"
    shutil.copy(DATA / "store-schema2.sqlite", path)
    return str(path)


def test_a_schema2_stores_transmission_rows_move_into_runs_and_show_what_they_showed(
    schema2_store,
):
    store, core = _open(schema2_store)
    try:
        tables = {n for (n,) in store.db.execute("SELECT name FROM sqlite_master")}
        assert "transmission" not in tables and "transmission_runs" in tables
        assert store.get_meta("schema") == SCHEMA_VERSION
        shown = json.loads(json.dumps(core_snapshot(core), default=repr))
        assert shown == json.loads((DATA / "store-schema2.json").read_text())
        assert store.transmission_depth() == 8
    finally:
        store.close()


def test_a_schema2_stores_waiting_messages_are_delivered_once_in_order(schema2_store):
    store, core = _open(schema2_store)
    try:
        core.create(Service("Later", "TargetQ", ("C",)))
        got = []
        while groups := core.receive("TargetQ", max_groups=10):
            got += [(m.conversation_id, m.sequence_number, m.body) for g in groups
                    for m in g.messages]  # fmt: skip
            core.settle([g.lock_id for g in groups])
        by_dialog: dict[str, list[tuple[int, bytes]]] = {}
        for conversation, seq, body in got:
            by_dialog.setdefault(conversation, []).append((seq, body))
        assert sorted(by_dialog.values()) == [
            [(0, b"a0"), (1, b"a1"), (2, b"a2"), (3, b"{}"), (4, b"a4")],
            [(0, b"b0"), (1, b"b1"), (2, b"b2")],
        ]
        assert core.transmission_view() == []
    finally:
        store.close()
    store, core = _open(schema2_store)  # opened again: nothing moved twice
    try:
        assert core.transmission_view() == [] and _received(core, "TargetQ") == []
    finally:
        store.close()
