"""Unit tests cover the plain core: Ray must not start here."""

import pytest


@pytest.fixture(autouse=True)
def _no_ray(monkeypatch):
    import ray

    def refuse(*args, **kwargs):
        raise AssertionError("unit tests must not start Ray; put this test under integration/")

    monkeypatch.setattr(ray, "init", refuse)


# --- BrokerCore fixtures (tests/unit/test_core*.py) -------------------------------------------
# One broker with a small catalog: "Init" (queue InitQ) begins dialogs on contract "C" with
# "Target" (TargetQ), "Retain" (RetainQ, retention on) or "Poison" (PoisonQ, poison_limit=3);
# "EchoSvc" accepts the built-in Echo contract.

from dataclasses import dataclass  # noqa: E402

from actors.calls.envelope import Begin, Send  # noqa: E402
from actors.core import BrokerCore, Limits  # noqa: E402
from actors.mirroring import replay  # noqa: E402
from actors.mirroring.capture import attach  # noqa: E402
from actors.model.catalog import Contract, MessageType, Queue, Service  # noqa: E402
from actors.store.database import Store  # noqa: E402
from tests.fakes import FakeClock  # noqa: E402

CORE_SCHEMA = {
    "type": "object",
    "required": ["n"],
    "properties": {"n": {"type": "integer"}},
}


def define_core_catalog(core: BrokerCore) -> None:
    core.create(MessageType("Req"))
    core.create(MessageType("Reply"))
    core.create(MessageType("Json", "json"))
    core.create(MessageType("Shaped", "json_schema", CORE_SCHEMA))
    core.create(
        Contract("C", {"Req": "initiator", "Reply": "target", "Json": "any", "Shaped": "any"})
    )
    for q in (Queue("InitQ"), Queue("TargetQ"), Queue("RetainQ", retention=True)):
        core.create(q)
    core.create(Queue("PoisonQ", poison_limit=3))
    core.create(Service("Init", "InitQ"))
    core.create(Service("Target", "TargetQ", ("C",)))
    core.create(Service("Retain", "RetainQ", ("C",)))
    core.create(Service("Poison", "PoisonQ", ("C",)))
    core.create(Service("EchoSvc", "TargetQ", ("Echo",)))


@pytest.fixture
def core_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_core(core_clock):
    """make_core(path=":memory:", limits=None, catalog=True): a BrokerCore on `path` with the fake
    clock. catalog=False reopens an existing file as it is (a restart)."""
    stores: list[Store] = []

    def make(path: str = ":memory:", limits: Limits | None = None, catalog: bool = True):
        store = Store(str(path))
        stores.append(store)
        core = BrokerCore(store, core_clock, limits or Limits())
        if catalog:
            define_core_catalog(core)
        return core

    yield make
    for store in stores:
        store.close()


@pytest.fixture
def core(make_core) -> BrokerCore:
    return make_core()


@dataclass
class CoreDialog:
    init: str  # the initiator's handle (service Init)
    target: str  # the target's handle
    conversation_id: str


def open_core_dialog(
    core: BrokerCore, to: str = "Target", bodies=(b"hello",), **begin
) -> CoreDialog:
    """Begin a dialog from Init to `to` on contract C and send `bodies` as Req (at least one, so
    the target endpoint exists)."""
    op = Begin("Init", to, "C", **begin)
    core.apply([op, Send(op.handle, "Req", list(bodies))])
    conv = next(e for e in core.endpoints_view() if e["conversation_handle"] == op.handle)
    target = next(
        e
        for e in core.endpoints_view()
        if e["conversation_id"] == conv["conversation_id"] and not e["is_initiator"]
    )
    return CoreDialog(op.handle, target["conversation_handle"], conv["conversation_id"])


@pytest.fixture
def open_dialog():
    return open_core_dialog


def core_snapshot(core: BrokerCore) -> dict:
    """Everything a verb may change, as the views show it."""
    return {
        "endpoints": sorted(core.endpoints_view(), key=lambda e: e["conversation_handle"]),
        "queues": core.queues_view(),
        "rows": {q: core.queue_view(q) for q in core.catalog.queues},
        "groups": sorted(core.groups_view(), key=lambda g: g["conversation_group_id"]),
        "transmission": core.transmission_view(),
        "definitions": core.definitions(),
        # what the store remembers of dialogs that went (actors.store.traces)
        "traces": {
            t: core.store.db.execute(f"SELECT * FROM {t} ORDER BY rowid").fetchall()
            for t in ("ended", "rerunnable")
        },
    }


@pytest.fixture
def snapshot():
    return core_snapshot


def stored_messages(store: Store) -> list[tuple]:
    """Every message a store holds, in id order, as the rows it was given: (id, group_no,
    endpoint_no, seq, type, body, status, sent_at, arrived_at); status 1: received and kept."""
    groups = [g for (g,) in store.db.execute("SELECT DISTINCT group_no FROM segments")]
    return [
        (i, g, ep, seq, mt, body, status, sent, arrived)
        for i, ep, seq, mt, body, sent, arrived, g, status in store.queue_rows(groups, 1 << 62)
    ]


@pytest.fixture
def pair(tmp_path, core_clock):  # mirroring: test_mirror_log, test_mirror_backlog
    """A principal core whose store is captured, and a mirror store (a copy of the blank
    principal, as a rebuild makes it)."""
    stores = []

    def open_store(name):
        s = Store(str(tmp_path / name))
        stores.append(s)
        return s

    principal = open_store("p.sqlite")
    capture = attach(principal)
    core = BrokerCore(principal, core_clock, Limits())
    mirror_path = str(tmp_path / "m.sqlite")
    replay.install(mirror_path, replay.snapshot(principal.db))
    mirror = open_store("m.sqlite")
    yield core, capture, mirror, open_store
    for s in stores:
        s.close()
