"""`BrokerActor`: the Ray shell around `actors.service.broker.BrokerService`.

What it adds is only what needs Ray: calls to other brokers (`RayPeers`), reader actors for
activated queues (`RayReaderLauncher`), asking whether a lock holder's actor still lives, and
looking up brokers by name. Every verb and every rule is the service's and the core's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import warnings
from typing import Any

import ray

from actors import collector
from actors.calls.frames import ChannelRefused
from actors.errors import BrokerError, InvalidArgument
from actors.model.limits import Limits
from actors.remote.client import direct_allowed
from actors.remote.metrics import RayMetrics
from actors.remote.peers import RayPeers
from actors.remote.pools import RayReaderLauncher
from actors.service.broker import BrokerService
from actors.service.channel import (
    PORTS_ENV,
    ChannelServer,
    Dispatch,
    Undelivered,
    channel_ports,
)

log = logging.getLogger("raybroker")


def node_channels(
    dispatch: Dispatch, undelivered: Undelivered, max_call_bytes: int
) -> ChannelServer:
    """A direct channels' listener on this node's address, on a port `RAYBROKER_CHANNEL_PORTS`
    allows (`InvalidArgument` if that setting is not a port or a range of them)."""
    return ChannelServer(
        dispatch,
        ray.util.get_node_ip_address(),
        undelivered,
        max_call_bytes,
        channel_ports(os.environ.get(PORTS_ENV)),
    )


class BrokerActor(BrokerService):
    """One broker. Created through `actors.remote.factory.start_broker`, which applies
    `ray.remote` with restart options; the class itself stays plain Python."""

    def __init__(
        self, name: str, path: str, durability: str, limits: dict[str, Any], namespace: str
    ) -> None:
        _untraced(type(self))
        self.namespace = namespace  # where this broker and its peers are registered
        self.start_error: BrokerError | None = None
        try:
            super().__init__(
                name,
                path,
                durability,
                limits,
                peers=RayPeers(namespace),
                launcher=RayReaderLauncher(name, namespace),
                metrics=RayMetrics(name),
            )
        except BrokerError as exc:
            if _restarted():
                raise  # a restart that cannot open its store ends here; clients are told
            # A first start keeps its error for `info` (start_broker's first call), which
            # raises it as itself; Ray would pass on a constructor's error only as text.
            # start_broker then kills this actor, so its name is free again.
            self.start_error = exc
        # What the process holds once started (Ray, the modules, the loaded store) is never
        # garbage: out of the collector's full passes, which otherwise stall every caller for
        # tens of milliseconds, several times a second under load (measured: gen-2 passes of
        # 55 ms over 138k objects, 6-14 ms once frozen). This process is the broker's alone.
        # A busy broker's calls make and drop thousands of short-lived objects per batch: at
        # Python's default (a young pass per 700 new objects) the collector took 7% of its CPU
        # (measured in one process, frozen as here, 100 one-message clients: 0.36 s of 5.2;
        # 5% fewer instructions per message at 10,000). See actors.collector.
        collector.own_process()
        self._channels: ChannelServer | None = None  # listening once a client asks
        self._channels_off = False  # the node's channel setting cannot be honoured

    async def info(self) -> dict[str, Any]:
        if self.start_error is not None:
            raise self.start_error
        return await super().info() | {
            "node": ray.get_runtime_context().get_node_id(),
            "channels": self._channel_counts(),
            # "uvloop" (Ray's choice when it is installed) or "asyncio"
            "event_loop": type(asyncio.get_running_loop()).__module__.partition(".")[0],
        }

    async def open_channel(self, holder: list) -> tuple[str, int, str] | None:
        """(host, port, ticket) of a direct channel for a client (actors.client.channel); `holder`:
        its lock holder's token, in a list so Ray passes it unresolved. None when channels are
        turned off here (`RAYBROKER_DIRECT=0`, or Ray's TLS): the client stops asking."""
        if not direct_allowed() or self._channels_off:
            return None
        try:
            if self._channels is None:
                max_call_bytes = Limits.of(self.limits).max_call_bytes
                self._channels = node_channels(self.dispatch, self.undelivered, max_call_bytes)
            return await self._channels.ticket(holder[0])
        except (InvalidArgument, ChannelRefused) as exc:  # the node's setting: calls use Ray
            log.error("raybroker: broker %s opens no direct channels: %s", self.name, exc)
            self._channels_off = True
            return None

    def _channel_counts(self) -> dict[str, int]:
        """Direct channels open now, the calls they have carried, and the connections closed at
        once for want of room (too many without a ticket)."""
        c = self._channels
        if c is None:
            return {"open": 0, "calls": 0, "refused": 0}
        return {"open": c.connections, "calls": c.calls, "refused": c.refused}

    async def holder_alive(self, handle: Any) -> bool | None:
        """`handle`: the holder's token (see `client.lock_holder`); Ray loses it when its
        owner dies."""
        try:
            await asyncio.wait_for(handle[0], 5.0)
        except TimeoutError:
            return None  # cannot tell now; its lease still bounds it
        except ray.exceptions.OwnerDiedError:
            return False
        except ray.exceptions.RayError:
            return None
        return True

    def broker_exists(self, name: str) -> bool:
        try:
            ray.get_actor(name, namespace=self.namespace)
        except ValueError:
            return False
        return True


def _untraced(cls: type) -> None:
    """Ray wraps every method of an actor's class for tracing, a Python frame and a check of a
    flag per call, and the broker calls its own methods about seven times a message (measured:
    142,000 wrapped calls for 20,000 messages of many small clients). Ray runs calls into the
    actor through executors it made from the wrapped methods when it loaded the class, so the
    class can hand the broker's calls on itself the plain methods: tracing, when on, still sees
    every call that arrives."""
    for name, attr in list(vars(cls).items()):
        if getattr(attr, "__ray_tracing_wrapped__", False):
            setattr(cls, name, attr.__wrapped__)


def _restarted() -> bool:
    """Whether Ray restarted this actor (its process died), rather than starting it anew."""
    with warnings.catch_warnings():  # the call reads a deprecated property inside Ray
        warnings.simplefilter("ignore")
        return bool(ray.get_runtime_context().was_current_actor_reconstructed)
