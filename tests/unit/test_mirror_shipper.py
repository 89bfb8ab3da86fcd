"""The principal's shipper over an in-process mirror (a real SQLite store applying the log) and an
in-process witness: callers are answered only once the mirror holds their transaction; an
unreachable mirror is run without only after the witness has recorded it; a mirror that comes
back is rebuilt and in step again; a stale epoch ends the principal's writes. No Ray."""

from __future__ import annotations

import asyncio

import pytest

from actors.core import BrokerCore, Limits
from actors.errors import MirrorBehind, NotPrincipal, PeerUnreachable
from actors.mirroring import replay, roles
from actors.mirroring.capture import attach
from actors.mirroring.shipper import IN_FLIGHT, Shipper
from actors.store.database import Store
from tests.fakes import FakeClock
from tests.polling import apoll
from tests.unit.conftest import define_core_catalog, open_core_dialog
from tests.unit.test_mirror_log import dump


class Link:
    """The mirror, in process: a store that applies the log; `down` makes it unreachable."""

    def __init__(self, path: str) -> None:
        self.path, self.down, self.line = path, False, -1
        self.store = Store(path)
        self.calls = 0

    def _reach(self) -> None:
        if self.down:
            raise PeerUnreachable.not_running("m")
        self.calls += 1

    async def held(self, epoch: int) -> int:
        self._reach()
        return replay.held_seq(self.store) if self.line == epoch else -1

    async def apply(self, epoch, entries) -> int:
        self._reach()
        if self.line != epoch:
            raise MirrorBehind(-1, entries[0].seq)
        return replay.apply(self.store.db, replay.held_seq(self.store), entries)

    def ship(self, epoch, entries):
        return self.apply(epoch, entries)

    def close(self) -> None:
        pass

    async def rebuild(self, epoch, seq, parts) -> int:
        self._reach()
        self.store.close()
        replay.install(self.path, b"".join(parts))
        self.store = Store(self.path)
        self.line = epoch
        return replay.held_seq(self.store)


class Witness:
    def __init__(self) -> None:
        self.roles = roles.first("b", "p", "m")

    async def fence(self, synchronized: bool) -> None:
        self.roles = roles.set_synchronized(self.roles, "p", 1, synchronized)


@pytest.fixture
def made(tmp_path):
    """Makes (core, capture, link, witness): a captured principal and a mirror reached through
    a link of the class given; both stores closed at the end."""
    made: list[tuple[Store, Link]] = []

    def make(link_class: type = Link) -> tuple:
        store = Store(str(tmp_path / "p.sqlite"))
        capture = attach(store)
        core = BrokerCore(store, FakeClock(), Limits())
        link = link_class(str(tmp_path / "m.sqlite"))
        made.append((store, link))
        return core, capture, link, Witness()

    yield make
    for store, link in made:
        link.store.close()  # the mirror's (a rebuild replaces it)
        store.close()


@pytest.fixture
def setup(made):
    return made()


def started(core, capture, link, witness) -> Shipper:
    """A shipper for `core`'s log, started (in a running loop), and the catalog defined."""
    shipper = Shipper("p", capture, 1, link, witness.fence, lambda: replay.snapshot(core.store.db))
    shipper.start()
    define_core_catalog(core)
    return shipper


def test_callers_wait_for_the_mirror_which_ends_equal_and_the_witness_synchronized(setup):
    core, capture, link, witness = setup

    async def go():
        shipper = started(core, capture, link, witness)
        await shipper.settled(capture.seq)
        assert shipper.state == "synchronized" and shipper.rebuilds == 1  # it started empty
        for _ in range(5):
            open_core_dialog(core)
            await shipper.settled(capture.seq)
            assert replay.held_seq(link.store) == capture.seq  # answered only once mirrored
        await apoll(lambda: witness.roles.synchronized, "the witness to hear it")
        assert shipper.lag()["lag_transactions"] == 0
        await shipper.stop()

    asyncio.run(go())
    assert dump(link.store) == dump(core.store)


def test_a_lost_mirror_is_run_without_only_once_fenced_then_rebuilt_when_back(setup):
    core, capture, link, witness = setup

    async def go():
        shipper = started(core, capture, link, witness)
        await shipper.settled(capture.seq)
        await apoll(lambda: witness.roles.synchronized, "synchronized")
        link.down = True
        open_core_dialog(core)
        await shipper.settled(capture.seq)  # answered: the witness knows it runs alone
        assert shipper.state == "exposed" and not witness.roles.synchronized
        open_core_dialog(core)
        link.down = False
        link.line = -1  # a mirror restarted: it must be rebuilt
        await apoll(lambda: shipper.state == "synchronized", "back in step", 10)
        await shipper.settled(capture.seq)
        await apoll(lambda: witness.roles.synchronized, "synchronized again")
        assert shipper.rebuilds == 2
        await shipper.stop()

    asyncio.run(go())
    assert dump(link.store) == dump(core.store)


def test_a_principal_whose_epoch_is_stale_answers_not_principal(setup):
    core, capture, link, witness = setup

    async def go():
        shipper = started(core, capture, link, witness)
        await shipper.settled(capture.seq)
        await apoll(lambda: witness.roles.synchronized, "synchronized")
        witness.roles = roles.promote(
            witness.roles, "m", 1, principal_answers=True, manual=True, at=0, reason="operator"
        )
        link.down = True  # the new principal does not take its ship: it must ask the witness
        open_core_dialog(core)
        with pytest.raises(NotPrincipal):
            await shipper.settled(capture.seq)
        assert shipper.state == "stale"
        await shipper.stop()

    asyncio.run(go())


class SlowLink(Link):
    """A mirror whose applying takes a while, taking ships in order as the partner does (a
    ship waits for the one before it)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.flying = self.most_flying = self.started = 0  # ships under way, most, started
        self.started_through = 0  # the last entry a started ship carries
        self.applied = asyncio.Event()

    async def apply(self, epoch, entries) -> int:
        self.flying += 1
        self.started += 1
        self.started_through = max(self.started_through, entries[-1].seq)
        self.most_flying = max(self.most_flying, self.flying)
        try:
            await asyncio.sleep(0.02)  # the link's latency: what keeps two ships under way
            while replay.held_seq(self.store) < entries[0].seq - 1:
                self.applied.clear()
                await self.applied.wait()
            held = await super().apply(epoch, entries)
            self.applied.set()
            return held
        finally:
            self.flying -= 1


def test_ships_go_several_at_a_time_and_the_mirror_still_applies_them_in_order(made):
    core, capture, link, witness = made(SlowLink)

    async def go():
        shipper = started(core, capture, link, witness)
        await shipper.settled(capture.seq)
        waits = []
        for _ in range(20):  # commits keep coming while ships are under way
            open_core_dialog(core)
            waits.append(asyncio.ensure_future(shipper.settled(capture.seq)))
            seq = capture.seq
            await apoll(lambda seq=seq: link.started_through >= seq, "its ship to start")
        await asyncio.gather(*waits)
        await shipper.stop()

    asyncio.run(go())
    assert link.most_flying == IN_FLIGHT
    assert dump(link.store) == dump(core.store)


class EagerLink(Link):
    """Records, as it is asked, which entries each ship starts with."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.shipped: list[int] = []

    def ship(self, epoch, entries):
        self.shipped.append(entries[-1].seq)
        return self.apply(epoch, entries)


def test_a_commit_is_shipped_in_its_own_step_once_the_mirror_is_in_step(made):
    core, capture, link, witness = made(EagerLink)

    async def go():
        shipper = started(core, capture, link, witness)
        try:
            await shipper.settled(capture.seq)  # in step (after a rebuild)
            for _ in range(3):
                open_core_dialog(core)  # commits; nothing awaited in between
                assert link.shipped and link.shipped[-1] == capture.seq  # already on its way
                await shipper.settled(capture.seq)
        finally:
            await shipper.stop()

    asyncio.run(go())
    assert dump(link.store) == dump(core.store)


class HeldLink(Link):
    """Ships wait until the test lands them (their answers set)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.ships: list[tuple[asyncio.Future, list]] = []

    def ship(self, epoch, entries):
        answer = asyncio.get_running_loop().create_future()
        self.ships.append((answer, entries))
        return answer

    def land(self) -> None:
        answer, entries = self.ships.pop(0)
        answer.set_result(replay.apply(self.store.db, replay.held_seq(self.store), entries))


def test_a_landed_ship_wakes_the_callers_it_covers_and_not_those_after_it(made):
    core, capture, link, witness = made(HeldLink)

    async def go():
        shipper = started(core, capture, link, witness)
        await shipper.settled(capture.seq)  # caught up (through `apply`, not ships)
        open_core_dialog(core)
        first = capture.seq
        open_core_dialog(core)
        second = capture.seq
        assert [entries[-1].seq for _, entries in link.ships] == [first, second]
        waiting = [asyncio.ensure_future(shipper.settled(s)) for s in (first, second)]
        await apoll(lambda: len(shipper._waiting) == 2, "both callers waiting")
        assert not any(w.done() for w in waiting)
        link.land()
        await apoll(lambda: waiting[0].done(), "the first caller answered")
        assert shipper.acked == first and not waiting[1].done()
        assert [seq for seq, _, _ in shipper._waiting] == [second]  # the other one waits on
        link.land()
        await apoll(lambda: waiting[1].done(), "the second caller answered")
        assert shipper.acked == second and not shipper._waiting
        await shipper.stop()

    asyncio.run(go())
    assert dump(link.store) == dump(core.store)
