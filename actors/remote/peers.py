"""`RayPeers`: the one wrapper for broker-to-broker calls over Ray (the transport's `Peers`).
Every way a call can fail becomes `PeerUnreachable` with a reason in words about brokers."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import ray

from actors.errors import BrokerError, NotPrincipal, PeerUnreachable
from actors.mirroring.choice import Claim

log = logging.getLogger("raybroker")


class RayPeers:
    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.handles: dict[str, Any] = {}

    def handle(self, broker: str) -> Any:
        if broker not in self.handles:
            try:
                self.handles[broker] = ray.get_actor(broker, namespace=self.namespace)
            except ValueError:  # Ray's way of saying no actor has that name
                raise PeerUnreachable.not_running(broker) from None
        return self.handles[broker]

    async def deliver(self, broker: str, blob: bytes, timeout: float) -> bytes:
        try:
            return await asyncio.wait_for(self.handle(broker).deliver.remote(blob), timeout)
        except PeerUnreachable:
            raise
        except TimeoutError:
            err = PeerUnreachable.no_answer(broker, timeout)
        except ray.exceptions.RayActorError:
            err = PeerUnreachable.stopped(broker)
        except ray.exceptions.RayTaskError as exc:
            # the far broker raised: its own errors are worded for people; anything else is a
            # fault whose details belong in its log, not in a transmission status
            cause = getattr(exc, "cause", None)
            if isinstance(cause, NotPrincipal):  # a mirror partner: the courier follows
                self.handles.pop(broker, None)
                raise cause.with_traceback(None) from None
            err = PeerUnreachable.failed(
                broker, str(cause) if isinstance(cause, BrokerError) else ""
            )
        except Exception:  # any other failure of the call itself
            log.exception("the call to broker %r failed", broker)
            err = PeerUnreachable.failed(broker)
        self.handles.pop(broker, None)  # look it up again next time (it may have moved)
        raise err

    async def role(self, broker: str, timeout: float) -> Claim | None:
        """What a mirrored broker's partner claims to be (None: it cannot be asked now)."""
        try:
            handle = self.handle(broker)
            if not hasattr(handle, "role"):  # a broker that is not mirrored: its own principal
                return Claim(True, 0)
            said = await asyncio.wait_for(handle.role.remote(), timeout)
        except (PeerUnreachable, TimeoutError, ray.exceptions.RayError):
            self.handles.pop(broker, None)
            return None
        return Claim(said.get("role") == "principal", int(said.get("epoch", 0)))
