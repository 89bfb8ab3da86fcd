"""The log stream (`actors.mirroring.stream`): a principal's ships to its mirror over a socket of
their own. What crosses it replays to the same store as the log shipped over Ray, including a log
captured by the release before the stream; each SQL text crosses once per connection; a refusal,
a wrong hello, a lost connection or a silent mirror close the stream, and every ship still
waiting hears so. Real sockets on localhost, real SQLite stores, no Ray."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
from pathlib import Path

import msgpack
import pytest

from actors.errors import LogStreamLost, MirrorBehind, MirrorCallerRefused
from actors.mirroring import replay, stream
from actors.mirroring.capture import Entry
from actors.mirroring.pairkey import PairKey, new_key
from tests.polling import apoll

DATA = Path(__file__).parent.parent / "data"


def old_log() -> list[Entry]:
    """The log a principal of release e4b58cb captured (tests/data/make_mirror_log_v1.py)."""
    raw = msgpack.unpackb((DATA / "mirror-log-v1.msgpack").read_bytes(), raw=False)
    return [Entry(seq, at, [tuple(s) for s in statements]) for seq, at, statements in raw]


def tables(path: str) -> dict[str, list]:
    db = sqlite3.connect(path)
    try:
        q = "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"
        names = [t for (t,) in db.execute(q)]
        return {t: db.execute(f"SELECT * FROM {t} ORDER BY rowid").fetchall() for t in names}
    finally:
        db.close()


def copy_of(name: str, tmp_path: Path, as_name: str) -> str:
    path = tmp_path / as_name
    shutil.copyfile(DATA / name, path)
    return str(path)


def apply_to(path: str, entries: list[Entry]) -> int:
    db = sqlite3.connect(path, isolation_level=None)
    try:
        return replay.apply(db, 0, entries)
    finally:
        db.close()


def test_an_old_releases_log_replays_the_same_over_the_stream_as_over_ray(tmp_path):
    entries = old_log()
    assert len(entries) > 10 and any(many for e in entries for many, _, _ in e.statements)
    over_ray = copy_of("mirror-log-v1-start.sqlite", tmp_path, "ray.sqlite")
    over_stream = copy_of("mirror-log-v1-start.sqlite", tmp_path, "stream.sqlite")
    assert apply_to(over_ray, entries) == entries[-1].seq
    epoch, decoded = stream.LogDecoder().decode(stream.LogEncoder().encode(7, entries))
    assert epoch == 7 and [e.seq for e in decoded] == [e.seq for e in entries]
    assert apply_to(over_stream, decoded) == entries[-1].seq
    expected = tables(str(DATA / "mirror-log-v1-end.sqlite"))
    assert tables(over_ray) == expected  # the principal's store, row for row
    assert tables(over_stream) == expected


def test_each_sql_text_crosses_once_per_connection():
    entries = old_log()
    encoder, decoder = stream.LogEncoder(), stream.LogDecoder()
    first = encoder.encode(1, entries)
    again = encoder.encode(1, entries)  # the same statements: only their numbers and values
    assert msgpack.unpackb(first)[1] and msgpack.unpackb(again)[1] == []
    assert len(again) < len(first)
    _, one = decoder.decode(first)
    _, two = decoder.decode(again)
    assert [e.statements for e in one] == [e.statements for e in two]
    sql = [s[1] for e in entries for s in e.statements]
    assert [s[1] for e in two for s in e.statements] == sql


class Mirror:
    """The mirror's end of the stream on localhost: a store that applies what arrives."""

    def __init__(self, path: str, key: PairKey) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.key, self.refuse, self.stall, self.connections = key, False, False, 0
        self.writers: list[asyncio.StreamWriter] = []

    def admit(self, hello: list) -> stream.Applier:
        caller, proof, _line = hello
        self.key.check(caller, "apply", proof)
        self.connections += 1
        return self.apply

    async def apply(self, epoch: int, entries: list[Entry]) -> int:
        if self.refuse:
            raise MirrorBehind(-1, entries[0].seq)
        if self.stall:
            await asyncio.Event().wait()
        return replay.apply(self.db, replay.held_seq(self), entries)

    def get_meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None


@pytest.fixture
def mirror(tmp_path):
    key = PairKey("b", new_key(), ("p", "m"))
    m = Mirror(copy_of("mirror-log-v1-start.sqlite", tmp_path, "m.sqlite"), key)
    yield m
    m.db.close()


async def serving(mirror: Mirror) -> tuple[asyncio.Server, int]:
    async def handle(reader, writer):
        mirror.writers.append(writer)
        await stream.serve(reader, writer, mirror.admit)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def hello(mirror: Mirror, caller: str = "p") -> list:
    return [caller, mirror.key.prove(caller, "apply"), "line"]


def test_ships_in_flight_together_are_applied_in_order_and_answered_each(mirror, tmp_path):
    entries = old_log()

    async def go():
        server, port = await serving(mirror)
        log = await stream.LogStream.connect("127.0.0.1", port, hello(mirror), 5)
        parts = [entries[i : i + 4] for i in range(0, len(entries), 4)]
        answers = await asyncio.gather(*(log.ship(1, part, 5) for part in parts))
        assert answers == [part[-1].seq for part in parts]
        assert await log.ship(1, entries[:3], 5) == entries[-1].seq  # held already: skipped
        log.close()
        server.close()

    asyncio.run(go())
    assert tables(str(tmp_path / "m.sqlite")) == tables(str(DATA / "mirror-log-v1-end.sqlite"))


def test_a_refused_ship_closes_the_stream_and_every_ship_after_it_hears_so(mirror):
    entries = old_log()

    async def go():
        server, port = await serving(mirror)
        log = await stream.LogStream.connect("127.0.0.1", port, hello(mirror), 5)
        assert await log.ship(1, entries[:2], 5) == entries[1].seq
        mirror.refuse = True
        refused = [log.ship(1, entries[i : i + 1], 5) for i in range(2, 5)]
        outcomes = await asyncio.gather(*refused, return_exceptions=True)
        assert all(isinstance(o, LogStreamLost) for o in outcomes), outcomes
        assert log.closed and "refused" in str(outcomes[0])
        with pytest.raises(LogStreamLost):
            await log.ship(1, entries[5:6], 5)
        server.close()

    asyncio.run(go())
    assert replay.held_seq(mirror) == entries[1].seq  # nothing after the refusal applied


def test_a_hello_without_the_pairs_proof_is_never_read_further(mirror):
    entries = old_log()
    refused: list[Exception] = []
    admit = mirror.admit

    def checked(hello_frame):
        try:
            return admit(hello_frame)
        except MirrorCallerRefused as exc:
            refused.append(exc)
            raise

    mirror.admit = checked

    async def go():
        server, port = await serving(mirror)
        wrong = ["p", PairKey("b", new_key(), ("p", "m")).prove("p", "apply"), "line"]
        log = await stream.LogStream.connect("127.0.0.1", port, wrong, 5)
        with pytest.raises(LogStreamLost):
            await log.ship(1, entries, 5)
        server.close()

    asyncio.run(go())
    assert refused and mirror.connections == 0 and replay.held_seq(mirror) == 0


def test_a_silent_mirror_times_the_ship_out_and_closes_the_stream(mirror):
    entries = old_log()

    async def go():
        server, port = await serving(mirror)
        log = await stream.LogStream.connect("127.0.0.1", port, hello(mirror), 5)
        mirror.stall = True
        with pytest.raises(TimeoutError):
            await log.ship(1, entries[:1], 0.2)
        assert log.closed  # not waited for again: the next ship goes another way
        with pytest.raises(LogStreamLost):
            await log.ship(1, entries[:1], 5)
        server.close()

    asyncio.run(go())


def test_a_mirror_whose_connection_drops_fails_every_ship_waiting_for_it(mirror):
    entries = old_log()

    async def go():
        server, port = await serving(mirror)
        log = await stream.LogStream.connect("127.0.0.1", port, hello(mirror), 5)
        mirror.stall = True
        waiting = [asyncio.ensure_future(log.ship(1, entries[i : i + 1], 5)) for i in range(3)]
        await apoll(lambda: mirror.writers, "the mirror to take the connection")
        for writer in mirror.writers:  # the mirror's process is gone
            writer.transport.abort()
        outcomes = await asyncio.gather(*waiting, return_exceptions=True)
        assert all(isinstance(o, LogStreamLost) for o in outcomes), outcomes
        assert log.closed
        server.close()

    asyncio.run(go())
