"""The client: start or find a broker actor, and call its verbs from a driver, a task or an actor.

`Broker` is synchronous; `broker.aio` is the same handle with every verb as a coroutine. This is
the one place that turns Ray's errors into ours: a broker error raised in the actor is re-raised
as itself, and a broker that is restarting is retried (with the same request id, so a retried
call is applied once) until `retry_s` runs out, then `BrokerUnavailable`. Every call carries the
handle's order (`actors.calls.ordering`), so calls in flight together apply in the order issued.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import ray

from actors import collector
from actors.calls.envelope import NOTHING_RECEIVED, answered_locks, unpack_received
from actors.calls.ordering import Issuer
from actors.client.calloop import call_loop, on_call_loop_thread
from actors.client.channel import Channel, ChannelBroken, Channels
from actors.client.coalesce import Coalescer
from actors.client.verbs import Verbs, lock_ids
from actors.errors import BrokerError, BrokerUnavailable, InvalidArgument
from actors.service.calls import BATCH_VERBS

DEFAULT_NAMESPACE = "raybroker"
STOP_WAIT_S = 30.0  # how long `stop` waits for Ray to release a killed broker's name
_TRANSIENT = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)


class _Token(NamedTuple):
    """This process's lock holder, made once per worker process."""

    worker: str  # the Ray worker id it was made for
    holder: str  # its name
    ref: ray.ObjectRef  # a small object it owns (see lock_holder)
    context: Any  # Ray's runtime context, whose worker object is this process's
    # that worker's core worker when it was made: a new one once Ray starts again (held, so a
    # shut-down one's identity cannot be reused; replaced at the next call after a restart)
    core: Any


_token: _Token | None = None


def lock_holder() -> tuple[str, list[ray.ObjectRef]]:
    """Who holds the locks this process takes, and how the broker tells that it died.

    The id names this worker process: a driver, a task's worker or an actor's current
    incarnation (a restarted actor is a new holder, so its old locks are not mistaken for its
    own). The token is a small object this process owns: Ray loses an object whose owner died,
    so the broker awaiting it learns of the death (OwnerDiedError) within about a second, for
    drivers, tasks and actors alike. It travels in a list so Ray passes it unresolved."""
    token = _current_token()
    return token.holder, [token.ref]


def _current_token() -> _Token:
    """This Ray start's token, made on first use."""
    global _token
    token = _token
    # Every receive asks. The same core worker is the same Ray start, so the same worker id:
    # 0.5 us, where asking the runtime context for the worker id took 5 (7% of a busy asyncio
    # client's CPU). Without that attribute it asks every time, as it did.
    if token is None or token.core is None or _core_worker(token.context) is not token.core:
        context = ray.get_runtime_context()  # connects to Ray if this process has not
        worker = context.get_worker_id()
        if token is None or token.worker != worker:  # a new process, or Ray started again
            actor = context.get_actor_id()
            holder = f"actor-{actor}-{worker[:8]}" if actor else f"worker-{worker[:16]}"
            token = _Token(worker, holder, ray.put(b""), context, None)
        _token = token = token._replace(core=_core_worker(context))
    return token


def _core_worker(context: Any) -> Any:
    return getattr(context.worker, "core_worker", None)


def _reraise(exc: ray.exceptions.RayTaskError) -> None:
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BrokerError):
        raise cause.with_traceback(None) from None
    raise exc


log = logging.getLogger("raybroker")


class _Call:
    """One call to the broker actor, over the direct channel or through Ray: numbered in its
    handle's order, retried with the same number (and request id) while the broker restarts,
    until `retry_s` is up. A verb goes through the actor's `call`; a coalesced batch through
    `calls`."""

    def __init__(
        self, broker: Broker, method: str, args: tuple[Any, ...], batch: bool = False
    ) -> None:
        self.broker, self.method, self.args, self.batch = broker, method, args, batch
        self.seq = broker.issuer.issue()
        # set while the broker may still run the call: Ray's reference, or the channel's future
        self.ref: ray.ObjectRef | asyncio.Future | None = None
        self.deadline = time.monotonic() + broker.retry_s
        self.delay = 0.05

    def submit(self) -> ray.ObjectRef:
        b = self.broker
        order = b.issuer.order(self.seq)
        if self.batch:
            self.ref = b.actor.calls.remote(order, *self.args)
        else:
            self.ref = b.actor.call.remote(order, self.method, *self.args)
        return self.ref

    async def send_on(self, channel: Channel) -> Any:
        """The call over a direct channel (actors.client.channel); `ChannelBroken` if it cannot be
        sent or answered there (then it goes again, as itself, through Ray)."""
        method, args = ("calls", self.args) if self.batch else (self.method, self.args)
        self.ref = answer = channel.send(self.broker.issuer.order(self.seq), method, args)
        # shielded: a caller that leaves does not cancel the answer, which the order waits for
        return await asyncio.shield(answer)

    def answer(self, result: Any, post: Callable[[Any], Any] | None) -> Any:
        self.ref = None
        return post(result) if post else result

    def failed(self, exc: ray.exceptions.RayError) -> float:
        """Raise what the caller should see, or say how long to wait before trying again."""
        self.ref = None  # answered, with an error
        if self.broker.follow(exc):  # a mirrored broker's principal moved: retry there
            if time.monotonic() + self.delay > self.deadline:
                raise BrokerUnavailable(
                    f"mirrored broker {self.broker.name!r} had no principal within "
                    f"{self.broker.retry_s}s ({exc})"
                ) from None
            delay, self.delay = self.delay, min(self.delay * 2, 0.5)
            return delay
        if isinstance(exc, ray.exceptions.RayTaskError):
            _reraise(exc)
        if not isinstance(exc, _TRANSIENT):
            raise exc
        name = self.broker.name
        if isinstance(exc, ray.exceptions.ActorDiedError) and "creation task" in str(exc):
            # its constructor failed (a bad store path, say): it will not come back
            raise BrokerUnavailable(
                f"broker {name!r} could not start; its constructor failed: {exc}"
            ) from None
        if time.monotonic() + self.delay > self.deadline:
            raise BrokerUnavailable(
                f"broker {name!r} did not answer within {self.broker.retry_s}s ({exc})"
            ) from None
        delay, self.delay = self.delay, min(self.delay * 2, 1.0)
        return delay  # the actor is restarting

    def close(self) -> None:
        """A call is answered when its reply has come (Ray's, or the channel's): one interrupted
        before (KeyboardInterrupt, a cancelled coroutine) may still run, so the order's floor
        must not pass it until then."""
        issuer, seq, ref = self.broker.issuer, self.seq, self.ref
        if ref is None or (isinstance(ref, asyncio.Future) and ref.done()):
            issuer.answered(seq)
        elif isinstance(ref, asyncio.Future):  # sent over the channel
            ref.add_done_callback(lambda _: issuer.answered(seq))
        else:
            ref.future().add_done_callback(lambda _: issuer.answered(seq))


class Broker(Verbs):
    """A handle on one broker actor (`actors.client.verbs.BrokerHandle`). Picklable: pass it to
    tasks and actors."""

    direct = True  # calls may go over a direct channel (actors.client.channel)

    def __init__(
        self, actor: Any, name: str, namespace: str = DEFAULT_NAMESPACE, retry_s: float = 60.0
    ) -> None:
        self.actor = actor
        self.name = name
        self.namespace = namespace
        self.retry_s = retry_s
        self.issuer = Issuer()  # this handle's calls, numbered (a pickled copy is a new client)
        self.aio = AsyncBroker(self)
        self._batch_callers = 0  # threads in an apply / settle / receive of this handle now
        self._batch_lock = threading.Lock()
        # what this process makes per call is short-lived: young passes far apart, unless the
        # process's owner tuned its collector (actors.collector)
        collector.client_process()

    def __reduce__(self):
        return Broker, (self.actor, self.name, self.namespace, self.retry_s)

    def _owner(self) -> tuple[str, Any] | None:
        return lock_holder()

    def result(self, ref: ray.ObjectRef) -> Any:
        """A call's answer (a mirrored broker's handle also watches for a failover meanwhile)."""
        return ray.get(ref)

    async def result_async(self, ref: ray.ObjectRef) -> Any:
        return await ref

    async def channel_result(self, answer: Awaitable[Any]) -> Any:
        """A call's answer over the direct channel (a mirrored broker's handle also watches for
        a failover meanwhile)."""
        return await answer

    def follow(self, exc: ray.exceptions.RayError) -> bool:
        """Whether a failed call should be retried on another actor this handle now points to
        (a mirrored broker's handle follows its principal; see actors.remote.mirrored)."""
        return False

    def _call(self, method: str, *args: Any, post: Callable[[Any], Any] | None = None) -> Any:
        if method not in BATCH_VERBS:
            return self._direct(method, args, post)
        entered = False  # counted in: an interrupt before that must not leave the count up
        try:
            with self._batch_lock:
                self._batch_callers += 1
                entered, alone = True, self._batch_callers == 1
            # not coalesced: a lone caller would only wait for the batch; and a call made on
            # the call loop itself cannot wait for that loop
            if alone or on_call_loop_thread():
                return self._direct(method, args, post)
            # other threads are calling too: coalesced with theirs on the process's call loop
            # (a few actor calls per round for 100 threads of one message each, not 100)
            return call_loop().run(self.aio.coalesced(method, args, post))
        finally:
            if entered:
                with self._batch_lock:
                    self._batch_callers -= 1

    def _direct(self, method: str, args: tuple[Any, ...], post: Callable[[Any], Any] | None) -> Any:
        if self.direct and direct_allowed() and not on_call_loop_thread():
            # over the call loop's direct channel (a hop between threads costs far less than
            # the Ray call it saves); the loop's own thread cannot wait for itself
            return call_loop().run(self.aio.one_call(method, args, post))
        call = _Call(self, method, args)
        try:
            while True:  # a retry keeps its number: it takes the same place in the order
                try:
                    return call.answer(self.result(call.submit()), post)
                except ray.exceptions.RayError as exc:
                    time.sleep(call.failed(exc))
        finally:
            call.close()

    def stop(self, delete_store: bool = False) -> None:
        """Stop this broker for good: kill its actor with no restart and wait until its name is
        free. `delete_store=True` also removes its SQLite file and the -wal/-shm files beside it,
        from this machine's file system (so call it on the broker's node)."""
        path = self.info()["path"] if delete_store else ":memory:"  # only the actor knows it
        ray.kill(self.actor, no_restart=True)
        deadline = time.monotonic() + STOP_WAIT_S
        # ray.kill returns before Ray drops the name; wait, so the name can be reused at once
        while _holds_name(self):
            if time.monotonic() > deadline:
                raise BrokerUnavailable(f"Ray still holds {self.name!r} {STOP_WAIT_S}s after kill")
            time.sleep(0.02)
        if path != ":memory:":
            lock = f"{os.path.realpath(path)}.lock"  # the store's lock file (actors.store.file)
            for f in (path, f"{path}-wal", f"{path}-shm", lock):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(f)


# The process's direct channels to brokers (actors.client.channel), shared by its handles.
_channels = Channels()


def direct_allowed() -> bool:
    """Whether handles may call over direct channels: not when `RAYBROKER_DIRECT=0`, nor when
    Ray runs with TLS (`RAY_USE_TLS`), whose encryption the channel does not have."""
    return os.environ.get("RAYBROKER_DIRECT", "1") != "0" and os.environ.get(
        "RAY_USE_TLS", "0"
    ).lower() not in ("1", "true")


def _holds_name(broker: Broker) -> bool:
    try:  # ActorHandle equality is actor identity: a new broker of that name does not count
        return ray.get_actor(broker.name, namespace=broker.namespace) == broker.actor
    except ValueError:
        return False


def stop_broker(name: str, namespace: str = DEFAULT_NAMESPACE, delete_store: bool = False) -> None:
    """Stop the running broker `name` for good (see `Broker.stop`)."""
    connect(name, namespace).stop(delete_store)


class AsyncBroker(Verbs):
    """The same verbs as `Broker`, as coroutines (for async actors and asyncio drivers).
    Concurrent apply / settle / receive calls on one event loop travel to the broker together
    (actors.client.coalesce)."""

    def __init__(self, sync: Broker) -> None:
        self._sync = sync
        self.name = sync.name
        self._coalescers: weakref.WeakKeyDictionary[Any, Coalescer] = weakref.WeakKeyDictionary()

    def _owner(self) -> tuple[str, Any] | None:
        return lock_holder()

    def _coalescer(self) -> Coalescer:
        loop = asyncio.get_running_loop()  # futures belong to one loop: one coalescer each
        coalescer = self._coalescers.get(loop)
        if coalescer is None:
            coalescer = Coalescer(self._send_batch, self._wait_take, self._give_back)
            self._coalescers[loop] = coalescer
        return coalescer

    async def _call(self, method: str, *args: Any, post: Callable[[Any], Any] | None = None) -> Any:
        if method not in BATCH_VERBS:
            return await self._direct(_Call(self._sync, method, args), post)
        return await self.coalesced(method, args, post)

    async def coalesced(
        self, method: str, args: tuple[Any, ...], post: Callable[[Any], Any] | None
    ) -> Any:
        """A batch verb (apply, settle, receive) with whatever else this loop's callers are
        calling: the sync handle's calls come here too, on the process's call loop."""
        if method == "receive":
            result = await self._coalescer().receive(args, args[1], NOTHING_RECEIVED)
        else:
            result = await self._coalescer().call(method, args)
        return post(result) if post else result

    async def one_call(
        self, method: str, args: tuple[Any, ...], post: Callable[[Any], Any] | None
    ) -> Any:
        """One verb, alone (not coalesced): the sync handle's calls come here."""
        return await self._direct(_Call(self._sync, method, args), post)

    async def _send_batch(self, batch: list[tuple[str, tuple[Any, ...]]]) -> list:
        return await self._direct(_Call(self._sync, "calls", (batch,), batch=True), None)

    async def _wait_take(
        self, queue: str, timeout: float, takes: list[tuple[Any, ...]]
    ) -> list[tuple[bool, Any]]:
        return await self._direct(_Call(self._sync, "wait_take", (queue, timeout, takes)), None)

    async def _give_back(self, taken: bytes | list[str]) -> None:
        """Return what the broker took for a receive whose caller left (a receive's answer, or
        its lock ids); not a rollback: it does not count toward the queue's poison limit."""
        ids = lock_ids(unpack_received(taken)) if isinstance(taken, bytes) else taken
        try:
            await self._direct(_Call(self._sync, "give_back", (ids,)), None)
        except InvalidArgument:  # a broker older than the verb: a rollback, as before it
            await self.rollback(ids)

    def _channel(self) -> Channel | None:
        """This loop's direct channel to the broker, if one is open (else one is being opened,
        and this call goes through Ray)."""
        if not (self._sync.direct and direct_allowed()):
            return None
        # this Ray start's token: a handle whose first call sends must not open its channel
        # with the one of a Ray since shut down
        token, actor = _current_token().ref, self._sync.actor
        return _channels.slot(actor, token, lambda: actor.open_channel.remote([token])).get()

    async def _direct(self, call: _Call, post: Callable[[Any], Any] | None) -> Any:
        """One call to the broker: over the direct channel when there is one, else (and when
        the channel breaks under it) through Ray. One order for the handle, sync and async."""
        try:
            while True:  # a retry keeps its number: it takes the same place in the order
                try:
                    channel = self._channel()
                    if channel is not None:
                        with contextlib.suppress(ChannelBroken):
                            answer = await self._sync.channel_result(call.send_on(channel))
                            return call.answer(answer, post)
                    return call.answer(await self._sync.result_async(call.submit()), post)
                except ray.exceptions.RayError as exc:
                    await asyncio.sleep(call.failed(exc))
        except asyncio.CancelledError:  # the caller left (a sync caller's KeyboardInterrupt)
            self._give_back_when_answered(call)
            raise
        finally:
            call.close()

    def _give_back_when_answered(self, call: _Call) -> None:
        """A lock-taking call whose caller left while the broker ran it (a receive, a batch or a
        shared wait carrying receives): what it takes is given back when its answer comes. Kept,
        those groups would stay locked by nobody until their lease ran out, and that rollback
        would count toward the queue's poison limit. Through Ray, the answer is awaited and the
        give back sent from Ray's side, not on the caller's event loop, which may end right
        after (`asyncio.run` returning cancels the calls still on the way)."""
        ref = call.ref
        if ref is None or call.method not in LOCK_TAKING:
            return
        if isinstance(ref, asyncio.Future):  # over the direct channel: on its loop
            ref.add_done_callback(
                lambda done: self._give_back_now(answered_locks(call.method, call.args, done))
            )
            return
        sync, method, args = self._sync, call.method, call.args

        def answered(done: concurrent.futures.Future) -> None:
            ids = answered_locks(method, args, done)
            if ids:  # (a thread: Ray's own, which ran this, must not wait on a call)
                threading.Thread(target=give_back, args=(sync, ids), daemon=True).start()

        ref.future().add_done_callback(answered)

    def _give_back_now(self, ids: list[str]) -> None:
        if ids:
            threading.Thread(target=give_back, args=(self._sync, ids), daemon=True).start()


LOCK_TAKING = frozenset({"receive", "get_conversation_group", "calls", "wait_take"})


def give_back(broker: Broker, ids: list[str]) -> None:
    """Return the groups `ids` to their queue through Ray, from any thread (not a rollback: it
    does not count toward poison); best effort: if it fails, their lease runs out instead."""
    call = _Call(broker, "give_back", (ids,))
    try:
        try:
            broker.result(call.submit())
        except ray.exceptions.RayTaskError as exc:
            if not isinstance(exc, InvalidArgument):
                raise
            broker.rollback(ids)  # a broker older than the verb: a rollback, as before it
    except Exception:  # the lease is the fallback
        log.debug("giving back %d lock(s) of a departed caller failed", len(ids), exc_info=True)
    finally:
        call.close()


def connect(name: str, namespace: str = DEFAULT_NAMESPACE, retry_s: float = 60.0) -> Broker:
    """A handle on a running broker, by name."""
    try:
        actor = ray.get_actor(name, namespace=namespace)
    except ValueError:
        raise BrokerUnavailable(
            f"no broker named {name!r} in namespace {namespace!r}; start it with start_broker"
        ) from None
    return Broker(actor, name, namespace, retry_s)
