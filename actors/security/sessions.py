"""Dialog security: a session key per dialog, offered by the initiator to the target, and every
message between other brokers sealed with it.

The offer travels with the dialog's first messages: the session key wrapped (AES-GCM, bound to
the dialog) with a key-exchange key between the two services, which travels beside it encrypted
to the target service's certificate (RSA-OAEP) and signed by the initiator service's certificate
(RSA-PSS) unless the binding is anonymous. The target opens the exchange key with its private key
and checks the signature once per exchange key, and for every offer that the signer is still
valid and may send to the service. The messages of each bundle are then sealed together
with AES-256-GCM under the session key, their dialog, direction, sequence numbers and message
types authenticated with them, so a sealed body cannot be read, changed, replayed at another
place in the dialog, reordered or moved into another dialog (a replay at its own place is a
duplicate the receiver drops by its sequence number). One seal per bundle, not per message: a
bundle of a thousand messages costs one AEAD call. Every primitive is the `cryptography`
package's. Plain Python."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import msgpack
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ed25519, padding, rsa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from actors.errors import SecurityError
from actors.ids import random_bytes
from actors.packing import packb
from actors.security.certificates import CertInfo, invalid_at

VERSION = 1
KEY_BYTES = 32
NONCE_BYTES = 12
ANONYMOUS = "public"  # the grantee of a service anyone may begin dialogs to (anonymous bindings)

_OAEP = padding.OAEP(mgf=padding.MGF1(hashes.SHA256()), algorithm=hashes.SHA256(), label=None)
_PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.MAX_LENGTH)


def new_session_key() -> bytes:
    return random_bytes(KEY_BYTES)


class Signer(NamedTuple):
    """The initiator service's certificate and private key."""

    fingerprint: str
    key: rsa.RSAPrivateKey


# --- key offers ----------------------------------------------------------------------------

OFFER_VERSION = 2  # 1: the session key RSA-wrapped in every offer (no key-exchange key)
EXCHANGE_LIFETIME_S = 3600.0  # an initiator makes a new key-exchange key at least this often


class Exchange(NamedTuple):
    """A key-exchange key from one service to another (Service Broker's KEK): made once, sent
    RSA-wrapped to the target service's certificate and signed by the initiator service's
    (`head`), then used to wrap each new dialog's session key. The RSA work (a signature and a
    decryption, ~1.7 ms of CPU) is paid once per pair of services and certificates, not once per
    dialog: one dialog per order costs an AEAD call, not two RSA operations."""

    key: bytes
    head: bytes  # [target fingerprint, signer fingerprint or None, wrapped key, signature]
    made_at: float


def _head_data(from_service: str, to_service: str, fields: list) -> bytes:
    return packb([OFFER_VERSION, from_service, to_service, *fields])


def _dialog_aad(conversation_id: str, from_service: str, to_service: str) -> bytes:
    return packb([OFFER_VERSION, conversation_id, from_service, to_service])


def exchange(
    from_service: str, to_service: str, target: CertInfo, signer: Signer | None, now: float
) -> Exchange:
    """A new key-exchange key for dialogs from `from_service` to `to_service`: for `target`'s
    private key only, signed by `signer` (None: an anonymous binding)."""
    key = new_session_key()
    fields = [
        target.fingerprint,
        signer.fingerprint if signer is not None else None,
        target.public_key.encrypt(key, _OAEP),
    ]
    signature = None
    if signer is not None:
        signature = signer.key.sign(_head_data(from_service, to_service, fields), _PSS,
                                    hashes.SHA256())  # fmt: skip
    return Exchange(key, packb([*fields, signature]), now)


def offer(
    session_key: bytes, conversation_id: str, from_service: str, to_service: str, ex: Exchange
) -> bytes:
    """The key offer of a dialog: its `session_key` wrapped with the exchange key (AES-GCM, bound
    to the dialog and its two services), beside the exchange's head."""
    nonce = random_bytes(NONCE_BYTES)
    aad = _dialog_aad(conversation_id, from_service, to_service)
    return packb([OFFER_VERSION, ex.head, nonce + AESGCM(ex.key).encrypt(nonce, session_key, aad)])


def _known_signer(
    known: Mapping[str, tuple[str, CertInfo]], fingerprint: Any, now: float, what: str, hint: str
) -> tuple[str, CertInfo]:
    """(name, info) of the known, valid certificate `fingerprint`; SecurityError saying `what`
    was signed and, for an unknown signer, what to do (`hint`)."""
    found = known.get(fingerprint) if isinstance(fingerprint, str) else None
    if found is None:
        raise SecurityError(
            f"{what} is signed by a certificate this broker does not know (fingerprint "
            f"{str(fingerprint)[:16]}...); {hint}"
        )
    name, info = found
    if why := invalid_at(info, now):
        raise SecurityError(f"{what} is signed by {name!r}, but {why}")
    return found


def _signer(
    known: Mapping[str, tuple[str, CertInfo]],
    fingerprint: Any,
    signature: Any,
    data: bytes,
    now: float,
    what: str,
    hint: str,
) -> str:
    """The name of the known, valid certificate whose key signed `data` (see _known_signer)."""
    name, info = _known_signer(known, fingerprint, now, what, hint)
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
    opened: dict[tuple[str, str, bytes], bytes] | None = None,
) -> Accepted:
    """Open a key offer for a dialog to `to_service`. `own_keys`: the target service's private
    keys by certificate fingerprint; `known`: certificates this broker holds, fingerprint ->
    (name, info); `may_send(name)`: whether that certificate (or ANONYMOUS) is granted SEND on
    the service; `opened`: exchange keys already opened, by (services, head), added to here, so
    a head's signature is checked and its key decrypted once (the signer's certificate, its
    validity and the grant are checked for every offer). SecurityError says why it is refused."""
    what = f"conversation {conversation_id}"
    try:
        version, head, wrapped_session = msgpack.unpackb(blob, raw=False)
        target_fp, signer_fp, wrapped, signature = msgpack.unpackb(head, raw=False)
    except Exception:  # msgpack raises several unrelated types for bad input
        raise SecurityError(f"{what}: a malformed key offer") from None
    if version != OFFER_VERSION:
        raise SecurityError(f"{what}: key offer version {version!r} (a broker of another release)")
    key = own_keys.get(target_fp) if isinstance(target_fp, str) else None
    if key is None:
        raise SecurityError(
            f"{what}: its key offer is for a certificate of service {to_service!r} this broker "
            f"has no private key of (fingerprint {str(target_fp)[:16]}...); create the "
            "service's certificate here and bind the far side to it"
        )
    target = known.get(target_fp)
    if target is not None and (why := invalid_at(target[1], now)):
        raise SecurityError(f"{what}: the target's {why}")
    cache = opened if opened is not None else {}
    held = cache.get((from_service, to_service, head))
    by, hint = f"{what}: the key offer, by the initiator,", "import the initiator's certificate"
    if signer_fp is None:
        signer = ANONYMOUS
    elif held is not None:  # its signature verified when first opened; the signer still valid
        signer = _known_signer(known, signer_fp, now, by, hint)[0]
    else:
        data = _head_data(from_service, to_service, [target_fp, signer_fp, wrapped])
        signer = _signer(known, signer_fp, signature, data, now, by, hint)
    if not may_send(signer):
        raise SecurityError(
            f"{what}: certificate {signer!r} is not granted SEND on service {to_service!r}; "
            "create a Grant for it"
        )
    try:
        if held is None:
            held = key.decrypt(wrapped, _OAEP)
        aad = _dialog_aad(conversation_id, from_service, to_service)
        nonce, sealed = wrapped_session[:NONCE_BYTES], wrapped_session[NONCE_BYTES:]
        session_key = AESGCM(held).decrypt(nonce, sealed, aad)
    except (ValueError, TypeError, InvalidTag):
        raise SecurityError(f"{what}: its key offer cannot be opened") from None
    if len(session_key) != KEY_BYTES:
        raise SecurityError(f"{what}: a session key of the wrong size")
    cache[(from_service, to_service, head)] = held
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
        nonce = random_bytes(NONCE_BYTES)
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


@functools.lru_cache(maxsize=4)
def _key_wrapper(master: bytes) -> ChaCha20Poly1305:
    """The AEAD that keeps session keys in the store, keyed by the master key (through HKDF:
    the master key itself seals private keys, this one only session keys). Made once per
    master key: every secured dialog's key is wrapped when it begins."""
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"raybroker session keys")
    return ChaCha20Poly1305(hkdf.derive(master))


def wrap_key(session_key: bytes, master: bytes, endpoint_no: int) -> bytes:
    """A session key sealed for the store, bound to its endpoint's row."""
    nonce = random_bytes(NONCE_BYTES)
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
CALL_VERSION = 2  # 1: every call RSA-signed
CALL_KEY_LIFETIME_S = 3600.0  # a broker makes a new call key at least this often
CALL_KEY_MAX_AGE_S = 2 * CALL_KEY_LIFETIME_S  # older ones are refused (clocks may differ)


class CallKey(NamedTuple):
    """A short-lived Ed25519 key a broker signs its calls with, certified once by its identity
    certificate (RSA-PSS over the key, the broker and when it was made: `head`, sent with every
    call). A call then costs an Ed25519 signature (~50 us of CPU) instead of an RSA one
    (~900 us), and a receiver checks the RSA signature once per call key, not per call."""

    key: ed25519.Ed25519PrivateKey
    head: bytes  # [identity fingerprint, public key, made at, RSA signature]
    made_at: float


def _call_head_data(sender: str, signer_fp: Any, public: Any, made_at: Any) -> bytes:
    return packb([CALL, CALL_VERSION, sender, signer_fp, public, made_at])


def call_key(sender: str, signer: Signer, now: float) -> CallKey:
    """A new call key for broker `sender`, certified by its identity `signer`."""
    key = ed25519.Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    data = _call_head_data(sender, signer.fingerprint, public, now)
    signature = signer.key.sign(data, _PSS, hashes.SHA256())
    return CallKey(key, packb([signer.fingerprint, public, now, signature]), now)


# how a signed call begins, as `sign_call` packs it: a list of 7 fields, the first CALL
_SIGNED_HEAD = b"\x97" + packb(CALL)


def sign_call(blob: bytes, sender: str, to: str, ck: CallKey) -> bytes:
    """A call's bundles as broker `sender` sends them to broker `to`: signed with its call key."""
    fields = [CALL, CALL_VERSION, sender, to, ck.head]
    return packb([*fields, blob, ck.key.sign(packb([*fields, blob]))])


def _call_fields(blob: bytes) -> list | None:
    # a plain call (a list of bundles) is told apart by its first bytes: unpacked here, every
    # body in it would be decoded only to be thrown away (and again by the bundles' reading);
    # what is not bytes at all, the bundles' reading refuses
    if not isinstance(blob, (bytes, bytearray)) or blob[: len(_SIGNED_HEAD)] != _SIGNED_HEAD:
        return None
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
    opened: dict[tuple[str, bytes], ed25519.Ed25519PublicKey] | None = None,
) -> tuple[str, bytes] | None:
    """(certificate name, the call's bundles) of a signed call to broker `me`; None if `blob`
    is not a signed call. SecurityError if it is one this broker does not accept. `opened`:
    call keys whose certificate was checked already, by (sender, head), added to here (the
    identity's validity and its CONNECT grant are checked for every call)."""
    fields = _call_fields(blob)
    if fields is None:
        return None
    _, version, sender, to, head, inner, signature = fields
    if version != CALL_VERSION or not all(isinstance(f, bytes) for f in (head, inner, signature)):
        raise SecurityError(f"a signed call of an unknown form (version {version!r})")
    if to != me:
        raise SecurityError(f"a call signed for broker {to!r} arrived at {me!r}")
    what = f"a call claiming broker {sender!r},"
    hint = "import its identity certificate and grant it CONNECT"
    try:
        signer_fp, public, made_at, head_signature = msgpack.unpackb(head, raw=False)
        age = now - made_at
    except Exception:  # msgpack raises several unrelated types for bad input
        raise SecurityError(f"{what} with a malformed call key") from None
    if not -CALL_KEY_MAX_AGE_S < age < CALL_KEY_MAX_AGE_S:
        raise SecurityError(f"{what} signed with a call key made {age:,.0f} s ago: too old")
    cache = opened if opened is not None else {}
    verifier = cache.get((sender, head))
    if verifier is not None:  # its certificate checked when first seen; the identity still valid
        name = _known_signer(known, signer_fp, now, what, hint)[0]
    else:
        data = _call_head_data(sender, signer_fp, public, made_at)
        name = _signer(known, signer_fp, head_signature, data, now, what, hint)
        try:
            verifier = ed25519.Ed25519PublicKey.from_public_bytes(public)
        except (ValueError, TypeError):
            raise SecurityError(f"{what} with a malformed call key") from None
    if not may_connect(name):
        raise SecurityError(
            f"broker {sender!r} (certificate {name!r}) is not granted CONNECT on this broker"
        )
    try:
        verifier.verify(signature, packb(fields[:5] + [inner]))
    except InvalidSignature:
        raise SecurityError(f"{what} does not verify against its call key") from None
    cache[(sender, head)] = verifier
    return name, inner
