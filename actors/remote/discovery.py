"""Which brokers run in a Ray namespace, as handles (for `raybroker console`): plain brokers and
router replicas as `Broker`, a mirrored broker as one `MirroredBroker` that follows its
principal (its two partners are not listed on their own), with the witness's record of roles
and lag beside it."""

from __future__ import annotations

from typing import Any

import ray

from actors.errors import BrokerError
from actors.remote.client import DEFAULT_NAMESPACE, Broker, connect
from actors.remote.mirrored import MirroredBroker, mirror_status, roles_of
from actors.remote.witness import witness_name

WITNESS_SUFFIX = witness_name("")


def _is_broker(handle: Any) -> bool:
    """A broker actor (it takes calls and deliveries); a reader, a witness, Spark's master or
    a progress board is not."""
    return hasattr(handle, "call") and hasattr(handle, "deliver") and hasattr(handle, "view")


def brokers_in(
    namespace: str = DEFAULT_NAMESPACE, names: set[str] | None = None
) -> dict[str, Broker]:
    """Every broker running in `namespace` (only those named in `names`, when given), by name."""
    running = {
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a.get("namespace") == namespace
    }
    out: dict[str, Broker] = {}
    partners: set[str] = set()
    for witness in sorted(n for n in running if n.endswith(WITNESS_SUFFIX)):
        mirrored = witness[: -len(WITNESS_SUFFIX)]
        try:
            roles = roles_of(mirrored, namespace)
            partners |= {roles["principal"], roles["mirror"]}
            if names is None or mirrored in names:
                out[mirrored] = MirroredBroker(mirrored, namespace, retry_s=5.0)
        except (BrokerError, ValueError):  # its witness or principal is between two lives
            continue
    for name in sorted(running - partners):
        if name.endswith(WITNESS_SUFFIX) or (names is not None and name not in names):
            continue
        try:
            if _is_broker(ray.get_actor(name, namespace=namespace)):
                out[name] = connect(name, namespace, retry_s=5.0)
        except (ValueError, BrokerError):  # gone since it was listed
            continue
    return out


def mirrors_of(brokers: dict[str, Broker]) -> dict[str, dict[str, Any]]:
    """The witness's record (roles, synchronized, lag, failovers) of each mirrored broker."""
    out = {}
    for name, b in brokers.items():
        if isinstance(b, MirroredBroker):
            try:
                out[name] = mirror_status(name, b.namespace)
            except BrokerError as exc:
                out[name] = {"error": str(exc)}
    return out
