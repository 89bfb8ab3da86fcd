"""The catalog objects of dialog security (seed 003): certificates, remote service bindings and
grants of SEND on a service. Created, altered and dropped like the other definitions
(`actors.model.catalog`); their rules are here. Plain Python, no Ray."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from actors.errors import (
    InvalidArgument,
    InvalidDefinition,
    UnknownCertificate,
    UnknownService,
    shown,
)
from actors.model.names import check_name
from actors.model.routing import check_broker_id
from actors.security import certificates
from actors.security.sessions import ANONYMOUS

SEALED_KEY = "-----BEGIN ENCRYPTED PRIVATE KEY-----"
# Transport security: a certificate owned by BROKER is this broker's identity, which signs every
# call it makes to another broker; a Grant on BROKER is CONNECT: which brokers' identities may
# deliver to this one (names cannot start with "@", so no service takes it).
BROKER = "@broker"


@dataclass(frozen=True)
class Certificate:
    """A certificate this broker knows. With `certificate` (a PEM), someone else's public one:
    a far service's (named by a RemoteServiceBinding) or an initiator's (named by a Grant).
    Without it, one of this broker's own for local service `owner` (or, with owner BROKER,
    "@broker", the broker's own identity for transport security): the broker makes the key pair
    itself, valid for `days` from now, and keeps the private key sealed under its master key
    (`private_key`, set by the broker, never shown). Export the public part with
    `raybroker cert export` for the far side to import."""

    name: str
    certificate: str = ""
    owner: str | None = None
    subject: str = ""
    days: float = 365.0
    private_key: str = ""


@dataclass(frozen=True)
class RemoteServiceBinding:
    """The certificate that identifies far service `service`: dialogs to it are secured with a
    session key only its private key opens. `anonymous`: the initiator does not sign (the target
    grants SEND to "public"). `broker_instance`: for dialogs bound to that broker only (a service
    several brokers host, each with its own certificate: load balancing, router replicas); a
    binding without one serves the rest."""

    name: str
    service: str
    certificate: str
    anonymous: bool = False
    broker_instance: str | None = None

    def __post_init__(self) -> None:
        if self.broker_instance is not None:  # one form, as routes hold it; a bad one is refused
            with contextlib.suppress(InvalidArgument):
                object.__setattr__(self, "broker_instance", check_broker_id(self.broker_instance))


@dataclass(frozen=True)
class Grant:
    """SEND on local service `service` for the initiators that sign with `certificate` (or
    anyone, "public", for anonymous bindings): who may begin secured dialogs to it. On BROKER
    ("@broker"), CONNECT: the broker whose identity `certificate` is may deliver to this one
    (transport security, the broker's limit `transport_security`)."""

    name: str
    service: str
    certificate: str


Credential = Certificate | RemoteServiceBinding | Grant
KINDS: dict[str, type] = {
    "certificate": Certificate,
    "remote_service_binding": RemoteServiceBinding,
    "grant": Grant,
}


def check_credential(defn: Credential, catalog: Any) -> None:
    """Raise if a credential is malformed or names what `catalog` does not hold."""
    if isinstance(defn, Certificate):
        _check_certificate(defn, catalog)
    elif isinstance(defn, RemoteServiceBinding):
        check_name("service", defn.service)
        if defn.broker_instance is not None:
            try:
                check_broker_id(defn.broker_instance)
            except InvalidArgument as exc:
                raise InvalidDefinition(f"binding {defn.name!r}: {exc}") from None
        _known_certificate(catalog, defn.certificate, f"binding {defn.name!r}")
        if not isinstance(defn.anonymous, bool):
            raise InvalidDefinition(f"binding {defn.name!r}: anonymous must be True or False")
        for other in catalog.remote_service_bindings.values():
            if (other.service, other.broker_instance) == (defn.service, defn.broker_instance) and (
                other.name != defn.name
            ):
                on = f" on broker {defn.broker_instance}" if defn.broker_instance else ""
                raise InvalidDefinition(
                    f"service {defn.service!r}{on} is already bound by {other.name!r}; alter "
                    "that binding (to a new certificate, say) or drop it first"
                )
    elif isinstance(defn, Grant):
        if defn.service == BROKER:
            if defn.certificate == ANONYMOUS:
                raise InvalidDefinition(
                    f"grant {defn.name!r}: CONNECT goes to a broker's certificate, not to anyone"
                )
            _known_certificate(catalog, defn.certificate, f"grant {defn.name!r}")
            return
        if not isinstance(defn.service, str) or defn.service not in catalog.services:
            raise UnknownService(_named(defn.service), f"grant {defn.name!r} names it")
        if defn.certificate != ANONYMOUS:
            _known_certificate(catalog, defn.certificate, f"grant {defn.name!r}")


def _check_certificate(defn: Certificate, catalog: Any) -> None:
    what = f"certificate {defn.name!r}"
    if defn.owner not in (None, BROKER) and (
        not isinstance(defn.owner, str) or defn.owner not in catalog.services
    ):
        raise UnknownService(_named(defn.owner), f"{what} names it as its owner")
    if not isinstance(defn.private_key, str) or not isinstance(defn.subject, str):
        raise InvalidDefinition(f"{what}: subject and private_key are strings")
    if not defn.certificate:
        if defn.owner is None:
            raise InvalidDefinition(
                f"{what}: give the PEM of someone else's certificate, or an owner (a service "
                "here) to make one of this broker's own"
            )
        return  # made by the broker (actors.core.admin), then checked again whole
    certificates.read(defn.certificate, what)
    if defn.private_key and not defn.private_key.startswith(SEALED_KEY):
        raise InvalidDefinition(
            f"{what}: a private key is never given in the clear; leave `certificate` empty and "
            "the broker makes the key pair, sealed under its master key"
        )
    if defn.private_key and defn.owner is None:
        raise InvalidDefinition(f"{what}: a certificate with a private key has an owner")


def _known_certificate(catalog: Any, name: Any, who: str) -> None:
    if not isinstance(name, str) or name not in catalog.certificates:
        raise UnknownCertificate(_named(name), f"{who} names it")


def _named(value: Any) -> str:
    return value if isinstance(value, str) else shown(value)


def credential_users(kind: str, name: str, catalog: Any) -> list[str]:
    """What refers to a definition (so it may not be dropped): a certificate's bindings and
    grants; a service's certificates and grants."""
    if kind == "certificate":
        return [
            d.name
            for d in [*catalog.remote_service_bindings.values(), *catalog.grants.values()]
            if d.certificate == name
        ]
    if kind == "service":
        return [c.name for c in catalog.certificates.values() if c.owner == name] + [
            g.name for g in catalog.grants.values() if g.service == name
        ]
    return []


def shown_record(kind: str, record: Mapping[str, Any]) -> dict[str, Any]:
    """A definition's record as views show it: a certificate's sealed private key is not shown,
    only whether it has one."""
    if kind != "certificate":
        return dict(record)
    out = {k: v for k, v in record.items() if k != "private_key"}
    out["has_private_key"] = bool(record.get("private_key"))
    return out
