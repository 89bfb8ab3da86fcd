"""`PartnerActor`: one partner of a mirrored broker, principal or mirror as the witness says.

As **principal** it runs a `BrokerActor` (the ordinary broker, on its own store) with the store's
transactions captured and shipped to the mirror (`actors.mirroring.shipper`); a caller is answered
only once the shipper says so. As **mirror** it checks who ships to it and holds the log in a
`MirrorStore` (`actors.mirroring.mirror_store`: held in order, applied after); every broker verb
sent to it is refused with `NotPrincipal` naming the principal. The mirror pings the principal;
when the principal has not answered for `failover_after_s`, it asks the witness to promote it and
then opens a broker on its store, which reloads everything from it (queues, dialogs, the
transmission queue, timers, activation; locks were in memory only, so they are rolled back). A
partner that learns it is no longer principal (its epoch is stale) closes its broker and becomes
a mirror, rebuilt from the new principal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import ray

from actors.calls.frames import ChannelRefused
from actors.errors import (
    BrokerError,
    InvalidArgument,
    MirrorBehind,
    MirrorMismatch,
    NoFailover,
    NotPrincipal,
    StaleEpoch,
)
from actors.mirroring import replay
from actors.mirroring.capture import Capture, attach
from actors.mirroring.mirror_store import MirrorStore
from actors.mirroring.pairkey import PairKey
from actors.mirroring.roles import FailureDetector, Roles
from actors.mirroring.shipper import Shipper
from actors.model.limits import Limits
from actors.remote.broker import BrokerActor, node_channels
from actors.remote.client import direct_allowed
from actors.remote.link import SHIP, SHIP_BYTES, RayLink, unwrap
from actors.remote.witness import witness_name
from actors.service.channel import ChannelServer

log = logging.getLogger("raybroker")

WATCH_S = 0.1  # how often the mirror pings the principal (and the principal the witness)
PING_S = 0.3  # how long a ping may take
PING_LATE_S = 0.15  # a ping's timeout heard this much later than PING_S tells nothing
PING_GROUP = "ping"  # the actor's concurrency group (its own thread and loop) that answers pings


class PartnerActor:
    def __init__(
        self,
        partner: str,
        broker: str,
        path: str,
        durability: str,
        limits: dict[str, Any],
        namespace: str,
        failover_after_s: float,
        key: PairKey,
    ) -> None:
        self.partner, self.broker, self.path, self.key = partner, broker, path, key
        self.durability, self.limits, self.namespace = durability, limits, namespace
        self.failover_after_s = failover_after_s
        self.acting, self.epoch, self.principal = "starting", 0, ""
        self.service: BrokerActor | None = None
        self.capture: Capture | None = None
        self.shipper: Shipper | None = None
        self.link: RayLink | None = None  # the principal's to its mirror
        self.mirror: MirrorStore | None = None  # the mirror's store, and what it holds
        self.line: tuple[int, str] | None = None  # the principal (epoch, incarnation) that
        # last rebuilt this mirror; only its log applies here (None: rebuild first)
        self.became: float | None = None  # when this partner last became principal
        self.refused = 0  # verbs and deliveries refused while not principal
        self._pinged: tuple[str, Any] | None = None  # (principal, its actor): the mirror's pings
        self.witness = ray.get_actor(witness_name(broker), namespace=namespace)
        self.ready = asyncio.Event()
        self.boot_error: BaseException | None = None
        self._switching = asyncio.Lock()
        self._channels: ChannelServer | None = None  # direct channels (when first asked)
        self._tasks = [asyncio.get_running_loop().create_task(self._boot())]

    # --- roles -----------------------------------------------------------------------------------

    async def _boot(self) -> None:
        try:
            await self._take(Roles(**await self.witness.get.remote()))
        except BaseException as exc:
            self.boot_error = exc
            raise
        finally:
            self.ready.set()
        self._tasks.append(asyncio.get_running_loop().create_task(self._watch()))

    async def _take(self, record: Roles) -> None:
        """Adopt the witness's record: open a broker, or become (or stay) a mirror."""
        async with self._switching:
            self.epoch, self.principal = record.epoch, record.principal
            want = record.role_of(self.partner)
            if want == self.acting:
                if want == "principal" and self.shipper is not None:
                    self.shipper.epoch = record.epoch
                return
            if want == "principal":
                await self._become_principal(record)
            else:
                await self._become_mirror()

    async def _become_principal(self, record: Roles) -> None:
        if self.mirror is not None:
            await self.mirror.apply_all()  # everything it held, before a broker opens the store
            if self.mirror.failed:
                why = f"its backlog cannot be applied: {self.mirror.failed}"
                raise NoFailover(self.broker, why)
            self._close_store()
        service = BrokerActor(self.partner, self.path, self.durability, self.limits, self.namespace)
        if service.start_error is not None:
            raise service.start_error
        self.service, self.capture = service, attach(service.core.store)
        self.link = link = RayLink(
            record.partner_of(self.partner), self.namespace, service.core.broker_id,
            self.partner, self.key,
        )  # fmt: skip
        self.shipper = Shipper(
            self.partner,
            self.capture,
            record.epoch,
            link,
            self._fence,
            lambda: replay.snapshot(service.core.store.db),
            lambda kind, detail: service.write_event(kind, self.broker, detail),
            fenced=not record.synchronized,
        )
        self.shipper.start()
        self.acting, self.became = "principal", time.time()
        if record.last_failover and record.last_failover.get("to") == self.partner:
            moved = record.last_failover
            service.write_event("Failover", self.broker, f"{moved['from']} -> {self.partner}")

    async def _become_mirror(self) -> None:
        if self.service is not None:
            assert self.shipper is not None
            await self.shipper.stop()
            await self.service.close()
            self.service = self.capture = self.shipper = None
        self.mirror = MirrorStore(self.path, self.durability, self.partner)
        self.acting, self.line = "mirror", None  # whoever is principal now rebuilds it

    def _close_store(self) -> None:
        if self.mirror is not None:
            self.mirror.close()
        self.mirror = None

    async def _fence(self, synchronized: bool) -> None:
        proof = self.key.prove(self.partner, "set_synchronized")
        await unwrap(
            self.witness.set_synchronized.remote(self.partner, self.epoch, synchronized, proof)
        )

    async def _watch(self) -> None:
        detector = FailureDetector(self.failover_after_s)
        next_witness = 0.0
        while True:
            await asyncio.sleep(WATCH_S)
            try:
                if self.acting == "mirror":
                    sent = time.monotonic()
                    lost = detector.observe(await self._principal_answers(), sent)
                    if lost:
                        await self._promote(manual=False, reason="the principal stopped answering")
                        detector = FailureDetector(self.failover_after_s)
                elif self.shipper is not None and self.shipper.state == "stale":
                    await self._refresh()
                elif time.monotonic() >= next_witness:  # a principal checks it still is one
                    next_witness = time.monotonic() + 1.0
                    await self._refresh()
            except (NoFailover, StaleEpoch) as exc:
                log.warning("partner %s: %s", self.partner, exc)
                await self._refresh()
            except Exception:  # the watch must go on: logged, tried again
                log.exception("partner %s: watching its partner failed", self.partner)

    async def _refresh(self) -> None:
        record = Roles(**await asyncio.wait_for(self.witness.get.remote(), 5.0))
        if record.epoch < self.epoch:  # a witness that lost its record: act on nothing it says
            log.error(
                "partner %s: the witness is at epoch %d, behind this partner's %d (its record "
                "file was lost?); this partner takes no role change from it",
                self.partner, record.epoch, self.epoch,
            )  # fmt: skip
            return
        if record.epoch != self.epoch or record.role_of(self.partner) != self.acting:
            await self._take(record)

    async def _principal_answers(self) -> bool | None:
        """Whether the principal answered a ping; None: its timeout was heard so late that
        this partner's own loop was the one too busy to listen (see `FailureDetector`)."""
        sent = time.monotonic()
        try:
            handle = self._principal_handle()
            claim = await asyncio.wait_for(handle.role.remote(), PING_S)
        except TimeoutError:
            return None if time.monotonic() - sent > PING_S + PING_LATE_S else False
        except (ValueError, ray.exceptions.RayError):
            self._pinged = None  # looked up again next time: it may be another actor now
            return False
        return claim.get("role") == "principal" or claim.get("epoch", 0) > self.epoch

    def _principal_handle(self) -> Any:
        """The principal's actor, looked up once per principal (and again after a failed ping):
        a lookup is a synchronous round trip to Ray's control store, which ten pings a second
        made on this mirror's event loop, between the ships it answers."""
        if self._pinged is None or self._pinged[0] != self.principal:
            self._pinged = (self.principal, ray.get_actor(self.principal, namespace=self.namespace))
        return self._pinged[1]

    async def _promote(self, manual: bool, reason: str) -> dict[str, Any]:
        if self.mirror is not None and self.mirror.failed:
            raise NoFailover(self.broker, f"its mirror's backlog failed: {self.mirror.failed}")
        proof = self.key.prove(self.partner, "promote")
        ref = self.witness.promote.remote(self.partner, self.epoch, manual, reason, proof)
        record = await unwrap(ref)
        await self._take(Roles(**record))
        return record

    async def failover(self) -> dict[str, Any]:
        """The operator's failover, asked of the mirror: it becomes principal (if synchronized);
        the old principal steps down when it next ships or checks the witness."""
        await self.ready.wait()
        if self.acting != "mirror":
            raise NoFailover(self.broker, f"{self.partner!r} is the principal; ask the mirror")
        return await self._promote(manual=True, reason="manual failover")

    # --- what anyone may ask ---------------------------------------------------------------------

    @ray.method(concurrency_group=PING_GROUP)
    async def role(self) -> dict[str, Any]:
        """What this partner claims: its role and epoch (senders on mirror routes ask this).
        Answered on a thread of its own (`PING_GROUP`): a principal whose loop is busy with a
        burst of commits still answers its mirror's pings, which used to time out under load
        and had the mirror take over from a principal that was well."""
        return {"partner": self.partner, "role": self.acting, "epoch": self.epoch,
                "principal": self.principal}  # fmt: skip

    async def mirror_status(self) -> dict[str, Any]:
        await self.ready.wait()
        out = await self.role() | {"broker": self.broker, "path": self.path,
                                   "refused_not_principal": self.refused,
                                   "node": ray.get_runtime_context().get_node_id()}  # fmt: skip
        if self.shipper is not None:
            out |= self.shipper.lag() | {
                "became_principal_at": self.became,
                "ships_travel": self.link.ships_travel if self.link else "-",
            }
        elif (mirror := self.mirror) is not None:
            in_step = self.line is not None and self.line[0] == self.epoch and not mirror.failed
            out |= {"state": "in step" if in_step else "awaiting rebuild",
                    "seq": mirror.backlog.received, "applied": mirror.backlog.applied_seq,
                    "applied_at": mirror.applied_at, "backlog_failed": mirror.failed}  # fmt: skip
        return out

    async def info(self) -> dict[str, Any]:
        await self._ready()
        if self.service is not None:
            return await self.service.info() | await self.role()
        assert self.mirror is not None
        return await self.role() | {
            "name": self.partner, "broker_id": self.mirror.store.broker_id, "path": self.path,
            "durability": self.durability, "limits": self.limits, "pid": os.getpid(),
            "node": ray.get_runtime_context().get_node_id(),
        }  # fmt: skip

    async def _ready(self) -> None:
        await self.ready.wait()
        if self.boot_error is not None:
            raise self.boot_error

    # --- the principal's verbs: answered once the mirror holds them ----------------------------

    async def _principal(self) -> BrokerActor:
        await self._ready()
        if self.service is None:
            self.refused += 1
            raise NotPrincipal(self.partner, self.principal or None, self.epoch)
        return self.service

    async def _answer(self, run: Callable[[BrokerActor], Awaitable[Any]]) -> Any:
        """Run a broker verb as principal; answer once the shipper says so. The shipper is the
        one this call committed under: if this partner steps down meanwhile, it says
        `NotPrincipal` (the client retries on the new principal, with the same request id)."""
        service = await self._principal()
        shipper, capture = self.shipper, self.capture
        assert shipper is not None and capture is not None
        try:
            out = await run(service)
        except Exception:
            if self.service is not service:  # stepped down under it: its store is closed
                raise NotPrincipal(self.partner, self.principal or None, self.epoch) from None
            raise
        await shipper.settled(capture.seq)
        return out

    async def call(self, order: Any, method: str, *args: Any) -> Any:
        return await self._answer(lambda service: service.call(order, method, *args))

    async def calls(self, order: Any, batch: list) -> list:
        return await self._answer(lambda service: service.calls(order, batch))

    async def deliver(self, blob: bytes) -> bytes:
        return await self._answer(lambda service: service.deliver(blob))

    # --- direct channels: clients' calls to the principal, the principal's ships to the mirror

    async def open_channel(self, holder: list) -> tuple[str, int, str] | None:
        """(host, port, ticket) of a direct channel to this partner (actors.client.channel), as
        a broker's `open_channel`. Its calls are a client's verbs (answered as principal, as
        through Ray) and the principal's ships (as mirror), which then skip the object store
        a ship over Ray goes through when it is larger than Ray passes inline."""
        if not direct_allowed():
            return None
        try:
            if self._channels is None:
                most = max(Limits.of(self.limits).max_call_bytes, SHIP_BYTES)
                self._channels = node_channels(self._dispatch, self._undelivered, most)
            return await self._channels.ticket(holder[0])
        except (InvalidArgument, ChannelRefused) as exc:  # the node's setting: calls use Ray
            log.error("partner %s opens no direct channels: %s", self.partner, exc)
            return None

    async def _dispatch(self, order: Any, method: str, args: tuple[Any, ...]) -> Any:
        if method == SHIP:  # the principal's, to this mirror (not a client's verb `apply`)
            return await self.apply(*args)
        return await self._answer(lambda service: service.dispatch(order, method, args))

    def _undelivered(self, order: Any, method: str, args: Any, result: Any) -> int:
        service = self.service
        return 0 if service is None else service.undelivered(order, method, args, result)

    async def holder_alive(self, handle: Any) -> bool | None:
        return await (await self._principal()).holder_alive(handle)

    async def reader_actors(self, queue: str) -> list[Any]:
        return await (await self._principal()).reader_actors(queue)

    # --- the mirror's verbs: the principal ships here (with this start's key) -------------------

    async def _mirror(self, caller: str, proof: bytes, method: str, epoch: int) -> MirrorStore:
        self.key.check(caller, method, proof)
        await self._ready()
        if epoch > self.epoch:  # a failover this partner has not heard of yet
            await self._refresh()
        if self.acting != "mirror" or epoch != self.epoch:
            raise StaleEpoch(f"the principal of epoch {epoch}", epoch, self.epoch)
        assert self.mirror is not None
        return self.mirror

    async def held(self, caller: str, proof: bytes, epoch: int, line: str) -> int:
        mirror = await self._mirror(caller, proof, "held", epoch)
        in_line = self.line == (epoch, line) and not mirror.failed
        return mirror.backlog.received if in_line else -1

    async def apply(self, caller: str, proof: bytes, epoch: int, line: str, entries: list) -> int:
        """Hold the principal's transactions (`actors.mirroring.mirror_store`): answered once
        they are in the backlog's file, applied to the store just after (with whatever else
        waits)."""

        async def in_line() -> None:
            mirror = await self._mirror(caller, proof, "apply", epoch)
            if self.line != (epoch, line) or mirror.failed:
                raise MirrorBehind(-1, entries[0].seq if entries else 0)

        mirror = await self._mirror(caller, proof, "apply", epoch)
        return await mirror.hold(entries, in_line)

    async def rebuild(
        self,
        caller: str,
        proof: bytes,
        epoch: int,
        line: str,
        seq: int,
        parts: list[bytes],
        broker_id: str,
    ) -> int:
        await (await self._mirror(caller, proof, "rebuild", epoch)).quiet()  # (then replaced)
        mirror = await self._mirror(caller, proof, "rebuild", epoch)  # (no wait: it is ready)
        store = mirror.store
        if store.broker_id != broker_id and not replay.is_blank(store):
            raise MirrorMismatch(
                f"{self.partner!r} holds broker {store.broker_id} in {self.path!r}, not broker "
                f"{broker_id} it would mirror; give it an empty store (or the same broker's)"
            )
        mirror.replace(b"".join(parts), seq)
        self.line = (epoch, line)
        return seq

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._channels is not None:
            self._channels.close()
        with contextlib.suppress(BrokerError):
            if self.service is not None:
                await self.service.close()
        if self.mirror is not None:
            await self.mirror.apply_all()  # what it holds, in the store (else its file has it)
        self._close_store()
