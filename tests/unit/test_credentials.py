"""Certificates, remote service bindings and grants as catalog objects of a broker (seed 003):
made, imported, altered and dropped on a real store, refused with typed errors that change
nothing, private keys never in the clear. No Ray."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors import LocalBroker
from actors.core import Limits
from actors.errors import (
    InUse,
    InvalidDefinition,
    SecurityError,
    UnknownCertificate,
    UnknownService,
)
from actors.model.credentials import BROKER, Certificate, Grant, RemoteServiceBinding
from actors.security import certificates

MASTER = b"a master key of the operator's 32"


@pytest.fixture
def master_file(tmp_path):
    path = tmp_path / "master.key"
    path.write_bytes(MASTER)
    return str(path)


@pytest.fixture
def secured(make_core, tmp_path, master_file):
    """A broker on a file store with a master key."""
    path = str(tmp_path / "broker.db")
    return make_core(path, Limits(master_key_file=master_file)), path


@pytest.fixture(scope="module")
def far_pem():
    """A far broker's service certificate, as `raybroker cert export` gives it."""
    return certificates.make("FarOrders", 30, 1.7e9)[0]


def _certificate(core, name):
    return dict(next(r for k, r in core.definitions() if k == "certificate" and r["name"] == name))


def test_a_broker_makes_its_services_certificate_and_keeps_the_private_key_sealed(
    secured, make_core, master_file
):
    core, path = secured
    core.create(Certificate("TargetCert", owner="Target", days=30))
    shown = _certificate(core, "TargetCert")
    assert shown["has_private_key"] is True and "private_key" not in shown
    info = certificates.read(shown["certificate"])
    assert info.subject == "CN=Target"
    assert info.not_after - info.not_before == pytest.approx(30 * 86400, abs=1)
    # the store holds the key sealed, never in the clear, and it opens with the master key
    core.store.close()
    raw = Path(path).read_bytes()
    assert b"ENCRYPTED PRIVATE KEY" in raw and b"BEGIN PRIVATE KEY" not in raw
    again = make_core(path, Limits(master_key_file=master_file), catalog=False)
    sealed = again.catalog.certificates["TargetCert"].private_key
    assert certificates.matches(certificates.open_key(sealed, MASTER, "TargetCert"), info)
    assert _certificate(again, "TargetCert") == shown


def test_without_a_master_key_no_certificate_is_made_and_nothing_changes(
    core, snapshot, monkeypatch
):
    monkeypatch.delenv(certificates.MASTER_KEY_FILE, raising=False)
    monkeypatch.delenv(certificates.MASTER_KEY, raising=False)
    before = snapshot(core)
    with pytest.raises(SecurityError, match="no master key"):
        core.create(Certificate("TargetCert", owner="Target"))
    assert snapshot(core) == before


def test_a_broker_makes_its_own_identity_for_transport_security(secured):
    core = secured[0]
    core.create(Certificate("Identity", owner=BROKER, days=30))
    assert _certificate(core, "Identity")["has_private_key"] is True
    core.create(Grant("Trusted", BROKER, "Identity"))  # CONNECT, here for its own identity


def test_a_far_certificate_is_imported_without_a_private_key(core, far_pem):
    core.create(Certificate("FarCert", far_pem))
    shown = _certificate(core, "FarCert")
    assert shown["has_private_key"] is False and shown["certificate"] == far_pem


@pytest.mark.parametrize(
    "defn, error, says",
    [
        (Certificate("C"), InvalidDefinition, "give the PEM of someone else's certificate"),
        (Certificate("C", "not a pem"), InvalidDefinition, "certificate 'C': give a PEM"),
        (Certificate("C", owner="Nobody"), UnknownService, "'Nobody'; certificate 'C' names it"),
        (Certificate("C", owner="Target", days=0), InvalidDefinition, "0 to 36,500 days"),
        (Certificate("C", owner="Target", subject=7), InvalidDefinition, "are strings"),
        (RemoteServiceBinding("B", "Far", "NoCert"), UnknownCertificate, "binding 'B' names"),
        (Grant("G", "Nobody", "public"), UnknownService, "grant 'G' names it"),
        (Grant("G", "Target", "NoCert"), UnknownCertificate, "grant 'G' names it"),
        (Grant("G", BROKER, "public"), InvalidDefinition, "CONNECT goes to a broker's"),
        (Grant("G", BROKER, "NoCert"), UnknownCertificate, "grant 'G' names it"),
        (RemoteServiceBinding("B", "Far", "C", broker_instance="x"), InvalidDefinition, "not a"),
    ],
)
def test_bad_credentials_are_refused_by_name_and_change_nothing(
    secured, snapshot, defn, error, says
):
    core = secured[0]
    before = snapshot(core)
    with pytest.raises(error, match=says):
        core.create(defn)
    assert snapshot(core) == before


def test_a_private_key_given_in_the_clear_is_refused(core, far_pem, snapshot):
    clear = "-----BEGIN PRIVATE KEY-----\nMIIE...\n-----END PRIVATE KEY-----\n"
    before = snapshot(core)
    with pytest.raises(InvalidDefinition, match="never given in the clear"):
        core.create(Certificate("C", far_pem, owner="Target", private_key=clear))
    assert snapshot(core) == before


def test_a_binding_is_one_per_service_and_rotates_to_a_new_certificate(core, far_pem):
    newer = certificates.make("FarOrders", 60, 1.7e9)[0]
    core.create(Certificate("FarCert", far_pem))
    core.create(Certificate("FarCert2", newer))
    core.create(RemoteServiceBinding("ToFar", "FarOrders", "FarCert"))
    with pytest.raises(InvalidDefinition, match="already bound by 'ToFar'"):
        core.create(RemoteServiceBinding("ToFar2", "FarOrders", "FarCert2"))
    core.alter("remote_service_binding", "ToFar", {"certificate": "FarCert2"})
    assert core.catalog.remote_service_bindings["ToFar"].certificate == "FarCert2"
    core.drop("certificate", "FarCert")  # nothing names it any more


def test_what_a_binding_or_grant_names_cannot_be_dropped_under_it(secured, far_pem):
    core = secured[0]
    core.create(Certificate("FarCert", far_pem))
    core.create(Certificate("TargetCert", owner="Target"))
    core.create(RemoteServiceBinding("ToFar", "FarOrders", "FarCert"))
    core.create(Grant("FarMaySend", "Target", "FarCert"))
    with pytest.raises(InUse, match="FarMaySend, ToFar"):
        core.drop("certificate", "FarCert")
    with pytest.raises(InUse, match="FarMaySend, TargetCert"):
        core.drop("service", "Target")
    core.drop("grant", "FarMaySend")
    core.drop("remote_service_binding", "ToFar")
    core.drop("certificate", "FarCert")
    assert "FarCert" not in core.catalog.certificates


def test_a_local_broker_handle_makes_and_lists_certificates(tmp_path, master_file):
    from actors import Queue, Service

    with LocalBroker("creds", str(tmp_path / "b.db"), master_key_file=master_file) as b:
        b.create(Queue("Q"))
        b.create(Service("Orders", "Q"))
        b.create(Certificate("OrdersCert", owner="Orders", days=7))
        b.create(Grant("AnyoneMaySend", "Orders", "public"))
        kinds = {(k, r["name"]) for k, r in b.definitions()}
        assert {("certificate", "OrdersCert"), ("grant", "AnyoneMaySend")} <= kinds
        assert all("private_key" not in r for _, r in b.definitions())


def test_the_certificate_listing_says_which_are_valid_expired_or_not_yet_valid(far_pem):
    from actors.tools.certs import table

    info = certificates.read(far_pem)
    rec = {"name": "FarCert", "certificate": far_pem, "owner": None, "has_private_key": False}
    own = {**rec, "name": "Own", "owner": "Orders", "has_private_key": True}
    for now, state in [
        (info.not_before + 1, "valid"),
        (info.not_after + 1, "expired"),
        (info.not_before - 1, "not yet valid"),
    ]:
        header, far, mine = table([rec, own], now)
        assert header.split()[0] == "NAME" and far.startswith("FarCert")
        assert f"  {state}  " in far and "  public  " in far and "  private  " in mine
        assert info.fingerprint[:16] in far and "CN=FarOrders" in far
