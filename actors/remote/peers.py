"""`RayPeers`: the one wrapper for broker-to-broker calls over Ray (the transport's `Peers`).
Every way a call can fail becomes `PeerUnreachable` with a reason in words about brokers."""

from __future__ import annotations

import asyncio
from typing import Any

import ray

from ..errors import PeerUnreachable


class RayPeers:
    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.handles: dict[str, Any] = {}

    def handle(self, broker: str) -> Any:
        if broker not in self.handles:
            try:
                self.handles[broker] = ray.get_actor(broker, namespace=self.namespace)
            except ValueError:
                raise PeerUnreachable(
                    broker, f"no broker named {broker!r} is running in {self.namespace!r}"
                ) from None
        return self.handles[broker]

    async def deliver(self, broker: str, blob: bytes, timeout: float) -> bytes:
        try:
            return await asyncio.wait_for(self.handle(broker).deliver.remote(blob), timeout)
        except PeerUnreachable:
            raise
        except TimeoutError:
            reason = f"no answer within {timeout:g}s"
        except ray.exceptions.RayActorError:
            reason = "broker stopped or restarting"
        except ray.exceptions.RayTaskError as exc:
            reason = f"broker failed to take the batch: {getattr(exc, 'cause', exc)}"
        except Exception as exc:  # any other failure of the call itself
            reason = f"call failed: {exc}"
        self.handles.pop(broker, None)  # look it up again next time (it may have moved)
        raise PeerUnreachable(broker, reason)
