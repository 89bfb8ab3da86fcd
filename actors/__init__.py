"""raybroker: SQL Server Service Broker's dialogs, queues and conversation-group locking on Ray.

The public surface is what `__all__` names; everything else is internal. The Ray-side names
(`Broker`, `connect`, `start_broker`, `stop_broker`, `ensure_ray`) load on first use, so the plain
modules (catalog, envelope, core, ...) and `LocalBroker` import without Ray.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

# first: which of the modules below load compiled is decided as they load (actors.compiled)
from actors import compiled  # noqa: F401
from actors.activation import HandlerContext
from actors.calls.envelope import Begin, End, Message, ReceivedGroup, Send, Timer
from actors.client.handle import BrokerHandle
from actors.client.local import LocalBroker
from actors.errors import (
    AlreadyExists,
    BrokerError,
    BrokerUnavailable,
    CatalogError,
    ContractViolation,
    ConversationEnded,
    ConversationNotFound,
    GroupLocked,
    IngestError,
    InvalidArgument,
    LockNotHeld,
    MessageError,
    MirroringError,
    NoFailover,
    NotFound,
    NotPrincipal,
    QueueDisabled,
    SecurityError,
    StoreError,
    StoreInUse,
    ValidationFailed,
)
from actors.model.catalog import Activation, Contract, MessageType, Queue, Service
from actors.model.credentials import Certificate, Grant, RemoteServiceBinding
from actors.model.limits import Limits

if TYPE_CHECKING:
    from actors.remote.client import Broker, connect, stop_broker
    from actors.remote.factory import start_broker
    from actors.remote.mirrored import (
        MirroredBroker,
        Partner,
        failover,
        mirror_status,
        start_mirrored_broker,
        stop_mirrored_broker,
    )
    from actors.remote.runtime import ensure_ray

# Public name -> "module:attribute", imported on first access (PEP 562).
_LAZY: dict[str, str] = {
    "Broker": "actors.remote.client:Broker",
    "connect": "actors.remote.client:connect",
    "start_broker": "actors.remote.factory:start_broker",
    "stop_broker": "actors.remote.client:stop_broker",
    "ensure_ray": "actors.remote.runtime:ensure_ray",
    "MirroredBroker": "actors.remote.mirrored:MirroredBroker",
    "Partner": "actors.remote.mirrored:Partner",
    "failover": "actors.remote.mirrored:failover",
    "mirror_status": "actors.remote.mirrored:mirror_status",
    "start_mirrored_broker": "actors.remote.mirrored:start_mirrored_broker",
    "stop_mirrored_broker": "actors.remote.mirrored:stop_mirrored_broker",
}


def __getattr__(name: str) -> Any:
    """Load a Ray-side public name on first use and cache it in the module."""
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = target.split(":")
    value = getattr(import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "Activation",
    "AlreadyExists",
    "Begin",
    "Broker",
    "BrokerError",
    "BrokerHandle",
    "BrokerUnavailable",
    "CatalogError",
    "Certificate",
    "Contract",
    "ContractViolation",
    "ConversationEnded",
    "ConversationNotFound",
    "End",
    "Grant",
    "GroupLocked",
    "HandlerContext",
    "IngestError",
    "InvalidArgument",
    "Limits",
    "LocalBroker",
    "LockNotHeld",
    "Message",
    "MessageError",
    "MessageType",
    "MirroredBroker",
    "MirroringError",
    "NoFailover",
    "NotFound",
    "NotPrincipal",
    "Partner",
    "Queue",
    "QueueDisabled",
    "StoreError",
    "StoreInUse",
    "ReceivedGroup",
    "RemoteServiceBinding",
    "SecurityError",
    "Send",
    "Service",
    "Timer",
    "ValidationFailed",
    "connect",
    "ensure_ray",
    "failover",
    "mirror_status",
    "start_broker",
    "start_mirrored_broker",
    "stop_broker",
    "stop_mirrored_broker",
]
