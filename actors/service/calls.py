"""The entry points of a client's calls, which `BrokerService` inherits: `call` (one verb),
`dispatch` (a call that came over a direct channel), `calls` (a coalesced batch, see
actors.client.coalesce: apply / settle / receive calls started together, their changes in one group
commit, each answered on its own) and `wait_take`, which a client's waiting receives share.
Each starts in its client's order (actors.calls.ordering); one that may take locks runs once however
often it arrives (actors.service.replies)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from typing import TYPE_CHECKING, Any

from actors.calls.envelope import NOTHING_RECEIVED as NOTHING
from actors.calls.envelope import pack_received, placed, taken_locks, unpack_ops
from actors.calls.frames import DELIVER
from actors.calls.ordering import CallKey, Order, call_key
from actors.errors import BrokerError, InvalidArgument, shown
from actors.model import checks
from actors.service.replies import Replies, takes_locks

if TYPE_CHECKING:
    from actors.calls.ordering import Sequencer
    from actors.core import BrokerCore
    from actors.service.holders import LockHolders
    from actors.service.metrics import MetricsSink

log = logging.getLogger("raybroker")

# What a client handle may ask for through `call` (the Verbs' methods); anything else is refused.
CLIENT_VERBS = frozenset(
    {
        "define", "alter", "drop", "apply", "move_conversation", "receive", "settle",
        "get_conversation_group", "create_route", "alter_route", "drop_route", "configure",
        "retry_transmission", "record_event", "view", "info", "wait_take", "give_back",
    }
)  # fmt: skip

# What a batch may hold: the verbs that never wait there, with how many arguments each takes.
BATCH_ARITY = {"apply": 2, "settle": 5, "receive": 6}
BATCH_VERBS = frozenset(BATCH_ARITY)


def refusal(method: object, exc: Exception) -> BrokerError:
    """What a raw call's caller is told when its arguments broke the verb (a TypeError, a
    ValueError, ...): a typed error naming the verb. Logged too: it could be the broker's own
    fault, and then the log keeps its traceback."""
    if isinstance(exc, BrokerError):
        return exc
    log.info("a call of %s failed on its arguments", metric_label(method), exc_info=exc)
    return InvalidArgument(
        f"{shown(method)} could not be done with the arguments given ({type(exc).__name__}: "
        f"{shown(str(exc))}); send calls through a Broker handle"
    )


@functools.lru_cache(maxsize=256)
def _signature(cls: type, method: str) -> inspect.Signature:
    return inspect.signature(getattr(cls, method))


def check_arity(method: str, fn: Any, args: tuple[Any, ...]) -> None:
    """Refuse a call whose arguments do not fit the verb, before it runs."""
    signature = _signature(type(fn.__self__), method)
    try:
        signature.bind(None, *args)  # (the class's function: `self` first)
    except TypeError as exc:
        names = list(signature.parameters)[1:]
        takes = ", ".join(p for p in names if not p.startswith("_"))  # (_ray_trace_ctx: Ray's)
        raise InvalidArgument(
            f"{method} takes ({takes}), not {len(args)} argument(s): {exc}; send calls through "
            "a Broker handle"
        ) from None


def metric_label(method: object) -> str:
    """The `method` label a call is counted under: a client verb's name, else "other". Labels
    must be a bounded set; a caller's text would mint a new time series per name it sends."""
    return method if type(method) is str and method in CLIENT_VERBS else "other"


class BatchVerbs:
    """The entry points; the service supplies the rest (`verb`, `_start_*`, `_wait`, `core`,
    `deliver`)."""

    core: BrokerCore
    holders: LockHolders
    metrics: MetricsSink | None
    _order: Sequencer
    replies: Replies
    name: str

    async def deliver(self, blob: bytes) -> bytes:
        raise NotImplementedError

    async def call(self, order: Order, method: str, *args: Any) -> Any:
        """A client handle's call: `method(*args)`, started once the client's earlier calls have
        started (see actors.calls.ordering), so several in flight still apply in the order
        issued."""
        if type(method) is not str or method not in CLIENT_VERBS:
            raise InvalidArgument(
                f"{method!r} is not a broker verb; use one of {sorted(CLIENT_VERBS)}"
            )
        check_arity(method, getattr(self, method), args)
        await self._order.turn(order)
        self.replies.passed(order[0], order[2])
        try:
            args = placed(method, args, call_key(order, -1))
            if takes_locks(method, args):  # run once, however often it arrives
                return await self.replies.once(order, lambda: self.verb(method, *args))
            return await self.verb(method, *args)
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
            raise refusal(method, exc) from None

    async def dispatch(self, order: Order, method: str, args: tuple[Any, ...]) -> Any:
        """A call that came over a direct channel (actors.client.channel): a batch (`calls`), a
        verb, or another broker's delivery, as it would have come through Ray."""
        try:
            if method == "calls":
                return await self.calls(order, *args)
            if method == DELIVER:  # another broker's bundles (actors.remote.peers)
                if len(args) != 1 or not isinstance(args[0], bytes):
                    raise InvalidArgument("deliver takes one argument: the bundles' bytes")
                return await self.deliver(args[0])
            return await self.call(order, method, *args)
        except BrokerError:
            raise
        except Exception as exc:  # a fault in the broker (Ray would say RayTaskError): not
            # raised as itself, where a Ray error would read as the broker's death and be retried
            log.exception("broker %s: %s failed", self.name, method)
            raise RuntimeError(f"broker {self.name!r} failed in {method}: {exc!r}") from None

    async def calls(self, order: Order, batch: list[tuple[str, tuple[Any, ...]]]) -> list:
        """A client's coalesced calls (see actors.client.coalesce): each (method, args) of
        `BATCH_VERBS`, started in the order given, their changes group-committed; returns one
        (ok, result or error) per call, so each caller gets its own answer. A receive here
        does not wait: the client waits through `wait_take`."""
        if not isinstance(batch, (list, tuple)):
            raise InvalidArgument(f"a batch of calls must be a list, not {type(batch).__name__}")
        await self._order.turn(order)
        self.replies.passed(order[0], order[2])
        if takes_locks("calls", (batch,)):  # run once, however often it arrives
            return await self.replies.once(order, lambda: self._calls(order, batch))
        return await self._calls(order, batch)

    async def _calls(self, order: Order, batch: list[tuple[str, tuple[Any, ...]]]) -> list:
        started = time.perf_counter()
        # all in one group commit; a change with no request id of its own is recorded under
        # its place in the order, which a retry of the batch shares
        answers = [self._start_batched(e, call_key(order, i)) for i, e in enumerate(batch)]
        out: list[tuple[bool, Any]] = []
        for entry, answer in zip(batch, answers, strict=True):
            try:
                out.append((True, await answer))
            except Exception as exc:  # this caller's error; the batch's other calls go on
                method = entry[0] if isinstance(entry, (list, tuple)) and entry else entry
                out.append((False, refusal(method, exc)))
        if self.metrics is not None:  # one observation per verb the batch carried
            elapsed = time.perf_counter() - started
            verbs = {metric_label(e[0]) for e in batch if isinstance(e, (list, tuple)) and e}
            for method in verbs:
                self.metrics.observe_call(method, elapsed)
        return out

    def _start_batched(self, entry: Any, key: CallKey) -> asyncio.Future:
        try:
            if not (isinstance(entry, (list, tuple)) and len(entry) == 2):
                raise InvalidArgument(f"a batched call must be (method, args), not {entry!r}")
            method, args = entry
            if type(method) is not str or method not in BATCH_VERBS:
                raise InvalidArgument(
                    f"{method!r} cannot be batched; batch one of {sorted(BATCH_VERBS)}"
                )
            if not isinstance(args, (list, tuple)) or len(args) != BATCH_ARITY[method]:
                raise InvalidArgument(
                    f"the arguments of a batched {method} must be a list of "
                    f"{BATCH_ARITY[method]}, not {shown(args)}"
                )
            args = placed(method, args, key)
            if method == "apply":
                return self._start_apply(*args)
            if method == "settle":
                commit, rollback, ops, states, request_id = args
                return self._start_settle(commit, rollback, unpack_ops(ops), states, request_id)
            queue, _wait, options, owner, settle, reader = args
            return self._start_receive(queue, options, owner, settle, reader, packed=True)
        except Exception as exc:
            failed = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            return failed

    async def wait_take(
        self, queue: str, timeout: float, takes: list[tuple[Any, ...]]
    ) -> list[tuple[bool, Any]]:
        """Take for a client's waiting receives on `queue` as soon as there is something to
        take, waiting up to `timeout` seconds for it: `takes` are their arguments as `receive`
        takes them, each with what is left of its wait (one whose wait ran out takes nothing).
        Returns, per take, (True, what it received) or (False, its error). How a client's
        waiting receives wait without a call each, and get their messages in the round trip
        that brings the news (actors.client.coalesce)."""
        timeout = checks.seconds("timeout", timeout, zero=True)
        if type(queue) is not str:
            raise InvalidArgument(f"queue must be a queue's name, not {shown(queue)}")
        if not isinstance(takes, (list, tuple)):
            raise InvalidArgument(f"takes must be a list, not {type(takes).__name__}")
        started = time.monotonic()
        nothing = [(True, NOTHING)] * len(takes)
        first = True  # the first pass takes whatever there is, as a receive would (and refuses
        # what a receive would: a disabled queue, a retired reader), before any wait
        while True:
            if first or self.core.ready_groups(queue):
                first = False
                waited = time.monotonic() - started
                out = [self._take_waiting(queue, take, waited) for take in takes]
                if out != nothing:  # something taken, or an error to tell
                    return out
            left = started + timeout - time.monotonic()
            if left <= 0:
                return nothing
            await self._wait(queue, left)

    def _take_waiting(self, queue: str, take: Any, waited: float) -> tuple[bool, Any]:
        try:
            if not (isinstance(take, (list, tuple)) and len(take) == 6):
                raise InvalidArgument(f"a take must be a receive's arguments, not {take!r}")
            at, left, options, owner, _settle, reader = take
            if at != queue:
                raise InvalidArgument(f"a take on queue {at!r} sent to wait on queue {queue!r}")
            if checks.seconds("wait", left, zero=True) <= waited:
                return True, NOTHING  # its wait ran out before there was something to take
            holder = self.holders.adopt(owner)
            return True, pack_received(self._take(queue, options, holder, reader))
        except Exception as exc:  # this receive's error; the others take on
            return False, refusal("wait_take", exc)

    def undelivered(self, order: Any, method: str, args: Any, result: Any) -> int:
        """A call whose answer never reached its client (its direct channel ended: the client
        sends the call again) gives back the locks it made, or the retry's take would find
        those groups locked until their lease ran out (and that rollback would count toward
        poison). Not when another arrival of the same call has its answer (actors.service.replies:
        the client holds those locks now), nor when a receive in it read under a lock the client
        already held (`lock_id`): that read moved the client's lock on, which giving back
        cannot undo, so the answer stays kept for the call's retry. Returns how many locks
        were given back."""
        ids = taken_locks(method, args, result)
        if not ids:
            return 0
        if not self.replies.lost(order):
            return 0  # another arrival of the call has its answer: what it took is the client's
        return self.core.give_back(ids)
