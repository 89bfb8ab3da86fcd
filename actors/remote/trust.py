"""Dialog and transport security set up between running brokers by their handles (seed 003): a
service's own certificate found, the far side's imported, the far service bound, SEND granted;
brokers' identities exchanged and CONNECT granted. What an operator does with `raybroker cert`
and a few creates, for a driver that starts brokers itself (a router set's replicas, a topology's
deploy). Idempotent: what exists already is left as it is."""

from __future__ import annotations

from typing import Any

from actors.errors import SecurityError
from actors.model.catalog import kind_of
from actors.model.credentials import BROKER, Certificate, Grant, RemoteServiceBinding
from actors.security import certificates


def own_certificate(broker: Any, service: str) -> tuple[str, str]:
    """(name, PEM) of the newest certificate `broker` holds with a private key for `service`."""
    mine = [
        r
        for kind, r in broker.definitions()
        if kind == "certificate" and r.get("owner") == service and r.get("has_private_key")
    ]
    if not mine:
        raise SecurityError(
            f"broker {broker.name!r} has no certificate of its own for service {service!r}; "
            f"create one (raybroker cert create {broker.name} NAME --owner {service})"
        )
    newest = max(mine, key=lambda r: certificates.read(r["certificate"]).not_before)
    return newest["name"], newest["certificate"]


def ensure(broker: Any, defn: Any) -> None:
    """Create `defn` on `broker` unless a definition of its kind and name is there."""
    kind = kind_of(defn)
    if not any(k == kind and r["name"] == defn.name for k, r in broker.definitions()):
        broker.create(defn)


def secure_dialogs(
    initiator: Any,
    from_service: str,
    target: Any,
    to_service: str,
    broker_instance: str | None = None,
) -> None:
    """Secured dialogs from `from_service` on `initiator` to `to_service` on `target`: the
    target's certificate imported and bound on the initiator (for dialogs bound to broker id
    `broker_instance` only, when given), the initiator's imported on the target and granted SEND
    on `to_service`. Both services need certificates of their own."""
    t_name, t_pem = own_certificate(target, to_service)
    i_name, i_pem = own_certificate(initiator, from_service)
    far_t, far_i = f"{target.name}.{t_name}", f"{initiator.name}.{i_name}"
    ensure(initiator, Certificate(far_t, t_pem))
    on = f".{broker_instance}" if broker_instance else ""
    ensure(initiator, RemoteServiceBinding(f"bind.{to_service}{on}", to_service, far_t,
                                           broker_instance=broker_instance))  # fmt: skip
    ensure(target, Certificate(far_i, i_pem))
    ensure(target, Grant(f"{far_i}.may-send.{to_service}", to_service, far_i))


def trust_brokers(a: Any, b: Any) -> None:
    """Transport security between brokers `a` and `b`, both ways: each holds the other's
    identity (a certificate owned by BROKER, which each needs of its own) and grants it
    CONNECT."""
    for one, other in ((a, b), (b, a)):
        name, pem = own_certificate(one, BROKER)
        far = f"{one.name}.{name}"
        ensure(other, Certificate(far, pem))
        ensure(other, Grant(f"{far}.may-connect", BROKER, far))
