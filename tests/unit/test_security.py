"""Certificates, master-key sealing, key offers and sealed messages (actors.security): the
rules of dialog security, with real keys and no broker."""

from __future__ import annotations

import time

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from hypothesis import given
from hypothesis import strategies as st

from actors.errors import InvalidDefinition, SecurityError
from actors.security import certificates as certs
from actors.security.sessions import (
    ANONYMOUS,
    Session,
    Signer,
    accept,
    new_session_key,
    offer,
    unwrap_key,
    wrap_key,
)

NOW = time.time()
MASTER = b"0123456789abcdef0123456789abcdef"


@pytest.fixture(scope="module")
def target():
    pem, key = certs.make("OrdersService", 30, NOW)
    return pem, key, certs.read(pem)


@pytest.fixture(scope="module")
def initiator():
    pem, key = certs.make("ShopService", 30, NOW)
    return pem, key, certs.read(pem)


# --- certificates --------------------------------------------------------------------------


def test_a_made_certificate_reads_back_with_its_subject_window_and_a_stable_fingerprint(target):
    pem, key, info = target
    assert info.subject == "CN=OrdersService"
    assert info.not_before <= NOW < info.not_after
    assert info.not_after - info.not_before == pytest.approx(30 * 86400, abs=1)
    assert info == certs.read(pem) and len(info.fingerprint) == 64
    assert certs.matches(key, info)
    other = certs.make("Other", 1, NOW)[1]
    assert not certs.matches(other, info)


@pytest.mark.parametrize(
    "pem, says",
    [
        (None, "PEM X.509 certificate"),
        ("hello", "PEM X.509 certificate"),
        ("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", "not a readable"),
    ],
)
def test_what_is_not_a_certificate_is_refused_by_name(pem, says):
    with pytest.raises(InvalidDefinition, match=says):
        certs.read(pem, "certificate 'X'")


def test_a_certificate_whose_key_is_not_rsa_is_refused():
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ec")])
    import datetime

    start = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(1).not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=1)).sign(key, hashes.SHA256())
    )  # fmt: skip
    pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    with pytest.raises(InvalidDefinition, match="must be RSA"):
        certs.read(pem)


@pytest.mark.parametrize("days", [0, -1, 40_000, "30", True])
def test_a_validity_out_of_range_is_refused(days):
    with pytest.raises(InvalidDefinition, match="valid for 0 to 36,500 days"):
        certs.make("x", days, NOW)


def test_a_certificate_is_usable_only_inside_its_window(target):
    info = target[2]
    assert certs.invalid_at(info, NOW) is None
    assert "not valid before" in certs.invalid_at(info, info.not_before - 1)
    assert "expired at" in certs.invalid_at(info, info.not_after)


# --- the master key ------------------------------------------------------------------------


def test_a_private_key_is_kept_sealed_and_opens_only_with_its_master_key(target):
    key = target[1]
    sealed = certs.seal_key(key, MASTER)
    assert "ENCRYPTED PRIVATE KEY" in sealed
    clear = key.private_bytes(
        serialization.Encoding.DER,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    assert clear[40:80] not in sealed.encode()  # nothing of the key in the clear
    opened = certs.open_key(sealed, MASTER, "C")
    assert opened.private_numbers() == key.private_numbers()
    with pytest.raises(SecurityError, match="master key does not open"):
        certs.open_key(sealed, b"another master key, 32 bytes...", "C")


def test_the_master_key_comes_from_a_file_or_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(certs.MASTER_KEY_FILE, raising=False)
    monkeypatch.delenv(certs.MASTER_KEY, raising=False)
    assert certs.master_key() is None
    path = tmp_path / "master.key"
    path.write_bytes(MASTER + b"\n")
    assert certs.master_key(str(path)) == MASTER
    monkeypatch.setenv(certs.MASTER_KEY_FILE, str(path))
    assert certs.master_key() == MASTER
    monkeypatch.delenv(certs.MASTER_KEY_FILE)
    monkeypatch.setenv(certs.MASTER_KEY, "from the environment, long enough")
    assert certs.master_key() == b"from the environment, long enough"
    monkeypatch.setenv(certs.MASTER_KEY, "short")
    with pytest.raises(SecurityError, match="at least 16"):
        certs.master_key()
    with pytest.raises(SecurityError, match="cannot read the master key file"):
        certs.master_key(str(tmp_path / "missing.key"))


# --- key offers ------------------------------------------------------------------------------


def _accept(blob, target, known, granted=("ShopCert",), conv="conv-1", now=NOW):
    return accept(
        blob,
        conv,
        "Shop",
        "Orders",
        {target[2].fingerprint: target[1]},
        known,
        lambda name: name in granted,
        now,
    )


def _known(target, initiator):
    return {target[2].fingerprint: ("OrdersCert", target[2]),
            initiator[2].fingerprint: ("ShopCert", initiator[2])}  # fmt: skip


def test_a_signed_offer_gives_the_target_the_session_key_and_names_its_signer(target, initiator):
    key = new_session_key()
    signer = Signer(initiator[2].fingerprint, initiator[1])
    blob = offer(key, "conv-1", "Shop", "Orders", target[2], signer)
    got = _accept(blob, target, _known(target, initiator))
    assert got.session_key == key and got.signer == "ShopCert"
    assert key not in blob  # the session key travels encrypted


def test_an_anonymous_offer_needs_send_granted_to_public(target, initiator):
    blob = offer(new_session_key(), "conv-1", "Shop", "Orders", target[2], None)
    with pytest.raises(SecurityError, match="'public' is not granted SEND on service 'Orders'"):
        _accept(blob, target, _known(target, initiator))
    assert _accept(blob, target, {}, granted=(ANONYMOUS,)).signer == ANONYMOUS


def test_an_offer_is_refused_without_the_grant_the_signer_or_the_targets_key(target, initiator):
    signer = Signer(initiator[2].fingerprint, initiator[1])
    blob = offer(new_session_key(), "conv-1", "Shop", "Orders", target[2], signer)
    with pytest.raises(SecurityError, match="'ShopCert' is not granted SEND"):
        _accept(blob, target, _known(target, initiator), granted=())
    with pytest.raises(SecurityError, match="does not know"):
        _accept(blob, target, {target[2].fingerprint: ("OrdersCert", target[2])})
    # an offer made for another target's certificate: this broker holds no key for it
    with pytest.raises(SecurityError, match="no private key of"):
        _accept(blob, initiator, _known(target, initiator))


def test_an_offer_moved_to_another_dialog_or_service_does_not_verify(target, initiator):
    signer = Signer(initiator[2].fingerprint, initiator[1])
    blob = offer(new_session_key(), "conv-1", "Shop", "Orders", target[2], signer)
    with pytest.raises(SecurityError, match="signature does not verify"):
        _accept(blob, target, _known(target, initiator), conv="conv-2")
    with pytest.raises(SecurityError, match="signature does not verify"):
        accept(blob, "conv-1", "Other", "Orders", {target[2].fingerprint: target[1]},
               _known(target, initiator), lambda n: True, NOW)  # fmt: skip


def test_an_offer_signed_by_an_expired_certificate_is_refused(target, initiator):
    signer = Signer(initiator[2].fingerprint, initiator[1])
    blob = offer(new_session_key(), "conv-1", "Shop", "Orders", target[2], signer)
    with pytest.raises(SecurityError, match="expired at"):
        _accept(blob, target, _known(target, initiator), now=NOW + 31 * 86400)


@pytest.mark.parametrize("blob", [b"", b"\x93\x01\x02\x03", b"not msgpack \xc1"])
def test_a_malformed_offer_is_refused(target, blob):
    with pytest.raises(SecurityError):
        _accept(blob, target, {})


def test_an_offer_whose_wrapped_key_was_changed_is_refused(target, initiator):
    import msgpack

    signer = Signer(initiator[2].fingerprint, initiator[1])
    blob = offer(new_session_key(), "conv-1", "Shop", "Orders", target[2], signer)
    fields = msgpack.unpackb(blob)
    wrapped = bytearray(fields[3])
    wrapped[10] ^= 1
    fields[3] = bytes(wrapped)
    with pytest.raises(SecurityError, match="signature does not verify"):
        _accept(msgpack.packb(fields), target, _known(target, initiator))


# --- sealed messages -----------------------------------------------------------------------


def test_sealed_bodies_open_only_at_their_own_places_in_their_own_dialog():
    key = new_session_key()
    s = Session(key, "conv-1")
    bodies = [b"secret order", b"second line"]
    sealed = s.seal(True, [7, 8], ["Order", "Order"], bodies)
    assert b"secret order" not in sealed and b"second line" not in sealed
    assert Session(key, "conv-1").open(True, [7, 8], ["Order", "Order"], sealed) == bodies
    for where in [
        (True, [8, 9], ["Order", "Order"]),  # replayed at other sequence numbers
        (True, [7], ["Order"]),  # a message cut off
        (False, [7, 8], ["Order", "Order"]),  # reflected to the other direction
        (True, [7, 8], ["Order", "Invoice"]),  # relabelled as another message type
    ]:
        with pytest.raises(SecurityError, match="do not verify"):
            s.open(*where, sealed)
    with pytest.raises(SecurityError, match="do not verify"):
        Session(key, "conv-2").open(True, [7, 8], ["Order"] * 2, sealed)  # another dialog
    with pytest.raises(SecurityError, match="do not verify"):
        Session(new_session_key(), "conv-1").open(True, [7, 8], ["Order"] * 2, sealed)
    # sealed twice, the same bodies look different (a fresh nonce per bundle)
    assert s.seal(True, [7, 8], ["Order"] * 2, bodies) != sealed


@given(
    bodies=st.lists(st.binary(max_size=200), min_size=1, max_size=5),
    first=st.integers(0, 2**62),
    flip=st.integers(0, 100_000),
)
def test_any_bodies_round_trip_and_any_flipped_bit_is_caught(bodies, first, flip):
    s = Session(b"k" * 32, "conv")
    seqs, types = list(range(first, first + len(bodies))), ["T"] * len(bodies)
    sealed = s.seal(False, seqs, types, bodies)
    assert s.open(False, seqs, types, sealed) == bodies
    changed = bytearray(sealed)
    changed[flip % len(changed)] ^= 1 << (flip % 8)
    with pytest.raises(SecurityError):
        s.open(False, seqs, types, bytes(changed))


def test_a_session_key_is_kept_sealed_for_its_own_endpoint():
    key = new_session_key()
    wrapped = wrap_key(key, MASTER, 5)
    assert key not in wrapped and unwrap_key(wrapped, MASTER, 5) == key
    with pytest.raises(SecurityError, match="does not open with this master key"):
        unwrap_key(wrapped, MASTER, 6)  # moved to another endpoint's row
    with pytest.raises(SecurityError, match="does not open with this master key"):
        unwrap_key(wrapped, b"another master key, 32 bytes...", 5)


def test_rsa_keys_of_the_default_size_are_made():
    pem, key = certs.make("x", 1, NOW)
    assert isinstance(key, rsa.RSAPrivateKey) and key.key_size == certs.KEY_BITS
