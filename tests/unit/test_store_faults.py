"""The store file: one broker per file, and store faults (a file that cannot be a store, a full
disk, a read-only store) as `StoreError` naming the file; a verb that meets a fault changes
nothing and the broker carries on once the fault clears. Real files, real faults, no Ray."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from actors import LocalBroker
from actors.calls.envelope import Begin, Send, Timer
from actors.errors import StoreError, StoreInUse
from actors.mirroring import replay
from actors.mirroring.pairkey import PairKey, new_key
from actors.model.catalog import Queue
from actors.remote.witness import WitnessActor
from actors.store.database import Store


@pytest.fixture
def path(tmp_path) -> str:
    return str(tmp_path / "broker.sqlite")


# --- one broker per store file ---------------------------------------------------------------


def test_a_second_store_on_a_file_in_use_is_refused_naming_the_file_and_its_holder(path):
    first = Store(path, holder="orders")
    with pytest.raises(StoreInUse) as err:
        Store(path, holder="billing")
    assert (err.value.path, err.value.holder, err.value.pid) == (path, "orders", os.getpid())
    assert path in str(err.value) and "'orders'" in str(err.value)
    assert isinstance(err.value, StoreError)
    first.close()


def test_a_refused_store_leaves_the_holder_working(path):
    first = Store(path)
    with pytest.raises(StoreInUse):
        Store(path)
    with first.tx():
        first.set_meta("k", "v")
    assert first.get_meta("k") == "v"
    first.close()


def test_a_store_file_is_free_again_once_its_store_is_closed(path):
    first = Store(path)
    broker_id = first.broker_id
    first.close()
    first.close()  # closing twice is harmless
    again = Store(path)
    assert again.broker_id == broker_id
    again.close()


def test_the_lock_follows_a_symlink_to_the_same_file(tmp_path, path):
    first = Store(path)
    link = tmp_path / "link.sqlite"
    link.symlink_to(path)
    with pytest.raises(StoreInUse):
        Store(str(link))
    first.close()


# --- files beside the store follow no symbolic link -----------------------------------------


def planted_link(at: Path, tmp_path: Path) -> Path:
    """A symbolic link at `at` to a file of someone else's; that file, to check it is untouched."""
    victim = tmp_path / "someone-elses-file"
    victim.write_bytes(b"keep")
    at.symlink_to(victim)
    return victim


def test_a_lock_file_planted_as_a_link_is_refused_and_its_target_untouched(tmp_path, path):
    victim = planted_link(Path(path + ".lock"), tmp_path)
    with pytest.raises(StoreError, match="is a symbolic link"):
        Store(path)
    assert victim.read_bytes() == b"keep"


@pytest.mark.parametrize("writer", ["rebuild", "witness"])
def test_a_file_written_beside_a_store_replaces_a_planted_link_and_never_writes_through_it(
    tmp_path, writer
):
    """A mirror's rebuilt store (`{path}.rebuild`) and a witness's record (`{path}.tmp`) are
    written to a new file, then renamed: a link planted at the temporary name is replaced."""
    target = tmp_path / "store.sqlite"
    if writer == "rebuild":
        victim = planted_link(tmp_path / "store.sqlite.rebuild", tmp_path)
        replay.install(str(target), b"the rebuilt store")
        assert target.read_bytes() == b"the rebuilt store"
    else:
        victim = planted_link(tmp_path / "store.sqlite.tmp", tmp_path)
        key = PairKey("mb", new_key(), ("mb-a", "mb-b"))
        witness = WitnessActor("mb", "mb-a", "mb-b", str(target), "ns", key)  # plain Python
        assert witness.start_error is None
        assert json.loads(target.read_text())["principal"] == "mb-a"
        assert not (tmp_path / "store.sqlite.tmp").exists()
    assert victim.read_bytes() == b"keep"


def test_memory_stores_take_no_lock():
    a, b = Store(":memory:"), Store(":memory:")
    assert a.broker_id != b.broker_id
    a.close()
    b.close()


def test_a_second_local_broker_on_a_file_in_use_is_refused_and_the_first_carries_on(path):
    with LocalBroker("first", path) as first:
        with pytest.raises(StoreInUse, match="in use by broker 'first'"):
            LocalBroker("second", path)
        first.create(Queue("Q"))
        assert "Q" in first.queues()
    with LocalBroker("second", path) as second:  # the first stopped: the file is free
        assert "Q" in second.queues()


def test_a_local_broker_stopped_with_delete_store_leaves_no_files(tmp_path, path):
    LocalBroker("gone", path).stop(delete_store=True)
    assert os.listdir(tmp_path) == []


# --- opening a path that cannot be a store ---------------------------------------------------


def _not_a_store(tmp_path) -> str:
    p = tmp_path / "notes.txt"
    p.write_text("these are not the droids you are looking for\n" * 100)
    return str(p)


def _damaged(tmp_path) -> str:
    """A real store whose pages past the first are overwritten with junk."""
    p = str(tmp_path / "damaged.sqlite")
    s = Store(p)
    with s.tx():
        for i in range(200):
            s.set_meta(f"k{i}", "v" * 500)
    s.close()
    size = os.path.getsize(p)
    with open(p, "r+b") as f:
        f.seek(4096)
        f.write(b"\xa5" * (size - 4096))
    return p


BAD_PATHS = {
    "a missing directory": (lambda tmp: str(tmp / "no" / "such" / "b.sqlite"), "does not exist"),
    "a directory": (lambda tmp: str(tmp), "is a directory"),
    "a file that is not SQLite": (_not_a_store, "not a SQLite file"),
    "a damaged store": (_damaged, "malformed"),
}


@pytest.mark.parametrize("case", list(BAD_PATHS))
def test_a_path_that_cannot_be_a_store_is_a_store_error_naming_it(tmp_path, case):
    make, says = BAD_PATHS[case]
    bad = make(tmp_path)
    with pytest.raises(StoreError, match=says) as err:
        Store(bad)
    assert err.value.path == bad and err.value.operation == "open"
    assert repr(bad) in str(err.value)


@pytest.mark.parametrize("case", list(BAD_PATHS))
def test_a_local_broker_on_a_path_that_cannot_be_a_store_does_not_start(tmp_path, case):
    make, says = BAD_PATHS[case]
    bad = make(tmp_path)
    with pytest.raises(StoreError, match=says):
        LocalBroker("bad", bad)


@contextlib.contextmanager
def read_only_files(*files: str) -> Iterator[None]:
    """Make files read-only for this process. Root writes through file modes, so as root the
    files are made immutable (chattr +i), which binds root too."""
    files = tuple(f for f in files if os.path.exists(f))
    if os.geteuid() != 0:
        for f in files:
            os.chmod(f, 0o444)
        yield
        return
    done = subprocess.run(["chattr", "+i", *files], capture_output=True, text=True)
    if done.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"chattr +i failed on CI: {done.stderr}")
        pytest.skip(f"this file system cannot make files immutable: {done.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", *files], check=True)


def test_a_read_only_store_file_cannot_be_opened(path):
    Store(path).close()
    with read_only_files(path, f"{path}-wal", f"{path}-shm"), pytest.raises(StoreError) as err:
        Store(path)
    assert err.value.path == path and err.value.operation == "open"
    Store(path).close()  # writable again: it opens


# --- faults while the broker runs ------------------------------------------------------------


@contextlib.contextmanager
def disk_full() -> Iterator[None]:
    """No file of this process may grow: a write fails with EFBIG, as on a full disk. (SIGXFSZ
    is ignored, as CPython does by default, so the write fails instead of killing the process.)"""
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)


@contextlib.contextmanager
def read_only(store: Store) -> Iterator[None]:
    """SQLite's own read-only switch: every write is refused with SQLITE_READONLY, as for a file
    opened on a read-only mount (file permissions do not stop root, who may run these tests)."""
    store.db.execute("PRAGMA query_only=ON")
    try:
        yield
    finally:
        store.db.execute("PRAGMA query_only=OFF")


FAULTS = {"disk full": lambda core: disk_full(), "read-only": lambda core: read_only(core.store)}


def _verbs(d1, d2, locked):
    """Calls that write, each a different kind of unit of work."""
    return {
        "send": lambda core: core.apply([Send(d1.init, "Req", [b"x", b"y"])]),
        "begin": lambda core: core.apply(
            [(op := Begin("Init", "Target", "C")), Timer(op.handle, 5)]
        ),
        "create": lambda core: core.create(Queue("NewQ")),
        "commit": lambda core: core.settle([locked.lock_id], [], [], {}, None),
        "end with request id": lambda core: core.apply([Send(d2.init, "Req", b"z")], "req-1"),
    }


@pytest.fixture
def busy(make_core, tmp_path, open_dialog):
    """A broker on a file, with two dialogs, waiting and locked messages and a timer."""
    core = make_core(str(tmp_path / "busy.sqlite"))
    d1 = open_dialog(core, bodies=[b"a", b"b"])
    d2 = open_dialog(core, bodies=[b"c"])
    core.apply([Send(d1.target, "Reply", b"r"), Timer(d1.init, 60)])
    (locked,) = core.receive("TargetQ", handle=d2.target)
    return core, d1, d2, locked


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("verb", ["send", "begin", "create", "commit", "end with request id"])
def test_a_store_fault_is_a_store_error_that_changes_nothing_and_the_call_works_once_it_clears(
    busy, snapshot, fault, verb
):
    core, d1, d2, locked = busy
    call = _verbs(d1, d2, locked)[verb]
    before = snapshot(core)
    with pytest.raises(StoreError) as err, FAULTS[fault](core):
        call(core)
    assert err.value.path == core.store.path and repr(core.store.path) in str(err.value)
    assert not core.store.db.in_transaction  # the transaction was rolled back
    assert snapshot(core) == before
    call(core)  # the same broker, the same call: now it goes through
    assert snapshot(core) != before


def test_messages_sent_after_a_full_disk_clears_keep_their_sequence_numbers(busy):
    core, d1, _, _ = busy
    with pytest.raises(StoreError, match="disk I/O error"), disk_full():
        core.apply([Send(d1.init, "Req", b"lost")])
    core.apply([Send(d1.init, "Req", b"kept")])
    groups = core.receive("TargetQ", handle=d1.target)
    got = [(m.sequence_number, m.body) for g in groups for m in g.messages]
    assert got == [(0, b"a"), (1, b"b"), (2, b"kept")]


def test_a_store_damaged_while_open_is_a_store_error_on_read_naming_the_file(path):
    s = Store(path)
    with s.tx():  # written last, so its pages are at the end of the file
        s.insert_events([(float(i), "kind", f"s{i}", "x" * 500) for i in range(200)])
    s.close()  # checkpoints: everything is in the main file now
    store = Store(path)
    with open(path, "r+b") as f:  # damage the events' pages, which the store has not read yet
        f.seek(-10 * 4096, os.SEEK_END)
        f.write(b"\xa5" * 10 * 4096)
    with pytest.raises(StoreError, match="malformed") as err:
        store.events(0, 1000)
    assert (err.value.path, err.value.operation) == (path, "read")
    assert store.get_meta("broker_id") == store.broker_id  # what is intact still reads
    store.close()
