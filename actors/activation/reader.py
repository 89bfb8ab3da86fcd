"""What one activated reader does: receive, run the handler on each group, settle the `Outcome`
with the next receive, until idle or retired.

Plain Python. Pool reader actors and the broker's internal reader tasks both run
`read_until_idle`; `run_handler` turns received groups into an `Outcome`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from actors.calls.envelope import Begin, End, Op, ReceivedGroup, Send, Timer
from actors.errors import (
    BrokerError,
    BrokerUnavailable,
    LockNotHeld,
    QueueDisabled,
    ReaderRetired,
    UnknownQueue,
)
from actors.model.catalog import Activation

log = logging.getLogger("raybroker")

Handler = Callable[[ReceivedGroup, "HandlerContext"], Any]


class HandlerContext:
    """What a handler may do while it holds one conversation group; all of it commits with the
    receive, or none of it if the handler raises."""

    def __init__(self, group: ReceivedGroup, options: Mapping[str, Any] | None = None) -> None:
        self.group = group
        self.options: Mapping[str, Any] = options or {}  # the activation's `options`
        self.ops: list[Op] = []
        self._state = group.state
        self.state_changed = False

    @property
    def state(self) -> bytes | None:
        """The group's state as committed last (or as set by this handler so far)."""
        return self._state

    def set_state(self, state: bytes | None) -> None:
        self._state = state
        self.state_changed = True

    def send(self, handles: str | Sequence[str], message_type: str, body: bytes = b"") -> None:
        self.ops.append(Send(handles, message_type, body))

    def send_many(self, handle: str, message_type: str, bodies: Sequence[bytes]) -> None:
        self.ops.append(Send(handle, message_type, bodies))

    def end(
        self, handle: str, *, error: int | None = None, description: str = "", cleanup: bool = False
    ) -> None:
        self.ops.append(End(handle, error, description, cleanup))

    def begin(
        self, from_service: str, to_service: str, contract: str = "DEFAULT", **options: Any
    ) -> str:
        """BEGIN DIALOG inside this commit; returns the new handle (usable at once)."""
        op = Begin(from_service, to_service, contract, **options)
        self.ops.append(op)
        return op.handle

    def timer(self, handle: str, timeout: float) -> None:
        """BEGIN CONVERSATION TIMER inside this commit: a DialogTimer after `timeout` seconds."""
        self.ops.append(Timer(handle, timeout))


@dataclass
class Outcome:
    """What a reader turn settles: groups to commit (with their ops and states) and to roll back."""

    commit: list[str] = field(default_factory=list)
    rollback: list[str] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    states: dict[str, bytes | None] = field(default_factory=dict)
    per_group: dict[str, tuple[list[Op], dict[str, bytes | None]]] = field(default_factory=dict)
    handled: int = 0  # messages handled successfully
    failed: int = 0  # groups whose handler raised

    def __bool__(self) -> bool:
        return bool(self.commit or self.rollback)

    def settle_args(self) -> dict[str, Any]:
        return {
            "commit": self.commit,
            "rollback": self.rollback,
            "ops": self.ops,
            "states": self.states,
        }

    def one_by_one(self) -> list[dict[str, Any]]:
        """The same outcome as separate settles, one per committed group (when the joint
        settle was refused, so that one group's bad output does not hold back the others)."""
        out = [
            {"commit": [lock], "rollback": [], "ops": ops, "states": states}
            for lock, (ops, states) in self.per_group.items()
        ]
        if self.rollback:
            out.append({"commit": [], "rollback": self.rollback, "ops": [], "states": {}})
        return out


def run_handler(
    handler: Handler, groups: Sequence[ReceivedGroup], options: Mapping[str, Any] | None = None
) -> Outcome:
    """Call the handler once per group. A group whose handler raises is rolled back."""
    out = Outcome()
    for g in groups:
        ctx = HandlerContext(g, options)
        try:
            handler(g, ctx)
        except Exception:
            log.exception("handler failed on conversation group %s; rolling it back", g.group_id)
            out.rollback.append(g.lock_id)
            out.failed += 1
            continue
        states = {g.group_id: ctx.state} if ctx.state_changed else {}
        out.commit.append(g.lock_id)
        out.ops += ctx.ops
        out.states.update(states)
        out.per_group[g.lock_id] = (ctx.ops, states)
        out.handled += len(g)
    return out


@dataclass
class ReaderStats:
    turns: int = 0
    handled: int = 0
    failed: int = 0
    reason: str = ""  # why the reader stopped


class ReaderPort(Protocol):
    """What a reader needs of its broker: the client (`Broker.aio`) for pool readers, or the broker
    itself for internal ones."""

    async def receive(self, queue: str, **options: Any) -> list[ReceivedGroup]: ...

    async def settle(self, **options: Any) -> Any: ...


async def read_until_idle(
    port: ReaderPort,
    queue: str,
    act: Activation,
    handler: Handler,
    clock: Callable[[], float],
    reader_id: str | None = None,
) -> ReaderStats:
    """A reader's life: receive → handler → commit (with the next receive), until nothing has
    come for `act.idle_timeout` seconds or the broker retires it."""
    stats = ReaderStats()
    pending = Outcome()
    idle_since = clock()
    while True:
        left = act.idle_timeout - (clock() - idle_since)
        if left <= 0:
            if pending:
                await _settle(port, pending)
            stats.reason = "idle"
            return stats
        try:
            groups = await port.receive(
                queue,
                max_groups=act.max_groups,
                wait=min(left, 1.0),
                lease=act.lease,
                reader=reader_id,
                **pending.settle_args(),
            )
        except BrokerError as exc:
            if getattr(exc, "during", None) == "settle":
                if not isinstance(exc, LockNotHeld):  # refused output: settle group by group
                    await _settle_one_by_one(port, pending)
                pending = Outcome()  # (LockNotHeld: the locks are gone; the groups come back)
                continue
            if isinstance(exc, (ReaderRetired, QueueDisabled, UnknownQueue, BrokerUnavailable)):
                stats.reason = type(exc).__name__
                return stats
            raise
        pending = Outcome()
        stats.turns += 1
        if not groups:
            continue
        pending = await asyncio.to_thread(run_handler, handler, groups, act.options)
        idle_since = clock()  # idle counts from the end of the work, however long it took
        stats.handled += pending.handled
        stats.failed += pending.failed


async def _settle(port: ReaderPort, outcome: Outcome) -> None:
    try:
        await port.settle(**outcome.settle_args())
    except LockNotHeld:
        return
    except BrokerError:
        await _settle_one_by_one(port, outcome)


async def _settle_one_by_one(port: ReaderPort, outcome: Outcome) -> None:
    for args in outcome.one_by_one():
        try:
            await port.settle(**args)
        except LockNotHeld:
            continue
        except BrokerError:
            log.exception("handler output for lock %s was refused; rolling back", args["commit"])
            with contextlib.suppress(LockNotHeld):  # already gone: nothing to roll back
                await port.settle(commit=[], rollback=args["commit"], ops=[], states={})
