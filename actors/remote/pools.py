"""`RayReaderLauncher`: reader actors for activated queues with placement "pool". What to start
and when is `actors.activation.ReaderPools`'s; this only makes, runs and kills the actors."""

from __future__ import annotations

import dataclasses
from typing import Any

import ray

from actors.errors import ReaderLost
from actors.model.catalog import Activation
from actors.remote.reader import ReaderActor


@dataclasses.dataclass
class _ReaderActor:
    """A reader actor's handle, and its id (the owner its locks are held under) once it answers."""

    handle: Any
    actor_id: Any  # ObjectRef[str] of ReaderActor.actor_id, asked for when the actor is made


class RayReaderLauncher:
    def __init__(self, broker: str, namespace: str) -> None:
        self.broker, self.namespace = broker, namespace
        self._client: Any = None

    def new(self) -> _ReaderActor:
        if self._client is None:  # the readers' handle on this broker (made in the actor)
            from actors.remote.client import Broker

            self._client = Broker(
                ray.get_runtime_context().current_actor, self.broker, self.namespace
            )
        cls = ray.remote(ReaderActor).options(
            num_cpus=0, scheduling_strategy="SPREAD", max_restarts=0
        )
        handle = cls.remote(self._client)
        return _ReaderActor(handle, handle.actor_id.remote())

    async def run(
        self, reader: _ReaderActor, queue: str, reader_id: str, activation: Activation
    ) -> dict[str, Any]:
        try:
            return await reader.handle.run.remote(queue, reader_id, activation.__dict__)
        except ray.exceptions.RayActorError as exc:
            raise ReaderLost(reader_id, await self._actor_id(reader), str(exc)) from None

    @staticmethod
    async def _actor_id(reader: _ReaderActor) -> str | None:
        """The reader actor's id; None if it died before it could say (then it held no locks:
        Ray runs its calls in order, and this one was its first)."""
        try:
            return await reader.actor_id
        except ray.exceptions.RayError:
            return None

    def kill(self, reader: _ReaderActor) -> None:
        ray.kill(reader.handle)

    def handle(self, reader: _ReaderActor) -> Any:
        return reader.handle
