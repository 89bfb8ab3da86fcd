"""The broker's keys: the master key (read once, when first needed), the certificates this broker
makes for its own services (their private keys sealed under the master key before the store sees
them), and the session key of every secured dialog with an endpoint here. Which certificate a
dialog uses, and whether its messages travel sealed, wait or go in the clear, is decided here
(seed 003). Plain Python, no Ray."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from actors.errors import SecurityError
from actors.model.catalog import Catalog
from actors.model.credentials import BROKER, Certificate, RemoteServiceBinding
from actors.model.dialogs import Endpoint
from actors.model.limits import Limits
from actors.security import certificates
from actors.security.certificates import CertInfo
from actors.security.sessions import (
    CALL_KEY_LIFETIME_S,
    EXCHANGE_LIFETIME_S,
    Accepted,
    CallKey,
    Exchange,
    Session,
    Signer,
    accept,
    call_bundles,
    call_key,
    exchange,
    new_session_key,
    offer,
    open_call,
    sign_call,
    unwrap_key,
    wrap_key,
)

MAX_OPENED = 10_000  # key-exchange keys, and callers' call keys, a broker keeps checked
_MISSING = object()


class Keyring:
    def __init__(self, limits: Limits, catalog: Catalog) -> None:
        self.limits = limits
        self.catalog = catalog
        self._master: bytes | None = None
        self.sessions: dict[int, tuple[Session, bytes]] = {}  # endpoint no -> (session, key)
        self._infos: dict[str, CertInfo] = {}  # PEM -> what it says
        self._keys: dict[str, rsa.RSAPrivateKey] = {}  # fingerprint -> opened private key
        # key-exchange keys (actors.security.sessions.Exchange): those this broker offers, by
        # (service, far service, target and signer fingerprints); those it opened, by head
        self._exchanges: dict[tuple[str, str, str, str | None], Exchange] = {}
        self._opened: dict[tuple[str, str, bytes], bytes] = {}
        # call keys (transport security): this broker's own, and its callers' it checked
        self._call_keys: dict[tuple[str, str], CallKey] = {}
        self._callers: dict[tuple[str, bytes], Ed25519PublicKey] = {}
        # what a dialog's security reads of the catalog (certificates by service and
        # fingerprint, grants, bindings), worked out once per change of the catalog, not once
        # per dialog or call
        self._derived: dict[tuple, Any] = {}
        self._derived_at = -1  # the catalog's generation they were worked out at

    def _memo(self, key: tuple, make: Callable[[], Any]) -> Any:
        if self._derived_at != self.catalog.generation:
            self._derived.clear()
            self._derived_at = self.catalog.generation
        found = self._derived.get(key, _MISSING)
        if found is _MISSING:
            found = self._derived[key] = make()  # nothing kept if it raises
        return found

    def master(self) -> bytes:
        """The master key; SecurityError saying how to give one if the broker has none."""
        if self._master is None:
            self._master = certificates.master_key(self.limits.master_key_file)
        if self._master is None:
            raise SecurityError(
                "this broker has no master key to seal private keys under: start it with "
                f"limits master_key_file=PATH, or with ${certificates.MASTER_KEY_FILE} in its "
                "environment (a file of at least 16 random bytes: head -c 32 /dev/urandom | "
                "base64 > master.key)"
            )
        return self._master

    def make(self, defn: Certificate, now: float) -> Certificate:
        """`defn` (a certificate of this broker's own, without a PEM) made: a new key pair and
        self-signed certificate, the private key sealed."""
        master = self.master()  # before the key is made: without one nothing is
        pem, key = certificates.make(defn.subject or str(defn.owner), defn.days, now)
        subject = certificates.read(pem).subject
        return replace(defn, certificate=pem, subject=subject,
                       private_key=certificates.seal_key(key, master))  # fmt: skip

    # --- certificates ------------------------------------------------------------------------

    def info(self, cert: Certificate) -> CertInfo:
        found = self._infos.get(cert.certificate)
        if found is None:
            found = self._infos[cert.certificate] = certificates.read(cert.certificate)
        return found

    def known(self) -> dict[str, tuple[str, CertInfo]]:
        """Every certificate this broker holds: fingerprint -> (name, info). Not to be changed."""
        return self._memo(("known",), lambda: {
            self.info(c).fingerprint: (c.name, self.info(c))
            for c in self.catalog.certificates.values()
        })  # fmt: skip

    def _owned(self, service: str) -> list[Certificate]:
        """`service`'s certificates with a private key here, in the catalog's order."""
        return self._memo(("owned", service), lambda: [
            c for c in self.catalog.certificates.values() if c.owner == service and c.private_key
        ])  # fmt: skip

    def _granted(self, service: str) -> frozenset[str]:
        """The certificates (or ANONYMOUS) granted on `service`."""
        return self._memo(("granted", service), lambda: frozenset(
            g.certificate for g in self.catalog.grants.values() if g.service == service
        ))  # fmt: skip

    def _private(self, cert: Certificate) -> rsa.RSAPrivateKey:
        fp = self.info(cert).fingerprint
        key = self._keys.get(fp)
        if key is None:
            key = self._keys[fp] = certificates.open_key(cert.private_key, self.master(), cert.name)
        return key

    def own_keys(self, service: str) -> dict[str, rsa.RSAPrivateKey]:
        """The private keys of `service`'s certificates, old and new (a dialog secured before a
        rotation still opens), by fingerprint."""
        return self._memo(("own keys", service), lambda: {
            self.info(c).fingerprint: self._private(c) for c in self._owned(service)
        })  # fmt: skip

    def _signing(self, service: str, now: float) -> Certificate | str:
        """The newest valid certificate of `service` with a private key, or why there is none."""
        mine = self._owned(service)
        valid = [c for c in mine if certificates.invalid_at(self.info(c), now) is None]
        if not valid:
            why = (
                certificates.invalid_at(self.info(mine[-1]), now)
                if mine
                else "it has no certificate with a private key"
            )
            return (
                f"service {service!r} cannot sign the dialog's key offer: {why}; create a "
                f"certificate with owner {service!r} (raybroker cert create)"
            )
        return max(valid, key=lambda c: self.info(c).not_before)

    def signer(self, service: str, now: float) -> Signer | str:
        """The newest valid certificate of `service` with its private key, or why there is none."""
        found = self._signing(service, now)
        if isinstance(found, str):
            return found
        return Signer(self.info(found).fingerprint, self._private(found))

    def binding(self, ep: Endpoint) -> RemoteServiceBinding | None:
        return self.binding_for(ep.far_service, ep.far_broker)

    def binding_for(self, service: str, broker: str | None) -> RemoteServiceBinding | None:
        """The binding of `service`: the one for `broker` if there is one, else the one for any
        broker."""
        return self._memo(("binding", service, broker), lambda: self._find_binding(service, broker))

    def _find_binding(self, service: str, broker: str | None) -> RemoteServiceBinding | None:
        found = None
        for b in self.catalog.remote_service_bindings.values():
            if b.service == service:
                if b.broker_instance is not None and b.broker_instance == broker:
                    return b
                if b.broker_instance is None:
                    found = b
        return found

    def refusal(
        self, from_service: str, to_service: str, broker: str | None, now: float
    ) -> str | None:
        """Why a new dialog with encryption on from `from_service` to `to_service` (on `broker`)
        cannot be secured however long it waits: the bound certificate is expired or not yet
        valid, or the initiator has none valid to sign with. None: it can be (or waits for a
        binding, saying so in its status)."""
        if not self.catalog.remote_service_bindings:  # the common case, and a Begin's hot path
            return None
        binding = self.binding_for(to_service, broker)
        return None if binding is None else self._unsecurable(binding, from_service, now)

    def _unsecurable(
        self, binding: RemoteServiceBinding, from_service: str, now: float
    ) -> str | None:
        """Why dialogs from `from_service` under `binding` cannot be secured now, or None."""
        target = self.info(self.catalog.certificates[binding.certificate])
        if why := certificates.invalid_at(target, now):
            return (
                f"service {binding.service!r}'s {why} (binding {binding.name!r}); import its new "
                "certificate and alter the binding to it"
            )
        if not binding.anonymous:
            found = self._signing(from_service, now)
            if isinstance(found, str):
                return found
        return None

    # --- dialogs -----------------------------------------------------------------------------

    def outbound(self, ep: Endpoint, now: float) -> tuple[Session, bool] | str | None:
        """How messages leave this broker on `ep`: (session, fresh) to seal them with (fresh: a
        new session, whose key must be stored before they go), None in the clear, or why they
        wait. A dialog with a session keeps it, whatever the bindings became; an initiator's
        dialog gets one when its far service is bound; the target's side follows the initiator."""
        known = self.sessions.get(ep.no)
        if known is not None:
            return known[0], False
        if not ep.is_initiator:
            return None
        binding = self.binding(ep)
        if binding is None:
            if not ep.encryption:
                return None
            return (
                f"dialog security is unavailable: no remote service binding for service "
                f"{ep.far_service!r} and the dialog was begun with encryption on; create a "
                "RemoteServiceBinding for it, or begin dialogs with encryption=False"
            )
        try:
            self.master()
        except SecurityError as exc:
            return str(exc)
        key = new_session_key()
        session = Session(key, ep.conversation_id)
        self.sessions[ep.no] = (session, key)
        return session, True

    def offer(self, ep: Endpoint, now: float) -> bytes | str:
        """The key offer of an initiator's secured dialog (it rides with message 0), or why it
        cannot be made now."""
        _, key = self.sessions[ep.no]
        binding = self.binding(ep)
        if binding is None:
            return (
                f"the key offer of conversation {ep.conversation_id} needs the remote service "
                f"binding of service {ep.far_service!r}, which was dropped; create it again"
            )
        if why := self._unsecurable(binding, ep.service, now):
            return why
        target = self.info(self.catalog.certificates[binding.certificate])
        signer = None
        if not binding.anonymous:
            found = self.signer(ep.service, now)
            assert not isinstance(found, str)  # _unsecurable found one valid
            signer = found
        pair = (ep.service, ep.far_service, target.fingerprint, signer and signer.fingerprint)
        ex = self._exchanges.get(pair)
        if ex is None or not 0 <= now - ex.made_at < EXCHANGE_LIFETIME_S:
            ex = self._exchanges[pair] = exchange(ep.service, ep.far_service, target, signer, now)
        return offer(key, ep.conversation_id, ep.service, ep.far_service, ex)

    def accept(
        self, blob: bytes, conversation_id: str, from_service: str, to_service: str, now: float
    ) -> Accepted:
        """Open a dialog's key offer for local service `to_service` (SecurityError: refused)."""
        if len(self._opened) >= MAX_OPENED:  # many initiators, or many rotations: start over
            self._opened.clear()
        return accept(blob, conversation_id, from_service, to_service,
                      self.own_keys(to_service), self.known(),
                      self._granted(to_service).__contains__, now, self._opened)  # fmt: skip

    # --- transport security ----------------------------------------------------------------

    def sign_call(self, blob: bytes, sender: str, to: str, now: float) -> bytes:
        """A call to broker `to`, signed by this broker's identity if it has a valid one."""
        if not self._owned(BROKER):
            return blob
        found = self.signer(BROKER, now)
        if isinstance(found, str):
            return blob
        ck = self._call_keys.get((sender, found.fingerprint))
        if ck is None or not 0 <= now - ck.made_at < CALL_KEY_LIFETIME_S:
            ck = self._call_keys[(sender, found.fingerprint)] = call_key(sender, found, now)
        return sign_call(blob, sender, to, ck)

    def open_call(self, blob: bytes, me: str, now: float) -> bytes:
        """The bundles of a call that reached broker `me`; SecurityError if this broker does
        not accept it (with `transport_security` on, only calls signed by brokers granted
        CONNECT)."""
        if not self.limits.transport_security:
            return call_bundles(blob)
        if len(self._callers) >= MAX_OPENED:
            self._callers.clear()
        may_connect = self._granted(BROKER).__contains__
        opened = open_call(blob, me, self.known(), may_connect, now, self._callers)
        if opened is not None:
            return opened[1]
        raise SecurityError(
            f"broker {me!r} takes calls only from brokers it trusts (transport_security): "
            "this call is not signed; give the sender an identity certificate (owner "
            f"{BROKER!r}) and grant it CONNECT here"
        )

    def wrapped(self, ep_no: int) -> bytes:
        """The session key of endpoint `ep_no`, sealed for the store."""
        return wrap_key(self.sessions[ep_no][1], self.master(), ep_no)

    def load(self, rows: list[tuple[int, bytes]], conversations: dict[int, str]) -> None:
        """Session keys as the store keeps them (endpoint no, sealed key)."""
        for no, blob in rows:
            if no in conversations:
                key = unwrap_key(blob, self.master(), no)
                self.sessions[no] = (Session(key, conversations[no]), key)
