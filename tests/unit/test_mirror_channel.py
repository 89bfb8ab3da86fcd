"""Ships over a direct channel (actors.remote.link sends the principal's `apply` there): the log
crosses a real loopback channel, read on the mirror's side by the unpickler that loads no code,
and replays to the same store as over Ray, including a log captured by the release before ships
took the channel; the mirror's refusals arrive as themselves. Real sockets, real SQLite, no Ray."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
from pathlib import Path

import msgpack
import pytest

from actors.client import channel as ch
from actors.errors import MirrorBehind
from actors.mirroring import replay
from actors.mirroring.backlog import Backlog
from actors.mirroring.capture import Entry
from actors.service import channel as srv

DATA = Path(__file__).parent.parent / "data"


def old_log() -> list[Entry]:
    """The log a principal of release e4b58cb captured (tests/data/make_mirror_log_v1.py)."""
    raw = msgpack.unpackb((DATA / "mirror-log-v1.msgpack").read_bytes(), raw=False)
    return [Entry(seq, at, [tuple(s) for s in statements]) for seq, at, statements in raw]


def tables(path: str | Path) -> dict[str, list]:
    db = sqlite3.connect(path)
    try:
        q = "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"
        names = [t for (t,) in db.execute(q)]
        return {t: db.execute(f"SELECT * FROM {t} ORDER BY rowid").fetchall() for t in names}
    finally:
        db.close()


class Mirror:
    """The mirror's side: a copy of the blank store the log started from, taking ships as
    `PartnerActor` does (its channel's `ship` is its `apply`): held in a backlog, answered,
    applied just after."""

    def __init__(self, path: Path) -> None:
        shutil.copyfile(DATA / "mirror-log-v1-start.sqlite", path)
        self.db = sqlite3.connect(path, isolation_level=None)
        self.backlog = Backlog(str(path), 0, sync=False)
        self.arrived: list[list] = []

    async def dispatch(self, order, method, args):
        assert method == "ship" and order is None  # as actors.remote.link sends it
        entries = args[-1]
        self.arrived.append(entries)
        held = self.backlog.accept(entries)
        asyncio.get_running_loop().call_soon(self.backlog.drain, self.db)
        return held

    def get_meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None


def ship_all(mirror: Mirror, ships: list[list[Entry]]) -> list:
    async def main():
        server = srv.ChannelServer(mirror.dispatch, "127.0.0.1")
        channel = await ch.Channel.open(lambda: server.ticket(None), None)
        answers = await asyncio.gather(
            *(channel.send(None, "ship", ("p", b"proof", 1, "line", s)) for s in ships),
            return_exceptions=True,
        )
        channel.close()
        server.close()
        return answers

    return asyncio.run(main())


def test_an_old_releases_log_replays_over_the_channel_as_over_ray(tmp_path):
    entries = old_log()
    assert len(entries) > 10 and any(many for e in entries for many, _, _ in e.statements)
    over_ray = Mirror(tmp_path / "ray.sqlite")
    assert replay.apply(over_ray.db, 0, entries) == entries[-1].seq
    over_channel = Mirror(tmp_path / "channel.sqlite")
    ships = [entries[i : i + 4] for i in range(0, len(entries), 4)]
    assert ship_all(over_channel, ships) == [s[-1].seq for s in ships]
    assert all(type(e) is Entry for ship in over_channel.arrived for e in ship)
    expected = tables(DATA / "mirror-log-v1-end.sqlite")  # the principal's store, row for row
    assert tables(tmp_path / "ray.sqlite") == expected
    assert tables(tmp_path / "channel.sqlite") == expected


def test_a_ship_the_mirror_cannot_take_is_refused_as_itself_and_nothing_of_it_applied(tmp_path):
    entries = old_log()
    mirror = Mirror(tmp_path / "m.sqlite")
    first, gap = ship_all(mirror, [entries[:3], entries[5:8]])
    assert first == entries[2].seq
    assert isinstance(gap, MirrorBehind) and (gap.held, gap.got) == (entries[2].seq, 6)
    assert replay.held_seq(mirror) == entries[2].seq


def test_a_ship_that_is_not_entries_fails_alone_and_the_channel_goes_on(tmp_path):
    mirror = Mirror(tmp_path / "m.sqlite")

    async def main():
        server = srv.ChannelServer(mirror.dispatch, "127.0.0.1")
        channel = await ch.Channel.open(lambda: server.ticket(None), None)
        with pytest.raises(AttributeError, match="seq"):
            await channel.send(None, "ship", ("p", b"proof", 1, "line", [("not", "an entry")]))
        good = await channel.send(None, "ship", ("p", b"proof", 1, "line", old_log()[:2]))
        channel.close()
        server.close()
        return good

    assert asyncio.run(main()) == 2 and replay.held_seq(mirror) == 2
