"""`raybroker cert create|list|export` against brokers on the session's Ray: a service's key pair
made inside its broker (the private key sealed under the master key, never shown), its public
certificate exported and imported by another broker, and the refusals a user can act on."""

from __future__ import annotations

import pytest

from actors import Grant, Queue, RemoteServiceBinding, Service
from actors.security import certificates
from actors.tools.cli import main


@pytest.fixture
def pair(make_broker, tmp_path):
    key = tmp_path / "master.key"
    key.write_bytes(b"the operator's master key, 32 b.")
    limits = {"master_key_file": str(key)}
    target = make_broker(limits=limits)
    initiator = make_broker(limits=limits)
    for b in (target, initiator):
        b.create(Queue("Q"))
    target.create(Service("Orders", "Q", ["DEFAULT"]))
    initiator.create(Service("Shop", "Q"))
    return target, initiator


def test_a_certificate_made_exported_and_imported_by_the_command_line(pair, tmp_path, capsys):
    target, initiator = pair
    assert main(["cert", "create", target.name, "OrdersCert", "--owner", "Orders",
                 "--days", "90"]) == 0  # fmt: skip
    made = capsys.readouterr().out
    assert "OrdersCert" in made and "CN=Orders" in made and "private" in made and "valid" in made

    pem_file = tmp_path / "orders.pem"
    assert main(["cert", "export", target.name, "OrdersCert", "--out", str(pem_file)]) == 0
    pem = pem_file.read_text()
    assert "BEGIN CERTIFICATE" in pem and "PRIVATE KEY" not in pem
    assert certificates.read(pem).subject == "CN=Orders"

    assert main(["cert", "create", initiator.name, "OrdersCert", "--from", str(pem_file)]) == 0
    capsys.readouterr()
    initiator.create(RemoteServiceBinding("ToOrders", "Orders", "OrdersCert"))
    assert main(["cert", "list", initiator.name]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0].split()[:3] == ["NAME", "OWNER", "SUBJECT"]
    [row] = [line for line in listed[1:] if line.startswith("OrdersCert")]
    assert "public" in row and "valid" in row and certificates.read(pem).fingerprint[:16] in row
    # the target's definitions show the certificate, never its sealed key
    target.create(Grant("AnyoneMaySend", "Orders", "public"))
    records = [r for k, r in target.definitions() if k == "certificate"]
    assert records[0]["has_private_key"] and "private_key" not in records[0]


def test_the_command_line_names_what_is_wrong(pair, tmp_path, capsys):
    target, _ = pair
    assert main(["cert", "export", target.name, "Nope"]) == 1
    assert f"broker {target.name!r} has no certificate 'Nope'" in capsys.readouterr().err
    assert main(["cert", "create", target.name, "X", "--owner", "NoSuchService"]) == 1
    assert "UnknownService" in capsys.readouterr().err
    assert main(["cert", "create", target.name, "X", "--from", str(tmp_path / "none.pem")]) == 2
    assert "cannot read" in capsys.readouterr().err
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    assert main(["cert", "create", target.name, "X", "--from", str(bad)]) == 1
    assert "InvalidDefinition" in capsys.readouterr().err
    assert [r for k, r in target.definitions() if k == "certificate"] == []


def test_a_broker_without_a_master_key_makes_no_certificate(make_broker, capsys):
    b = make_broker()
    b.create(Queue("Q"))
    b.create(Service("Orders", "Q"))
    assert main(["cert", "create", b.name, "OrdersCert", "--owner", "Orders"]) == 1
    err = capsys.readouterr().err
    assert "SecurityError" in err and "no master key" in err and "master_key_file" in err
