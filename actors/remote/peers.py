"""`RayPeers`: the one wrapper for broker-to-broker calls (the transport's `Peers`). Every way a
call can fail becomes `PeerUnreachable` with a reason in words about brokers.

A delivery goes over a direct channel to the far broker (actors.client.channel, as a client's
calls do) once one is open, else through Ray: a Ray actor call costs each side far more CPU than
the same call on a socket, and a broker delivers to each peer many times a second. A delivery
whose channel breaks goes again through Ray (the far broker takes each message once, whichever
way it came: actors.transport)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import ray

from actors.calls.frames import DELIVER
from actors.client.channel import ChannelBroken, ChannelSlot
from actors.errors import BrokerError, NotPrincipal, PeerUnreachable
from actors.mirroring.choice import Claim

log = logging.getLogger("raybroker")


class RayPeers:
    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.handles: dict[str, Any] = {}
        self.channels: dict[str, ChannelSlot] = {}  # per far broker, opened on first use

    def handle(self, broker: str) -> Any:
        if broker not in self.handles:
            try:
                self.handles[broker] = ray.get_actor(broker, namespace=self.namespace)
            except ValueError:  # Ray's way of saying no actor has that name
                raise PeerUnreachable.not_running(broker) from None
        return self.handles[broker]

    def _channel(self, broker: str) -> ChannelSlot:
        slot = self.channels.get(broker)
        if slot is None:

            async def opener() -> tuple[str, int, str] | None:
                return await self.handle(broker).open_channel.remote([None])

            slot = self.channels[broker] = ChannelSlot(opener, None)
        return slot

    def _forget(self, broker: str) -> None:
        """Look the broker up again next time (it may have moved, or be another partner now)."""
        self.handles.pop(broker, None)
        slot = self.channels.pop(broker, None)
        if slot is not None:
            slot.close()

    async def deliver(self, broker: str, blob: bytes, timeout: float) -> bytes:
        channel = self._channel(broker).get()
        if channel is not None:
            try:
                answer = channel.send(None, DELIVER, (blob,))
                return await asyncio.wait_for(asyncio.shield(answer), timeout)
            except ChannelBroken:
                pass  # through Ray
            except TimeoutError:
                self._forget(broker)
                raise PeerUnreachable.no_answer(broker, timeout) from None
            except NotPrincipal:  # a mirror partner: the courier follows
                self._forget(broker)
                raise
            except BrokerError as exc:
                self._forget(broker)
                raise PeerUnreachable.failed(broker, str(exc)) from None
            except Exception as exc:  # the far broker's fault, logged there
                self._forget(broker)
                raise PeerUnreachable.failed(broker, repr(exc)[:200]) from None
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
                self._forget(broker)
                raise cause.with_traceback(None) from None
            err = PeerUnreachable.failed(
                broker, str(cause) if isinstance(cause, BrokerError) else ""
            )
        except Exception:  # any other failure of the call itself
            log.exception("the call to broker %r failed", broker)
            err = PeerUnreachable.failed(broker)
        self._forget(broker)
        raise err

    async def role(self, broker: str, timeout: float) -> Claim | None:
        """What a mirrored broker's partner claims to be (None: it cannot be asked now)."""
        try:
            handle = self.handle(broker)
            if not hasattr(handle, "role"):  # a broker that is not mirrored: its own principal
                return Claim(True, 0)
            said = await asyncio.wait_for(handle.role.remote(), timeout)
        except (PeerUnreachable, TimeoutError, ray.exceptions.RayError):
            self._forget(broker)
            return None
        return Claim(said.get("role") == "principal", int(said.get("epoch", 0)))
