"""Bad input riding along with `raybroker verify`'s workload: sends the broker must refuse with a
typed error, changing nothing, while the dialogs they name carry on. No Ray."""

from __future__ import annotations

import random
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from actors.calls.envelope import Send
from actors.errors import (
    BodyTooLarge,
    BrokerError,
    BrokerUnavailable,
    ContractViolation,
    ConversationNotFound,
    InvalidArgument,
    UnknownMessageType,
    ValidationFailed,
)

REQUEST, REPLY = "VReq", "VReply"
RATE = 0.015  # malformed calls per good message sent

# kind -> the error it must raise
EXPECTED: dict[str, type[BrokerError]] = {
    "wrong_type": InvalidArgument,  # a body, message type or handle of the wrong Python type
    "oversized": BodyTooLarge,
    "contract": ContractViolation,  # the initiator sending what only the target may
    "invalid_json": ValidationFailed,
    "unknown_type": UnknownMessageType,
    "bad_handle": ConversationNotFound,
    "mixed_batch": ContractViolation,  # good sends and one bad one: none of it may apply
}
_WRONG_BODIES: tuple[Any, ...] = ("text, not bytes", 42, {"id": 1}, None, 3.5)


class Malformed:
    """Makes and sends malformed calls on `broker` at RATE per good message, each kind drawn from
    `rng`; counts the refusals and keeps every call that was not refused as it must be."""

    def __init__(self, broker: Any, rng: random.Random, max_body: int, rate: float = RATE) -> None:
        self.broker, self.rng, self.max_body, self.rate = broker, rng, max_body, rate
        self.messages = self.made = 0  # good messages so far, malformed calls made for them
        self.refused: Counter[str] = Counter()
        self.wrong: list[dict[str, Any]] = []  # accepted, or refused with another error

    def due(self, messages: int) -> list[str]:
        """The malformed calls to make alongside `messages` good ones."""
        self.messages += messages
        n = int(self.messages * self.rate + 1e-9) - self.made  # the rate over the whole run
        self.made += n
        return [self.rng.choice(sorted(EXPECTED)) for _ in range(n)]

    def send(self, kind: str, handle: str, good: Sequence[Send], deadline: float) -> None:
        """One malformed call of `kind` on dialog `handle`; `good` is the batch about to be sent
        (a mixed batch carries it, and must not deliver any of it)."""
        call = self._call(kind, handle, good)
        while True:
            try:
                call()
            except BrokerUnavailable:  # the broker is restarting: ask again, the refusal stands
                if time.monotonic() > deadline:
                    self.wrong.append({"kind": kind, "outcome": "broker unavailable"})
                    return
                continue
            except BrokerError as exc:
                if isinstance(exc, EXPECTED[kind]):
                    self.refused[kind] += 1
                else:
                    self.wrong.append(
                        {"kind": kind, "outcome": f"{type(exc).__name__}: {exc}"[:300]}
                    )
                return
            self.wrong.append({"kind": kind, "outcome": "accepted"})
            return

    def _call(self, kind: str, handle: str, good: Sequence[Send]) -> Callable[[], Any]:
        b = self.broker
        if kind == "wrong_type":
            how = self.rng.randrange(3)
            if how == 0:
                return lambda: b.send(handle, REQUEST, self.rng.choice(_WRONG_BODIES))
            if how == 1:
                return lambda: b.send(handle, 7, b'{"id": "x"}')
            return lambda: b.send(12345, REQUEST, b'{"id": "x"}')
        if kind == "oversized":
            body = b'{"id": "big", "pad": "' + b"x" * self.max_body + b'"}'
            return lambda: b.send(handle, REQUEST, body)
        if kind == "contract":
            return lambda: b.send(handle, REPLY, b'{"id": "x"}')
        if kind == "invalid_json":
            return lambda: b.send(handle, REQUEST, b'{"id": not json')
        if kind == "unknown_type":
            return lambda: b.send(handle, "NoSuchType", b"{}")
        if kind == "bad_handle":
            return lambda: b.send(str(uuid.uuid4()), REQUEST, b'{"id": "x"}')
        return lambda: b.apply([*good, Send(handle, REPLY, b'{"id": "x"}')])

    def report(self) -> dict[str, Any]:
        return {
            "refused": sum(self.refused.values()),
            "refused_by_kind": dict(sorted(self.refused.items())),
            "malformed_not_refused": self.wrong[:20],
            "malformed_not_refused_count": len(self.wrong),
        }
