"""Dialog security between brokers (seed 003), without Ray: in-process brokers on real stores
with the real transport (tests/unit/test_transport.py's network). A secured dialog's messages
cross only sealed; a forwarder carries them unread; refusals are events and typed Errors;
nothing is lost or doubled."""

from __future__ import annotations

import uuid

import msgpack
import pytest

from actors.calls.envelope import Begin, Send
from actors.core import Limits
from actors.errors import InvalidDefinition, SecurityError
from actors.model.catalog import ERROR
from actors.model.credentials import BROKER, Certificate, Grant, RemoteServiceBinding
from actors.model.dialogs import parse_error_body
from actors.security import certificates
from actors.transport.wire import SECURITY_REFUSED
from tests.fakes import FakeClock
from tests.unit.test_transport import (
    INIT,
    LATER,
    TARGET,
    Network,
    kinds,
    route,
    take,
)

SECRET = b"order 4711: 3 x secret widget"


@pytest.fixture
def master(tmp_path):
    path = tmp_path / "master.key"
    path.write_bytes(b"the operator's master key (32 b)")
    return Limits(master_key_file=str(path))


def pem(core, name):
    return core.catalog.certificates[name].certificate


def secure(a, b, grant=True, anonymous=False):
    """A's Init and B's Target with certificates of their own, each other's imported, B's
    service bound on A, and SEND on Target granted to Init's certificate."""
    if not anonymous:
        a.create(Certificate("InitCert", owner="Init", days=30))
        b.create(Certificate("InitCert", pem(a, "InitCert")))
    b.create(Certificate("TargetCert", owner="Target", days=30))
    a.create(Certificate("TargetCert", pem(b, "TargetCert")))
    a.create(RemoteServiceBinding("ToTarget", "Target", "TargetCert", anonymous=anonymous))
    if grant:
        b.create(Grant("InitMaySend", "Target", "public" if anonymous else "InitCert"))


class Wire:
    """Every call between brokers, as it crossed: (caller, callee, blob); `tamper` changes the
    next call's first sealed body once."""

    def __init__(self, net: Network) -> None:
        self.calls: list[tuple[str, str, bytes]] = []
        self.tamper = False
        wire = self

        class Peers:
            def __init__(self, caller: str) -> None:
                self.caller = caller

            async def deliver(self, broker: str, blob: bytes, timeout: float) -> bytes:
                from actors.errors import PeerUnreachable

                if broker not in net.couriers:
                    raise PeerUnreachable.not_running(broker)
                if wire.tamper:
                    wire.tamper = False
                    bundles = msgpack.unpackb(blob, raw=False)
                    sealed = bytearray(bundles[0][13][1])
                    sealed[-1] ^= 0x01
                    bundles[0][13][1] = bytes(sealed)
                    blob = msgpack.packb(bundles, use_bin_type=True)
                wire.calls.append((self.caller, broker, blob))
                return await net.couriers[broker].deliver(blob)

        net.peers = Peers  # type: ignore[method-assign]
        for name, core in net.cores.items():
            net.couriers[name] = core.transport.courier(Peers(name))

    def bundles(self) -> list[list]:
        return [b for _, _, blob in self.calls for b in msgpack.unpackb(blob, raw=False)]


@pytest.fixture
def pair(tmp_path, master):
    yield from two_brokers(tmp_path, master, master)


def two_brokers(tmp_path, limits_a, limits_b):
    """A (Init) and B (Target) on file stores, each routing to the other."""
    net = Network(FakeClock())
    a = net.add("A", INIT, limits=limits_a, path=str(tmp_path / "a.db"))
    b = net.add("B", TARGET, limits=limits_b, path=str(tmp_path / "b.db"))
    route(a, "routes", "ToTarget", "Target", "ray://B")
    route(b, "routes", "ToInit", "Init", "ray://A", a.broker_id)
    yield net, a, b
    net.close()


def begin(core, *bodies, **options):
    op = Begin("Init", "Target", "C", **options)  # encryption on unless said otherwise
    core.apply([op, Send(op.handle, "Req", list(bodies))])
    return op.handle


def test_a_secured_dialogs_messages_cross_sealed_and_arrive_in_order_once_both_ways(pair):
    net, a, b = pair
    secure(a, b)
    wire = Wire(net)
    h = begin(a, SECRET, b"m1")
    a.apply([Send(h, "Req", [b"m2"])])
    net.pump()
    got = take(b, "TargetQ")
    assert [m.body for m in got] == [SECRET, b"m1", b"m2"]
    b.apply([Send(got[0].conversation_handle, "Reply", [b"the secret answer"])])
    net.pump()
    net.later()  # nothing more crosses: every message arrived once
    assert [m.body for m in take(a, "InitQ")] == [b"the secret answer"]
    bundles = wire.bundles()
    assert bundles and all(bd[13] is not None for bd in bundles)  # every one sealed
    assert bundles[0][13][0] is not None  # the key offer rode with message 0
    assert all(bd[13][0] is None for bd in bundles[1:])
    assert all(set(bd[11]) == {b""} for bd in bundles)  # bodies travel only sealed
    on_the_wire = b"".join(blob for _, _, blob in wire.calls)
    assert SECRET not in on_the_wire and b"secret answer" not in on_the_wire


def via_forwarder(net, a, tmp_path, master):
    """Forwarder F, which A's dialogs to Target now go through to B."""
    f = net.add("F", limits=master, path=str(tmp_path / "f.db"), forwarding=True)
    a.drop_route("routes", "ToTarget")
    route(a, "routes", "ToTarget", "Target", "ray://F")
    route(f, "instance", "FwdTarget", "Target", "ray://B")
    return f


def test_a_forwarder_carries_a_secured_dialog_without_a_readable_body(pair, tmp_path, master):
    net, a, b = pair
    f = via_forwarder(net, a, tmp_path, master)
    route(f, "instance", "FwdInit", "Init", "ray://A", a.broker_id)
    route(b, "routes", "ToInit2", "Init", "ray://F", a.broker_id)
    b.drop_route("routes", "ToInit")
    secure(a, b)
    wire = Wire(net)
    h = begin(a, SECRET)
    net.pump()
    [msg] = take(b, "TargetQ")
    assert msg.body == SECRET and ("F", "B") in {(c, d) for c, d, _ in wire.calls}
    b.apply([Send(msg.conversation_handle, "Reply", [b"answer " + SECRET])])
    net.pump()
    assert [m.body for m in take(a, "InitQ")] == [b"answer " + SECRET]
    f.store.close()
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("f.db*"))
    assert raw and SECRET not in raw  # nothing of a body in the forwarder's files
    assert h


def test_with_encryption_on_and_no_binding_messages_wait_then_go_once_bound(pair):
    net, a, b = pair
    begin(a, SECRET)
    net.pump()
    [row] = a.transmission_view()
    assert "no remote service binding for service 'Target'" in row["transmission_status"]
    assert take(b, "TargetQ") == []
    secure(a, b)
    net.later()
    assert [m.body for m in take(b, "TargetQ")] == [SECRET]
    assert a.transmission_view() == []


def test_with_encryption_off_a_dialog_goes_in_the_clear_unless_bound(pair):
    net, a, b = pair
    wire = Wire(net)
    begin(a, SECRET, encryption=False)
    net.pump()
    assert [m.body for m in take(b, "TargetQ")] == [SECRET]
    assert SECRET in wire.calls[0][2]  # not configured: in the clear
    secure(a, b)
    begin(a, b"second " + SECRET, encryption=False)
    net.pump()
    assert [m.body for m in take(b, "TargetQ")] == [b"second " + SECRET]
    assert b"second " + SECRET not in wire.calls[-1][2]  # configured: sealed


def test_without_the_grant_the_dialog_is_refused_with_a_typed_error_and_an_event(pair):
    net, a, b = pair
    secure(a, b, grant=False)
    begin(a, SECRET)
    net.pump()
    assert take(b, "TargetQ") == [] and b.endpoints_view() == []
    [err] = take(a, "InitQ")
    assert err.message_type == ERROR
    code, why = parse_error_body(err.body)
    assert code == SECURITY_REFUSED and "'InitCert' is not granted SEND" in why
    assert "SecurityRefused" in kinds(b)
    b.create(Grant("InitMaySend", "Target", "InitCert"))  # a new dialog now goes
    begin(a, b"next")
    net.pump()
    assert [m.body for m in take(b, "TargetQ")] == [b"next"]


def test_a_grant_or_binding_dropped_after_dialogs_went_holds_the_next_dialog(pair):
    net, a, b = pair  # the keyring's answers kept since the first dialog went do not hold
    secure(a, b)
    begin(a, b"first")
    net.pump()
    assert [m.body for m in take(b, "TargetQ")] == [b"first"]
    b.drop("grant", "InitMaySend")
    begin(a, b"refused")
    net.pump()
    assert take(b, "TargetQ") == []
    [err] = take(a, "InitQ")
    assert "'InitCert' is not granted SEND" in parse_error_body(err.body)[1]
    a.drop("remote_service_binding", "ToTarget")
    held = begin(a, b"held")
    net.pump()
    assert take(b, "TargetQ") == []
    assert "no remote service binding" in a.transmission_view()[0]["transmission_status"]
    b.create(Grant("InitMaySend", "Target", "InitCert"))
    a.create(RemoteServiceBinding("ToTarget", "Target", "TargetCert"))
    net.later()
    got = take(b, "TargetQ")
    assert [(m.body, m.conversation_handle != held) for m in got] == [(b"held", True)]


def test_a_body_changed_in_flight_is_refused_and_the_original_resend_delivered_once(pair):
    net, a, b = pair
    secure(a, b)
    wire = Wire(net)
    wire.tamper = True
    begin(a, SECRET, b"m1")
    net.pump()
    assert take(b, "TargetQ") == []  # nothing of the changed bundle was taken
    assert any(k == "SecurityRefused" for k in kinds(b))
    net.later()  # the sender's retransmission of the original
    assert [m.body for m in take(b, "TargetQ")] == [SECRET, b"m1"]
    net.later()
    assert take(b, "TargetQ") == []


def test_dialogs_between_the_same_services_share_one_key_exchange(pair):
    """The RSA work once per pair of services: every dialog's offer carries the same exchange
    head, each its own session key."""
    net, a, b = pair
    secure(a, b)
    wire = Wire(net)
    for i in range(3):
        begin(a, b"order %d" % i)
    net.pump()
    assert sorted(m.body for m in take(b, "TargetQ")) == [b"order 0", b"order 1", b"order 2"]
    offers = [msgpack.unpackb(bd[13][0]) for bd in wire.bundles() if bd[13][0] is not None]
    assert len(offers) == 3 and len({o[1] for o in offers}) == 1
    assert len({o[2] for o in offers}) == 3


def test_a_replayed_bundle_delivers_nothing_twice_and_a_moved_body_is_refused(pair):
    net, a, b = pair
    secure(a, b)
    wire = Wire(net)
    h = begin(a, SECRET)
    a.apply([Send(h, "Req", [b"m1"])])
    net.pump()
    assert len(take(b, "TargetQ")) == 2
    first = wire.calls[0][2]
    net.deliver("A", "B", first)  # the same bundle again
    assert take(b, "TargetQ") == []
    # the first bundle's sealed bodies put in place of a later message's: they do not verify
    a.apply([Send(h, "Req", [b"m2"])])
    [out] = a.transport.dispatch()
    moved = msgpack.unpackb(out.blob(), raw=False)
    moved[0][13][1] = msgpack.unpackb(first, raw=False)[0][13][1]
    net.deliver("A", "B", msgpack.packb(moved, use_bin_type=True))
    assert take(b, "TargetQ") == []
    a.transport.release(out)
    net.later()
    assert [m.body for m in take(b, "TargetQ")] == [b"m2"]


def test_a_restarted_initiator_seals_with_the_key_it_stored(pair, tmp_path, master):
    net, a, b = pair
    secure(a, b)
    h = begin(a, SECRET)
    net.pump()
    a = net.restart("A", str(tmp_path / "a.db"), master)
    a.apply([Send(h, "Req", [b"after the restart"])])
    net.pump()
    assert [m.body for m in take(b, "TargetQ")] == [SECRET, b"after the restart"]
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("a.db*"))
    assert b"BEGIN PRIVATE KEY" not in raw


def test_an_expired_target_certificate_refuses_new_dialogs_and_holds_one_already_begun(pair):
    net, a, b = pair
    secure(a, b)
    waiting = begin(a, SECRET)  # begun while the certificate is valid; not sent yet
    net.clock.advance(31 * 86400)
    with pytest.raises(SecurityError, match=r"expired .*\(binding 'ToTarget'\)"):
        begin(a, b"new")
    assert [e["conversation_handle"] for e in a.endpoints_view()] == [waiting]  # nothing begun
    [event] = [e for e in a.events_view() if e["kind"] == "SecurityRefused"]
    assert "BEGIN DIALOG" in event["detail"] and "'Target'" in event["detail"]
    net.pump()
    [row] = a.transmission_view()  # the one begun before: it waits, saying why
    status = row["transmission_status"]
    assert row["conversation_handle"] == waiting
    assert "expired" in status and "binding 'ToTarget'" in status


def test_an_anonymous_binding_needs_no_initiator_certificate(pair):
    net, a, b = pair
    secure(a, b, anonymous=True)
    begin(a, SECRET)
    net.pump()
    assert [m.body for m in take(b, "TargetQ")] == [SECRET]


def test_a_rotated_certificate_serves_new_dialogs_while_secured_ones_continue(pair):
    net, a, b = pair
    secure(a, b)
    wire = Wire(net)
    old = begin(a, b"old 0")
    net.pump()
    # the target's successor certificate beside the old one; the initiator rebinds to it
    b.create(Certificate("TargetCert2", owner="Target", days=60))
    a.create(Certificate("TargetCert2", pem(b, "TargetCert2")))
    a.alter("remote_service_binding", "ToTarget", {"certificate": "TargetCert2"})
    new = begin(a, b"new 0")
    a.apply([Send(old, "Req", [b"old 1"])])
    net.pump()
    net.later()
    got = take(b, "TargetQ")
    by_dialog = {}
    for m in got:
        by_dialog.setdefault(m.conversation_id, []).append(m.body)
    assert sorted(by_dialog.values()) == [[b"new 0"], [b"old 0", b"old 1"]]
    # each dialog's key offer named the certificate bound when it began
    heads = [msgpack.unpackb(bd[13][0])[1] for bd in wire.bundles() if bd[13][0] is not None]
    offered = [msgpack.unpackb(head)[0] for head in heads]
    fingerprint = {
        n: certificates.read(pem(b, n)).fingerprint for n in ("TargetCert", "TargetCert2")
    }
    assert offered == [fingerprint["TargetCert"], fingerprint["TargetCert2"]]
    assert new in {e["conversation_handle"] for e in a.endpoints_view()}


def test_an_initiator_whose_certificate_expired_cannot_begin_a_secured_dialog(pair):
    net, a, b = pair
    secure(a, b)
    # the target's own certificate is renewed for longer; the initiator's is left to expire
    b.create(Certificate("TargetCert2", owner="Target", days=90))
    a.create(Certificate("TargetCert2", pem(b, "TargetCert2")))
    a.alter("remote_service_binding", "ToTarget", {"certificate": "TargetCert2"})
    net.clock.advance(31 * 86400)
    with pytest.raises(SecurityError, match="'Init' cannot sign the dialog's key offer.*expired"):
        begin(a, SECRET)
    assert a.endpoints_view() == [] and a.transmission_view() == []
    assert "SecurityRefused" in kinds(a) and b.endpoints_view() == []
    begin(a, b"off", encryption=False)  # encryption off: sealed whenever bound, so it
    net.pump()  # waits too, saying why
    [row] = a.transmission_view()
    assert "cannot sign" in row["transmission_status"] and "expired" in row["transmission_status"]


def test_a_service_on_two_brokers_is_bound_per_broker_and_each_opens_its_own(tmp_path, master):
    """Load balancing: Target on B1 and B2, each with its own certificate; A binds each one to
    its broker, and dialogs pinned to either arrive sealed and open there."""
    net = Network(FakeClock())
    a = net.add("A", INIT, limits=master, path=str(tmp_path / "a.db"))
    targets = [net.add(n, TARGET, limits=master, path=str(tmp_path / f"{n}.db"))
               for n in ("B1", "B2")]  # fmt: skip
    a.create(Certificate("InitCert", owner="Init", days=30))
    for t in targets:
        route(a, "routes", f"To{t.name}", "Target", f"ray://{t.name}", t.broker_id)
        route(t, "routes", "ToInit", "Init", "ray://A", a.broker_id)
        t.create(Certificate("TargetCert", owner="Target", days=30))
        t.create(Certificate("InitCert", pem(a, "InitCert")))
        t.create(Grant("InitMaySend", "Target", "InitCert"))
        a.create(Certificate(f"TargetOn{t.name}", pem(t, "TargetCert")))
        a.create(RemoteServiceBinding(f"Bind{t.name}", "Target", f"TargetOn{t.name}",
                                      broker_instance=t.broker_id.upper()))  # fmt: skip
    with pytest.raises(InvalidDefinition, match="already bound by 'BindB1'"):
        a.create(RemoteServiceBinding("Again", "Target", "TargetOnB2",
                                      broker_instance=targets[0].broker_id))  # fmt: skip
    wire = Wire(net)
    for i in range(6):
        begin(a, f"order {i}".encode())
    net.pump()
    got = [sorted(m.body for m in take(t, "TargetQ")) for t in targets]
    assert [len(g) for g in got] == [3, 3]
    assert sorted(got[0] + got[1]) == [f"order {i}".encode() for i in range(6)]
    assert all(bd[13] is not None for bd in wire.bundles())
    net.close()


# --- transport security --------------------------------------------------------------------


@pytest.fixture
def guarded(tmp_path, master):
    """A (Init) and B (Target); B takes calls only from brokers it trusts."""
    strict = Limits(master_key_file=master.master_key_file, transport_security=True)
    yield from two_brokers(tmp_path, master, strict)


def trust(frm, to):
    """`frm` gets an identity; `to` imports it and grants it CONNECT."""
    name = f"{frm.name}Identity"
    if name not in frm.catalog.certificates:
        frm.create(Certificate(name, owner=BROKER, days=30))
    to.create(Certificate(name, pem(frm, name)))
    to.create(Grant(f"{frm.name}MayConnect", BROKER, name))


def test_a_broker_that_trusts_no_one_takes_no_call_until_its_sender_is_granted_connect(guarded):
    net, a, b = guarded
    begin(a, b"m0", encryption=False)
    net.pump()
    assert take(b, "TargetQ") == []
    [row] = a.transmission_view()
    assert "takes calls only from brokers it trusts" in row["transmission_status"]
    assert "TransportRefused" in kinds(b)
    trust(a, b)
    net.later()
    assert [m.body for m in take(b, "TargetQ")] == [b"m0"]
    net.later()
    assert take(b, "TargetQ") == []  # once


def test_a_call_signed_by_a_broker_not_granted_or_for_another_broker_is_refused(guarded):
    net, a, b = guarded
    a.create(Certificate("AIdentity", owner=BROKER, days=30))
    b.create(Certificate("AIdentity", pem(a, "AIdentity")))  # known, but not granted
    begin(a, b"m0", encryption=False)
    net.pump()
    [row] = a.transmission_view()
    assert "not granted CONNECT" in row["transmission_status"]
    b.create(Grant("AMayConnect", BROKER, "AIdentity"))
    # a call A signed for broker C, replayed at B: refused, it names another broker
    net.clock.advance(LATER)
    [out] = a.transport.dispatch()
    for_c = a.transport.outbound.port.sign_call(out.blob(), "C")
    reply = net.deliver("A", "B", for_c)
    assert "signed for broker 'C'" in str(msgpack.unpackb(reply, raw=False))
    a.transport.release(out)
    net.later()
    assert [m.body for m in take(b, "TargetQ")] == [b"m0"]


def test_a_forwarder_is_the_hop_the_target_trusts(guarded, tmp_path, master):
    net, a, b = guarded
    f = via_forwarder(net, a, tmp_path, master)
    trust(a, b)  # the initiator alone is not enough: the call B gets comes from F
    begin(a, b"via F", encryption=False)
    net.pump()
    assert take(b, "TargetQ") == []
    trust(f, b)
    net.later()
    assert [m.body for m in take(b, "TargetQ")] == [b"via F"]


def test_a_router_whose_onward_dialog_is_refused_leaves_it_to_its_handler_and_pins_no_turn(
    tmp_path, master
):
    # the router replica begins the onward dialog at arrival (actors.core.conversations
    # route_first); refused there, nothing of it stays: the message waits for the handler
    from actors.ddr import RouterConfig
    from actors.model.catalog import ROUTER_HANDLER, Activation, Queue, Service

    net = Network(FakeClock())
    r = net.add("R", INIT, limits=master, path=str(tmp_path / "r.db"))
    b = net.add("B", TARGET, limits=master, path=str(tmp_path / "b.db"))
    cfg = RouterConfig("Router", ("Target",), "actors.ddr.classifiers:field", encryption=True)
    act = Activation(ROUTER_HANDLER, placement="internal", options=cfg.options())
    r.create(Queue("RouterQ", activation=act))
    r.create(Service("Router", "RouterQ", ["C"]))
    for name in ("T1", "T2"):  # round-robin over two brokers
        route(r, "routes", name, "Target", f"ray://{name}", str(uuid.uuid4()))
    b.create(Certificate("TargetCert", owner="Target", days=30))
    r.create(Certificate("TargetCert", pem(b, "TargetCert")))
    r.create(RemoteServiceBinding("ToTarget", "Target", "TargetCert"))
    net.clock.advance(31 * 86400)  # the target's certificate expired: secured dialogs refused

    op = Begin("Init", "Router", "C", encryption=False)
    r.apply([op, Send(op.handle, "Req", [b'{"region": "Target"}'])])

    assert r.depth("RouterQ")[0] == 1  # queued for the handler (whose Begin is refused too)
    assert r.state.turns.get("Target", 0) == 0  # the refused Begin pinned no broker
    assert [e for e in r.endpoints_view() if e["service"] == "Router" and e["is_initiator"]] == []
    net.close()
