"""Dialog security: a session key per dialog, offered by the initiator to the target, and every
message between other brokers sealed with it.

The offer travels with the dialog's first messages: the session key encrypted to the target
service's certificate (RSA-OAEP), signed by the initiator service's certificate (RSA-PSS) unless
the binding is anonymous. The target opens it with its private key, checks the signature and
that the signer may send to the service. The messages of each bundle are then sealed together
with AES-256-GCM under the session key, their dialog, direction, sequence numbers and message
types authenticated with them, so a sealed body cannot be read, changed, replayed at another
place in the dialog, reordered or moved into another dialog (a replay at its own place is a
duplicate the receiver drops by its sequence number). One seal per bundle, not per message: a
bundle of a thousand messages costs one AEAD call. Every primitive is the `cryptography`
package's. Plain Python."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import msgpack
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from actors.errors import SecurityError
from actors.packing import packb
from actors.security.certificates import CertInfo, invalid_at

VERSION = 1
KEY_BYTES = 32
NONCE_BYTES = 12
ANONYMOUS = "public"  # the grantee of a service anyone may begin dialogs to (anonymous bindings)

_OAEP = padding.OAEP(mgf=padding.MGF1(hashes.SHA256()), algorithm=hashes.SHA256(), label=None)
_PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.MAX_LENGTH)


def new_session_key() -> bytes:
    return os.urandom(KEY_BYTES)


class Signer(NamedTuple):
    """The initiator service's certificate and private key."""

    fingerprint: str
    key: rsa.RSAPrivateKey


def _signed(conversation_id: str, from_service: str, to_service: str, fields: list) -> bytes:
    return packb([VERSION, conversation_id, from_service, to_service, *fields])


def offer(
    session_key: bytes,
    conversation_id: str,
    from_service: str,
    to_service: str,
    target: CertInfo,
    signer: Signer | None,
) -> bytes:
    """The key offer of a dialog: `session_key` for `target`'s private key only, signed by
    `signer` (None: an anonymous binding)."""
    wrapped = target.public_key.encrypt(session_key, _OAEP)
    signer_fp = signer.fingerprint if signer is not None else None
    fields = [target.fingerprint, signer_fp, wrapped]
    signature = None
    if signer is not None:
        data = _signed(conversation_id, from_service, to_service, fields)
        signature = signer.key.sign(data, _PSS, hashes.SHA256())
    return packb([VERSION, *fields, signature])


def _signer(
    known: Mapping[str, tuple[str, CertInfo]],
    fingerprint: Any,
    signature: Any,
    data: bytes,
    now: float,
    what: str,
    hint: str,
) -> str:
    """The name of the known, valid certificate whose key signed `data`; SecurityError saying
    `what` was signed and, for an unknown signer, what to do (`hint`)."""
    found = known.get(fingerprint) if isinstance(fingerprint, str) else None
    if found is None:
        raise SecurityError(
            f"{what} is signed by a certificate this broker does not know (fingerprint "
            f"{str(fingerprint)[:16]}...); {hint}"
        )
    name, info = found
    if why := invalid_at(info, now):
        raise SecurityError(f"{what} is signed by {name!r}, but {why}")
    try:
        info.public_key.verify(signature, data, _PSS, hashes.SHA256())
    except (InvalidSignature, TypeError):
        raise SecurityError(
            f"{what} does not verify: its signature does not verify against certificate {name!r}"
        ) from None
    return name


class Accepted(NamedTuple):
    session_key: bytes
    signer: str  # the certificate's name that signed the offer, or ANONYMOUS


def accept(
    blob: bytes,
    conversation_id: str,
    from_service: str,
    to_service: str,
    own_keys: Mapping[str, rsa.RSAPrivateKey],
    known: Mapping[str, tuple[str, CertInfo]],
    may_send: Callable[[str], bool],
    now: float,
) -> Accepted:
    """Open a key offer for a dialog to `to_service`. `own_keys`: the target service's private
    keys by certificate fingerprint; `known`: certificates this broker holds, fingerprint ->
    (name, info); `may_send(name)`: whether that certificate (or ANONYMOUS) is granted SEND on
    the service. SecurityError says why the offer is refused."""
    try:
        version, target_fp, signer_fp, wrapped, signature = msgpack.unpackb(blob, raw=False)
    except Exception:  # msgpack raises several unrelated types for bad input
        raise SecurityError(f"conversation {conversation_id}: a malformed key offer") from None
    if version != VERSION:
        raise SecurityError(f"conversation {conversation_id}: key offer version {version!r}")
    key = own_keys.get(target_fp) if isinstance(target_fp, str) else None
    if key is None:
        raise SecurityError(
            f"conversation {conversation_id}: its key offer is for a certificate of service "
            f"{to_service!r} this broker has no private key of (fingerprint "
            f"{str(target_fp)[:16]}...); create the service's certificate here and bind the far "
            "side to it"
        )
    target = known.get(target_fp)
    if target is not None and (why := invalid_at(target[1], now)):
        raise SecurityError(f"conversation {conversation_id}: the target's {why}")
    if signer_fp is None:
        signer = ANONYMOUS
    else:
        data = _signed(conversation_id, from_service, to_service, [target_fp, signer_fp, wrapped])
        signer = _signer(known, signer_fp, signature, data, now,
                         f"conversation {conversation_id}: the key offer, by the initiator,",
                         "import the initiator's certificate")  # fmt: skip
    if not may_send(signer):
        raise SecurityError(
            f"conversation {conversation_id}: certificate {signer!r} is not granted SEND on "
            f"service {to_service!r}; create a Grant for it"
        )
    try:
        session_key = key.decrypt(wrapped, _OAEP)
    except (ValueError, TypeError):
        raise SecurityError(
            f"conversation {conversation_id}: its key offer cannot be opened"
        ) from None
    if len(session_key) != KEY_BYTES:
        raise SecurityError(f"conversation {conversation_id}: a session key of the wrong size")
    return Accepted(session_key, signer)


class Session:
    """One dialog's sealing and opening of bundles: the bodies a bundle carries are sealed
    together (AES-256-GCM, a random nonce per bundle), with the dialog, the direction, the
    sequence numbers and the message types as authenticated data. So each body is bound to its
    dialog and its place in it; a bundle changed anywhere opens not at all."""

    __slots__ = ("aead", "conversation_id")

    def __init__(self, session_key: bytes, conversation_id: str) -> None:
        self.aead = AESGCM(session_key)
        self.conversation_id = conversation_id

    def _aad(self, from_initiator: bool, seqs: Sequence[int], types: Sequence[str]) -> bytes:
        return packb([VERSION, self.conversation_id, from_initiator, list(seqs), list(types)])

    def seal(
        self,
        from_initiator: bool,
        seqs: Sequence[int],
        types: Sequence[str],
        bodies: Sequence[bytes],
    ) -> bytes:
        """One direction's messages (consecutive sequence numbers), sealed as one."""
        nonce = os.urandom(NONCE_BYTES)
        aad = self._aad(from_initiator, seqs, types)
        return nonce + self.aead.encrypt(nonce, packb(list(bodies)), aad)

    def open(
        self, from_initiator: bool, seqs: Sequence[int], types: Sequence[str], sealed: bytes
    ) -> list[bytes]:
        """The bodies `seal` sealed; SecurityError if anything of them, their dialog, their
        direction, sequence numbers or types was changed."""
        try:
            aad = self._aad(from_initiator, seqs, types)
            packed = self.aead.decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], aad)
            bodies = msgpack.unpackb(packed, raw=False)
        except (InvalidTag, ValueError, TypeError):
            bodies = None
        if not (
            isinstance(bodies, list)
            and len(bodies) == len(seqs)
            and all(isinstance(b, bytes) for b in bodies)
        ):
            raise SecurityError(
                f"conversation {self.conversation_id}: messages {list(seqs)[:1]}... do not "
                "verify (changed in flight, or not of this dialog at this place)"
            )
        return bodies


# --- session keys at rest ------------------------------------------------------------------


def _key_wrapper(master: bytes) -> ChaCha20Poly1305:
    """The AEAD that keeps session keys in the store, keyed by the master key (through HKDF:
    the master key itself seals private keys, this one only session keys)."""
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"raybroker session keys")
    return ChaCha20Poly1305(hkdf.derive(master))


def wrap_key(session_key: bytes, master: bytes, endpoint_no: int) -> bytes:
    """A session key sealed for the store, bound to its endpoint's row."""
    nonce = os.urandom(12)
    return nonce + _key_wrapper(master).encrypt(nonce, session_key, str(endpoint_no).encode())


def unwrap_key(blob: bytes, master: bytes, endpoint_no: int) -> bytes:
    try:
        return _key_wrapper(master).decrypt(blob[:12], blob[12:], str(endpoint_no).encode())
    except (InvalidTag, ValueError):
        raise SecurityError(
            f"the session key of endpoint {endpoint_no} does not open with this master key; "
            "start the broker with the master key its dialogs were secured under"
        ) from None


# --- transport security: calls between brokers ----------------------------------------------

CALL = "raybroker-call"  # the first field of a signed call (a plain call is a list of bundles)


def sign_call(blob: bytes, sender: str, to: str, signer: Signer) -> bytes:
    """A call's bundles as broker `sender` sends them to broker `to`: signed by its identity."""
    fields = [CALL, VERSION, sender, to, signer.fingerprint]
    signature = signer.key.sign(packb([*fields, blob]), _PSS, hashes.SHA256())
    return packb([*fields, blob, signature])


def _call_fields(blob: bytes) -> list | None:
    try:
        fields = msgpack.unpackb(blob, raw=False)
    except Exception:  # not msgpack at all: the bundles' own reading says so
        return None
    if not (isinstance(fields, list) and len(fields) == 7 and fields[0] == CALL):
        return None
    return fields


def call_bundles(blob: bytes) -> bytes:
    """The bundles of a call, signed or not, unchecked (a broker that trusts every sender)."""
    fields = _call_fields(blob)
    return fields[5] if fields is not None and isinstance(fields[5], bytes) else blob


def open_call(
    blob: bytes,
    me: str,
    known: Mapping[str, tuple[str, CertInfo]],
    may_connect: Callable[[str], bool],
    now: float,
) -> tuple[str, bytes] | None:
    """(certificate name, the call's bundles) of a signed call to broker `me`; None if `blob`
    is not a signed call. SecurityError if it is one this broker does not accept."""
    fields = _call_fields(blob)
    if fields is None:
        return None
    _, version, sender, to, signer_fp, inner, signature = fields
    if version != VERSION or not isinstance(inner, bytes) or not isinstance(signature, bytes):
        raise SecurityError(f"a signed call of an unknown form (version {version!r})")
    if to != me:
        raise SecurityError(f"a call signed for broker {to!r} arrived at {me!r}")
    name = _signer(known, signer_fp, signature, packb(fields[:5] + [inner]), now,
                   f"a call claiming broker {sender!r},",
                   "import its identity certificate and grant it CONNECT")  # fmt: skip
    if not may_connect(name):
        raise SecurityError(
            f"broker {sender!r} (certificate {name!r}) is not granted CONNECT on this broker"
        )
    return name, inner
