"""Certificates and keys: X.509 certificates with RSA keys, made, read and checked here, and
private keys sealed under the operator's master key. Every primitive is the `cryptography`
package's; nothing here is cryptography of our own. Plain Python, no Ray."""

from __future__ import annotations

import datetime
import hashlib
import os
from typing import NamedTuple

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from actors.errors import InvalidDefinition, SecurityError

KEY_BITS = 2048  # RSA: signs key offers and receives session keys (one of each per dialog)
MASTER_KEY_FILE = "RAYBROKER_MASTER_KEY_FILE"  # the environment's names for the master key
MASTER_KEY = "RAYBROKER_MASTER_KEY"
MIN_MASTER_KEY = 16  # bytes


class CertInfo(NamedTuple):
    """What a broker needs of a certificate: who it names, when it is valid, its fingerprint
    (how key offers name it) and its public key."""

    subject: str
    not_before: float
    not_after: float
    fingerprint: str  # sha256 of the DER encoding, hex
    public_key: rsa.RSAPublicKey


def make(subject: str, days: float, now: float) -> tuple[str, rsa.RSAPrivateKey]:
    """A new RSA key and a self-signed certificate for it, valid from `now` for `days` days:
    the certificate's PEM and the private key."""
    if not isinstance(days, (int, float)) or isinstance(days, bool) or not 0 < days <= 36_500:
        raise InvalidDefinition(f"a certificate is valid for 0 to 36,500 days, not {days!r}")
    key = rsa.generate_private_key(public_exponent=65537, key_size=KEY_BITS)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    start = datetime.datetime.fromtimestamp(int(now), datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=days))
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode(), key


def read(pem: str, what: str = "certificate") -> CertInfo:
    """The certificate in `pem`; InvalidDefinition naming `what` if it is not one this broker
    can use (a PEM X.509 certificate with an RSA key of at least 2048 bits)."""
    if not isinstance(pem, str) or "BEGIN CERTIFICATE" not in pem:
        raise InvalidDefinition(f"{what}: give a PEM X.509 certificate ('-----BEGIN CERTIFICATE')")
    try:
        cert = x509.load_pem_x509_certificate(pem.encode())
        key = cert.public_key()
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise InvalidDefinition(f"{what}: not a readable X.509 certificate: {exc}") from None
    if not isinstance(key, rsa.RSAPublicKey) or key.key_size < KEY_BITS:
        raise InvalidDefinition(
            f"{what}: the certificate's key must be RSA of at least {KEY_BITS} bits; make one "
            "with `raybroker cert create`"
        )
    subject = ", ".join(a.rfc4514_string() for a in cert.subject) or "(no subject)"
    der = cert.public_bytes(serialization.Encoding.DER)
    return CertInfo(
        subject,
        cert.not_valid_before_utc.timestamp(),
        cert.not_valid_after_utc.timestamp(),
        hashlib.sha256(der).hexdigest(),
        key,
    )


def invalid_at(info: CertInfo, now: float) -> str | None:
    """Why the certificate may not be used at `now` (expired, not valid yet), or None."""
    if now < info.not_before:
        return f"certificate {info.subject} is not valid before {_when(info.not_before)}"
    if now >= info.not_after:
        return f"certificate {info.subject} expired at {_when(info.not_after)}"
    return None


def _when(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


# --- private keys under the master key ---------------------------------------------------------


def seal_key(key: rsa.RSAPrivateKey, master: bytes) -> str:
    """The private key as an encrypted PKCS#8 PEM under the master key: what the store keeps."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(master),
    ).decode()


def open_key(pem: str, master: bytes, certificate: str) -> rsa.RSAPrivateKey:
    """The private key sealed by `seal_key`; SecurityError if the master key does not open it."""
    try:
        key = serialization.load_pem_private_key(pem.encode(), password=master)
    except (ValueError, TypeError):
        raise SecurityError(
            f"certificate {certificate!r}: the master key does not open its private key; start "
            "the broker with the master key it was created under"
        ) from None
    if not isinstance(key, rsa.RSAPrivateKey):
        raise SecurityError(f"certificate {certificate!r}: its private key is not RSA")
    return key


def matches(key: rsa.RSAPrivateKey, info: CertInfo) -> bool:
    return key.public_key().public_numbers() == info.public_key.public_numbers()


def master_key(path: str | None = None) -> bytes | None:
    """The operator's master key: the file at `path`, else the file named by
    $RAYBROKER_MASTER_KEY_FILE, else $RAYBROKER_MASTER_KEY itself; None if none is given. Never
    an argument of its own: an argument could land in Ray's dashboard, a path does no harm."""
    path = path or os.environ.get(MASTER_KEY_FILE)
    if path:
        try:
            with open(path, "rb") as f:
                key = f.read().strip()
        except OSError as exc:
            raise SecurityError(f"cannot read the master key file {path!r}: {exc}") from None
        where = f"the master key file {path!r}"
    else:
        text = os.environ.get(MASTER_KEY)
        if not text:
            return None
        key, where = text.strip().encode(), f"${MASTER_KEY}"
    if len(key) < MIN_MASTER_KEY:
        raise SecurityError(
            f"{where} holds {len(key)} bytes; a master key is at least {MIN_MASTER_KEY} (make one "
            "with: head -c 32 /dev/urandom | base64 > master.key)"
        )
    return key
