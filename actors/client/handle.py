"""The typed surface of a broker handle: `Broker` (a Ray actor, actors.remote.client) and
`LocalBroker` (in this process, actors.client.local) both have exactly these verbs, written once
in actors.client.verbs. Plain Python, no Ray."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from actors.calls.envelope import Op, ReceivedGroup
from actors.client.verbs import LockRef
from actors.model.catalog import Definition


class BrokerHandle(Protocol):
    """What a broker handle offers, typed: `Broker` (a Ray actor) and `LocalBroker` (in this
    process) both have exactly these verbs."""

    name: str

    def create(self, definition: Definition, *, request_id: str | None = None) -> None: ...
    def alter(
        self, kind: str | type, name: str, *, request_id: str | None = None, **changes: Any
    ) -> None: ...
    def drop(self, kind: str | type, name: str, *, request_id: str | None = None) -> None: ...
    def apply(self, ops: Sequence[Op], *, request_id: str | None = None) -> dict[str, Any]: ...
    def begin_dialog(
        self,
        from_service: str,
        to_service: str,
        contract: str = "DEFAULT",
        *,
        related_conversation: str | None = None,
        related_group: str | None = None,
        lifetime: float | None = None,
        to_broker: str | None = None,
        encryption: bool = True,
    ) -> str: ...
    def send(
        self, handles: str | Sequence[str], message_type: str, body: bytes = b""
    ) -> dict[str, Any]: ...
    def end_conversation(
        self, handle: str, *, error: int | None = None, description: str = "", cleanup: bool = False
    ) -> dict[str, Any]: ...
    def begin_conversation_timer(self, handle: str, timeout: float) -> dict[str, Any]: ...
    def move_conversation(self, handle: str, group_id: str) -> None: ...
    def receive(
        self,
        queue: str,
        *,
        wait: float = 0.0,
        max_groups: int = 1,
        top: int | None = None,
        group_id: str | None = None,
        handle: str | None = None,
        lock: LockRef | None = None,
        lease: float | None = None,
        commit: Iterable[LockRef] = (),
        rollback: Iterable[LockRef] = (),
        ops: Sequence[Op] = (),
        states: Mapping[str, bytes | None] | None = None,
        reader: str | None = None,
    ) -> list[ReceivedGroup]: ...
    def get_conversation_group(
        self, queue: str, *, wait: float = 0.0, lease: float | None = None
    ) -> tuple[str, str] | None: ...
    def settle(
        self,
        commit: Iterable[LockRef] = (),
        rollback: Iterable[LockRef] = (),
        *,
        ops: Sequence[Op] = (),
        states: Mapping[str, bytes | None] | None = None,
        request_id: str | None = None,
    ) -> dict[str, Any]: ...
    def commit(
        self,
        groups: Iterable[LockRef] | LockRef,
        *,
        ops: Sequence[Op] = (),
        states: Mapping[str, bytes | None] | None = None,
        request_id: str | None = None,
    ) -> dict[str, Any]: ...
    def rollback(
        self, groups: Iterable[LockRef] | LockRef, *, request_id: str | None = None
    ) -> dict[str, Any]: ...
    def create_route(
        self,
        name: str,
        service_name: str | None = None,
        broker_instance: str | None = None,
        address: str = "LOCAL",
        mirror_address: str | None = None,
        lifetime: float | None = None,
        draining: bool = False,
        *,
        table: str = "routes",
        request_id: str | None = None,
    ) -> list[str]: ...
    def alter_route(
        self, name: str, *, table: str = "routes", request_id: str | None = None, **changes: Any
    ) -> list[str]: ...
    def drop_route(
        self, name: str, *, table: str = "routes", request_id: str | None = None
    ) -> None: ...
    def routes(self, table: str = "routes") -> list[dict[str, Any]]: ...
    def configure(self, *, forwarding: bool | None = None) -> dict[str, Any]: ...
    def retry_transmission(self, conversation_handle: str | None = None) -> int: ...
    def record_event(self, kind: str, subject: str, detail: str = "") -> None: ...
    def info(self) -> dict[str, Any]: ...
    def definitions(self) -> list[tuple[str, dict[str, Any]]]: ...
    def endpoints(self, after: str | None = None, limit: int = 10_000) -> list[dict[str, Any]]: ...
    def rerunnable(self, after: str | None = None, limit: int = 10_000) -> list[dict[str, Any]]: ...
    def queue(self, name: str, limit: int = 1000) -> list[dict[str, Any]]: ...
    def queues(self) -> dict[str, dict[str, Any]]: ...
    def groups(
        self, queue: str | None = None, after: str | None = None, limit: int = 10_000
    ) -> list[dict[str, Any]]: ...
    def transmission_queue(self, limit: int = 1000) -> list[dict[str, Any]]: ...
    def events(
        self, after_id: int = 0, limit: int = 1000, newest: bool = False
    ) -> list[dict[str, Any]]: ...
    def audit(self, after_id: int = 0, limit: int = 1000) -> dict[str, Any]: ...
    def router(self, queue: str, service: str, limit: int = 100) -> dict[str, Any]: ...
    def stop(self, delete_store: bool = False) -> None: ...
