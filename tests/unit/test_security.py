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
    CALL_KEY_MAX_AGE_S,
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


def _offer(key, target, signer, conv="conv-1", ex=None):
    """`key` offered for dialog `conv` from Shop to Orders (a new exchange key unless `ex`)."""
    ex = ex or exchange("Shop", "Orders", target[2], signer, NOW)
    return offer(key, conv, "Shop", "Orders", ex)


def _accept(blob, target, known, granted=("ShopCert",), conv="conv-1", now=NOW, opened=None):
    return accept(
        blob,
        conv,
        "Shop",
        "Orders",
        {target[2].fingerprint: target[1]},
        known,
        lambda name: name in granted,
        now,
        opened,
    )


def _known(target, initiator):
    return {target[2].fingerprint: ("OrdersCert", target[2]),
            initiator[2].fingerprint: ("ShopCert", initiator[2])}  # fmt: skip


def test_a_signed_offer_gives_the_target_the_session_key_and_names_its_signer(target, initiator):
    key = new_session_key()
    signer = Signer(initiator[2].fingerprint, initiator[1])
    blob = _offer(key, target, signer)
    got = _accept(blob, target, _known(target, initiator))
    assert got.session_key == key and got.signer == "ShopCert"
    assert key not in blob  # the session key travels encrypted


def test_an_anonymous_offer_needs_send_granted_to_public(target, initiator):
    blob = _offer(new_session_key(), target, None)
    with pytest.raises(SecurityError, match="'public' is not granted SEND on service 'Orders'"):
        _accept(blob, target, _known(target, initiator))
    assert _accept(blob, target, {}, granted=(ANONYMOUS,)).signer == ANONYMOUS


def test_an_offer_is_refused_without_the_grant_the_signer_or_the_targets_key(target, initiator):
    signer = Signer(initiator[2].fingerprint, initiator[1])
    blob = _offer(new_session_key(), target, signer)
    with pytest.raises(SecurityError, match="'ShopCert' is not granted SEND"):
        _accept(blob, target, _known(target, initiator), granted=())
    with pytest.raises(SecurityError, match="does not know"):
        _accept(blob, target, {target[2].fingerprint: ("OrdersCert", target[2])})
    # an offer made for another target's certificate: this broker holds no key for it
    with pytest.raises(SecurityError, match="no private key of"):
        _accept(blob, initiator, _known(target, initiator))


def test_an_offer_moved_to_another_dialog_or_service_does_not_verify(target, initiator):
    signer = Signer(initiator[2].fingerprint, initiator[1])
    blob = _offer(new_session_key(), target, signer)
    with pytest.raises(SecurityError, match="cannot be opened"):  # the session key's binding
        _accept(blob, target, _known(target, initiator), conv="conv-2")
    with pytest.raises(SecurityError, match="signature does not verify"):
        accept(blob, "conv-1", "Other", "Orders", {target[2].fingerprint: target[1]},
               _known(target, initiator), lambda n: True, NOW)  # fmt: skip


def test_an_offer_signed_by_an_expired_certificate_is_refused(target, initiator):
    signer = Signer(initiator[2].fingerprint, initiator[1])
    blob = _offer(new_session_key(), target, signer)
    with pytest.raises(SecurityError, match="expired at"):
        _accept(blob, target, _known(target, initiator), now=NOW + 31 * 86400)


@pytest.mark.parametrize("blob", [b"", b"\x93\x01\x02\x03", b"not msgpack \xc1"])
def test_a_malformed_offer_is_refused(target, blob):
    with pytest.raises(SecurityError):
        _accept(blob, target, {})


def test_an_offer_whose_wrapped_key_was_changed_is_refused(target, initiator):
    import msgpack

    signer = Signer(initiator[2].fingerprint, initiator[1])
    blob = _offer(new_session_key(), target, signer)
    version, head, wrapped_session = msgpack.unpackb(blob)
    fields = msgpack.unpackb(head)
    wrapped = bytearray(fields[2])
    wrapped[10] ^= 1
    fields[2] = bytes(wrapped)
    changed = msgpack.packb([version, msgpack.packb(fields), wrapped_session])
    with pytest.raises(SecurityError, match="signature does not verify"):
        _accept(changed, target, _known(target, initiator))
    session = bytearray(wrapped_session)
    session[-1] ^= 1
    with pytest.raises(SecurityError, match="cannot be opened"):
        _accept(msgpack.packb([version, head, bytes(session)]), target, _known(target, initiator))


def test_one_exchange_key_serves_many_dialogs_each_offer_bound_to_its_own(target, initiator):
    """The RSA work once per exchange key: later offers reuse the head the target opened, yet
    each session key opens only for its own dialog, and the signer and grant are checked every
    time."""
    import msgpack

    signer = Signer(initiator[2].fingerprint, initiator[1])
    ex = exchange("Shop", "Orders", target[2], signer, NOW)
    keys = [new_session_key() for _ in range(3)]
    blobs = [_offer(k, target, signer, f"conv-{i}", ex) for i, k in enumerate(keys)]
    assert len({msgpack.unpackb(b)[1] for b in blobs}) == 1  # one head, sent with each
    opened: dict = {}
    known = _known(target, initiator)
    for i, (k, b) in enumerate(zip(keys, blobs, strict=True)):
        assert _accept(b, target, known, conv=f"conv-{i}", opened=opened).session_key == k
    assert list(opened.values()) == [ex.key]  # opened once, kept
    with pytest.raises(SecurityError, match="cannot be opened"):  # moved to another dialog
        _accept(blobs[1], target, known, conv="conv-2", opened=opened)
    with pytest.raises(SecurityError, match="not granted SEND"):
        _accept(blobs[2], target, known, conv="conv-2", opened=opened, granted=())
    without_signer = {target[2].fingerprint: ("OrdersCert", target[2])}
    with pytest.raises(SecurityError, match="does not know"):
        _accept(blobs[2], target, without_signer, conv="conv-2", opened=opened)
    with pytest.raises(SecurityError, match="expired at"):
        _accept(blobs[2], target, known, conv="conv-2", opened=opened, now=NOW + 31 * 86400)


# --- signed calls (transport security) ---------------------------------------------------


def test_calls_signed_with_a_call_key_open_with_their_senders_identity_checked_once(initiator):
    import msgpack

    identity = Signer(initiator[2].fingerprint, initiator[1])
    ck = call_key("broker-a", identity, NOW)
    known = {initiator[2].fingerprint: ("AIdentity", initiator[2])}
    opened: dict = {}

    def open_(blob, granted=("AIdentity",), now=NOW, known=known, me="B"):
        return open_call(blob, me, known, lambda n: n in granted, now, opened)

    calls = [sign_call(b"bundles %d" % i, "broker-a", "B", ck) for i in range(3)]
    assert [open_(c) for c in calls] == [("AIdentity", b"bundles %d" % i) for i in range(3)]
    assert len(opened) == 1  # the call key's RSA signature checked once
    fields = msgpack.unpackb(calls[0], raw=False)
    fields[5] = b"bundles changed"
    with pytest.raises(SecurityError, match="does not verify against its call key"):
        open_(msgpack.packb(fields, use_bin_type=True))
    with pytest.raises(SecurityError, match="signed for broker 'B' arrived at 'C'"):
        open_(calls[0], me="C")
    with pytest.raises(SecurityError, match="not granted CONNECT"):
        open_(calls[0], granted=())
    with pytest.raises(SecurityError, match="does not know"):  # its identity dropped since
        open_(calls[0], known={})
    late = call_key("broker-a", identity, NOW + 30 * 86400 - 60)  # just before it expired
    open_(sign_call(b"x", "broker-a", "B", late), now=NOW + 30 * 86400 - 30)
    with pytest.raises(SecurityError, match="expired at"):  # checked again, the key cached
        open_(sign_call(b"y", "broker-a", "B", late), now=NOW + 30 * 86400 + 60)
    old = call_key("broker-a", identity, NOW - CALL_KEY_MAX_AGE_S - 1)
    with pytest.raises(SecurityError, match="too old"):
        open_(sign_call(b"x", "broker-a", "B", old))
    stranger = certs.make("Stranger", 30, NOW)
    forged = call_key("broker-a", Signer(initiator[2].fingerprint, stranger[1]), NOW)
    with pytest.raises(SecurityError, match="signature does not verify"):
        open_(sign_call(b"x", "broker-a", "B", forged))


def test_a_plain_call_is_told_from_a_signed_one_without_unpacking_its_bundles(
    initiator, monkeypatch
):
    from actors.packing import packb
    from actors.security import sessions

    ck = call_key("broker-a", Signer(initiator[2].fingerprint, initiator[1]), NOW)
    plain = packb([["a bundle", i, [b"body"] * 3] for i in range(7)])  # seven, as a call's fields
    signed = sign_call(plain, "broker-a", "B", ck)
    unpacked = []
    real = sessions.msgpack.unpackb
    monkeypatch.setattr(
        sessions.msgpack, "unpackb", lambda blob, **kw: unpacked.append(blob) or real(blob, **kw)
    )
    assert call_bundles(plain) == plain and unpacked == []  # its bodies not decoded to say so
    assert open_call(plain, "B", {}, lambda n: True, NOW) is None and unpacked == []
    assert call_bundles(signed) == plain and unpacked == [signed]  # a signed one opens as before


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
