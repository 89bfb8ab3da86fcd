"""Mirrored brokers on real Ray. The failover scenario needs several nodes, so it runs in a
subprocess (`mirror_check.py`, a `ray.cluster_utils.Cluster` of three nodes in its own temp dir)
and prints one `RESULT {json}` line, checked here. The bad states a mirrored broker refuses run
on the session's one-node Ray."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import uuid
from pathlib import Path

import psutil
import pytest
import ray

from actors import Certificate, Queue, Send, Service
from actors.errors import (
    InvalidArgument,
    LockNotHeld,
    MirrorCallerRefused,
    MirrorMismatch,
    MirrorPlacement,
    NotPrincipal,
    StoreError,
    UnknownBroker,
)
from actors.mirroring.pairkey import PairKey, new_key
from actors.remote.client import Broker
from actors.remote.discovery import brokers_in, mirrors_of
from actors.remote.mirrored import (
    MirroredBroker,
    Partner,
    failover,
    mirror_status,
    start_mirrored_broker,
    stop_mirrored_broker,
)
from actors.remote.trust import secure_dialogs
from actors.remote.witness import WitnessActor, witness_name
from actors.tools.cli import main
from actors.tools.mirror import summary
from tests.polling import process_gone, wait_until

from .conftest import in_own_process, script_result

SCRIPT = Path(__file__).with_name("mirror_check.py")


@pytest.mark.slow
def test_a_mirrored_broker_loses_its_principals_node_mid_stream_and_nothing_is_lost():
    run = in_own_process([str(SCRIPT)], timeout=400, quiet=True)
    r = script_result(run)
    # principal and mirror on two nodes, the witness on the head
    assert r["apart"] and r["witness_on_head"] and r["first_principal"] == "mm-a", r
    # the principal's node removed mid-stream: the mirror took over, in bounded time (how fast
    # is measured by `raybroker bench mirror`, alone on the machine, not asserted here: beside
    # the other pytest workers this run's figure is the machine's load as much as the broker's)
    assert r["principal_after_kill"] == "mm-b" and r["epoch_after_kill"] == 2, r
    assert r["failover_s"] < 30, r
    # the stream finished on the new principal: every message once, in order, per dialog
    assert r["sent"] == r["counted"] == r["expected"], r
    assert (r["lost"], r["doubled"], r["out_of_order"]) == (0, 0, 0), r
    assert r["dialogs_continued"] and r["audit_missed"] == 0, r
    # the new principal carried on the rest of what the old one held: the activated queue's
    # readers, the rows parked in the transmission queue, a conversation timer
    assert r["activation_counted"] == 20, r
    assert r["parked_before_late"] == 5 and r["late_delivered"] == 5, r
    assert r["timer_fired"], r
    # seed 001 across nodes: with its principal gone and the partner not claiming principal,
    # the front sent the partner nothing; after the operator's failover it followed
    assert r["no_claim_mirror_role"] == "mirror" and r["no_claim_refused_at_mirror"] == 0, r
    assert r["no_claim_then_followed"], r
    # the old principal came back as mirror, caught up, and an operator's failover moved the
    # principal back to it; both failovers are events
    assert r["principal_after_manual"] == "mm-a", r
    assert r["final"] == {"principal": "mm-a", "epoch": 3, "failovers": 2, "synchronized": True,
                          "lag": 0}, r  # fmt: skip
    assert r["events"].count("Failover") == 2, r
    assert run.returncode == 0 and r["passed"], r


@pytest.fixture
def mirrored(ray_session, tmp_path):
    names: list[str] = []

    def start(name: str | None = None, **kw):
        name = name or f"mir-{uuid.uuid4().hex[:8]}"
        a = Partner(f"{name}-a", str(tmp_path / f"{name}-a.sqlite"))
        b = Partner(f"{name}-b", str(tmp_path / f"{name}-b.sqlite"))
        handle = start_mirrored_broker(name, a, b, **kw)
        names.append(name)
        return name, handle

    yield start
    for name in dict.fromkeys(names):
        with contextlib.suppress(UnknownBroker):  # a test may have stopped it
            stop_mirrored_broker(name)


def test_two_partners_on_one_node_are_refused_unless_forced(mirrored):
    with pytest.raises(MirrorPlacement, match="both run on node"):
        mirrored()
    name, handle = mirrored(force=True)
    handle.create(Queue("Q"))
    handle.create(Service("S", "Q"))
    status = mirror_status(name)
    assert status["synchronized"] and status["principal_state"]["lag_transactions"] == 0
    assert {p["role"] for p in status["partners"].values()} == {"principal", "mirror"}
    handle.stop()  # the whole mirrored broker, not only its principal
    wait_until(lambda: _gone(f"{name}-a") and _gone(f"{name}-b"), 30, "both partners stopped")
    wait_until(lambda: _gone(f"{name}.witness"), 30, "the witness stopped")
    name, handle = mirrored(name, force=True)  # started again on the same stores and record
    assert handle.queues()["Q"]["depth"] == 0 and mirror_status(name)["epoch"] == 1
    lines = summary(status)  # what `raybroker mirror status` prints
    assert lines[0].startswith(f"mirrored broker {name}: epoch 1, synchronized, 0 failover")
    assert f"{name}-a: principal (synchronized, mirror lag 0 transactions" in lines[1]
    assert "ships: direct channel" in lines[1]  # not through Ray's object store
    assert f"{name}-b: mirror (in step" in lines[2]


def test_the_command_line_shows_the_partners_and_fails_over(mirrored, capsys):
    name, handle = mirrored(force=True)
    assert main(["mirror", "status", name]) == 0
    out = capsys.readouterr().out
    assert f"mirrored broker {name}: epoch 1, synchronized" in out
    held = re.search(r"holds through (\d+), applied through (\d+)", out)  # the mirror's line
    assert held and int(held[1]) > 0 and int(held[2]) <= int(held[1])
    assert main(["mirror", "failover", name]) == 0
    assert f"{name}-b is now principal of {name} (epoch 2)" in capsys.readouterr().out
    handle.create(Queue("AfterFailover"))  # the handle follows the new principal
    assert handle.name == f"{name}-b"
    kinds = [e["kind"] for e in handle.events()]
    assert "Failover" in kinds  # failovers are events of the broker
    wait_until(lambda: mirror_status(name)["synchronized"], 60, "the old principal in step")
    assert main(["mirror", "failover", "no-such-broker"]) == 1  # a clear error, not a trace


def test_a_write_sent_to_the_mirror_is_refused_naming_the_principal(mirrored):
    name, handle = mirrored(force=True)
    mirror = mirror_status(name)["mirror"]
    direct = Broker(ray.get_actor(mirror, namespace="raybroker"), mirror)
    with pytest.raises(NotPrincipal, match=f"send it to '{name}-a'"):
        direct.create(Queue("Q"))


def test_each_partners_info_names_the_process_it_runs_in(mirrored):
    # `bench mirror` reads both partners' CPU by these
    name, handle = mirrored(force=True)
    roles = mirror_status(name)
    pids = {
        role: ray.get(ray.get_actor(roles[role], namespace="raybroker").info.remote())["pid"]
        for role in ("principal", "mirror")
    }
    assert pids["principal"] == handle.info()["pid"]
    assert pids["mirror"] != pids["principal"] and psutil.pid_exists(pids["mirror"])


def test_calls_answered_promptly_do_not_look_up_the_witness(mirrored, monkeypatch):
    """The handle asks the witness where the principal is only for a call that waits (a lookup
    is a round trip to Ray's control store, which every call paid before its answer)."""
    name, handle = mirrored(force=True)
    handle.create(Queue("Q"))
    handle.create(Service("S", "Q"))
    looked_up: list[str] = []
    real = ray.get_actor

    def counted(actor_name: str, *args, **kwargs):
        looked_up.append(actor_name)
        return real(actor_name, *args, **kwargs)

    monkeypatch.setattr(ray, "get_actor", counted)

    async def calls() -> None:
        for _ in range(20):
            await handle.aio.receive("Q", max_groups=1, wait=0.0)

    asyncio.run(calls())
    assert [n for n in looked_up if n == witness_name(name)] == []


def test_a_mirror_whose_store_holds_another_broker_is_refused(mirrored, make_broker, tmp_path):
    other = make_broker(path=str(tmp_path / "taken-b.sqlite"))
    other.create(Queue("Elsewhere"))
    other.stop()
    a = Partner("taken-a", str(tmp_path / "taken-a.sqlite"))
    b = Partner("taken-b", str(tmp_path / "taken-b.sqlite"))
    with pytest.raises(MirrorMismatch, match="holds broker"):
        start_mirrored_broker("taken", a, b, force=True)


def test_seed_001_a_sender_whose_principal_is_unreachable_sends_nothing_to_a_partner_that_does_not_claim_principal(  # noqa: E501
    mirrored, make_broker
):
    # the mirror would take over only after 600 s: it stays mirror while the principal is gone
    name, handle = mirrored(force=True, failover_after_s=600)
    handle.create(Queue("SQ"))
    handle.create(Service("S", "SQ", ["DEFAULT"]))
    front = make_broker()
    front.create(Queue("FQ"))
    front.create(Service("F", "FQ"))
    front.create_route("ToS", "S", handle.info()["broker_id"], f"ray://{name}-a", f"ray://{name}-b")
    h = front.begin_dialog("F", "S", encryption=False)
    front.send(h, "DEFAULT", b"1")
    wait_until(
        lambda: handle.queues()["SQ"]["depth"] == 1, 30, "the first message at the principal"
    )

    pid = handle.info()["pid"]
    ray.kill(ray.get_actor(f"{name}-a", namespace="raybroker"), no_restart=True)
    # ray.kill returns before the process is gone, and the front's open channel to it would
    # still take a send until then
    wait_until(lambda: process_gone(pid), 30, "the principal's process to be gone")
    front.send(h, "DEFAULT", b"2")

    def waiting_for_a_principal() -> bool:
        rows = front.transmission_queue()
        row = rows[0] if rows else {}
        return "claim" in row.get("transmission_status", "") and row["attempts"] >= 2

    wait_until(waiting_for_a_principal, 30, "the sender to find no principal, twice")
    mirror = mirror_status(name)["partners"][f"{name}-b"]
    assert mirror["role"] == "mirror" and mirror["refused_not_principal"] == 0  # sent nothing

    failover(name)  # the operator's: now the partner claims principal, and the sender follows
    wait_until(lambda: not front.transmission_queue(), 30, "the message sent to the new principal")
    after = MirroredBroker(name)
    assert after.name == f"{name}-b"
    [group] = after.receive("SQ", wait=5)
    assert [m.body for m in group.messages] == [b"1", b"2"]  # once each, in order
    after.commit(group)


def test_the_principals_process_dies_mid_stream_and_every_answered_send_is_kept_once(mirrored):
    name, mm = mirrored(force=True)
    mm.create(Queue("Q"))
    mm.create(Service("S", "Q", ["DEFAULT"]))
    h = mm.begin_dialog("S", "S")
    first = mm.name
    for i in range(60):
        if i == 20:  # the principal's process dies (Ray restarts it; the mirror may take over)
            ray.kill(ray.get_actor(first, namespace="raybroker"), no_restart=False)
        mm.send(h, "DEFAULT", b"%d" % i)  # answered only once mirrored; retried with its id
    bodies: list[bytes] = []
    while len(bodies) < 60:
        groups = mm.receive("Q", wait=5)
        assert groups, f"only {len(bodies)} of 60 came back"
        try:
            mm.commit(groups)
        except LockNotHeld:  # a failover since the receive: its locks went with the old
            continue  # principal's memory, and the messages come back to be received again
        bodies += [m.body for g in groups for m in g.messages]
    assert bodies == [b"%d" % i for i in range(60)]  # none lost, doubled or out of order
    wait_until(lambda: mirror_status(name)["synchronized"], 60, "both partners in step again")
    status = mirror_status(name)
    assert {p["role"] for p in status["partners"].values()} == {"principal", "mirror"}


@pytest.mark.slow
def test_a_secured_dialog_to_a_mirrored_broker_goes_on_sealed_after_failover(
    mirrored, make_broker, tmp_path
):
    """The mirror holds the dialog's session key (sealed, as the principal stored it) and the
    service's certificate: after the principal dies it opens the rest of the dialog and seals
    its reply; the stores hold private keys only sealed under the master key."""
    key = tmp_path / "master.key"
    key.write_bytes(b"one master key for the whole pair")
    limits = {"master_key_file": str(key)}
    name, mm = mirrored(force=True, limits=limits)
    mm.create(Queue("SQ"))
    mm.create(Service("S", "SQ", ["DEFAULT"]))
    front = make_broker(limits=limits)
    front.create(Queue("FQ"))
    front.create(Service("F", "FQ"))
    front.create_route("ToS", "S", mm.info()["broker_id"], f"ray://{name}-a", f"ray://{name}-b")
    mm.create_route("ToF", "F", front.info()["broker_id"], f"ray://{front.name}")
    mm.create(Certificate("SCert", owner="S", days=30))
    front.create(Certificate("FCert", owner="F", days=30))
    secure_dialogs(front, "F", mm, "S")
    h = front.begin_dialog("F", "S")
    for i in range(10):
        front.send(h, "DEFAULT", b"%d" % i)
    wait_until(lambda: mm.queues()["SQ"]["depth"] == 10, 30, "the first ten at the principal")
    first = mm.name
    # the console lists the mirrored broker once, by its name, with the witness's record
    found = brokers_in("raybroker", {name, f"{name}-a", f"{name}-b"})
    assert list(found) == [name] and mirrors_of(found)[name]["principal"] == first
    pid = mm.info()["pid"]
    ray.kill(ray.get_actor(first, namespace="raybroker"), no_restart=True)
    # ray.kill returns before the process is gone; until then it still answers sends
    wait_until(lambda: process_gone(pid), 30, "the principal's process to be gone")
    for i in range(10, 20):
        front.send(h, "DEFAULT", b"%d" % i)
    after = mm  # the handle follows the partner that takes over
    bodies: list[bytes] = []

    def all_there() -> bool:
        for g in after.receive("SQ", wait=1):
            target = g.messages[0].conversation_handle
            receipt = Send(target, "DEFAULT", b"receipt %d" % (len(bodies) + len(g.messages)))
            try:
                after.commit(g, ops=[receipt])
            except LockNotHeld:  # taken at the killed principal in its last moment (its
                continue  # kill takes effect a little later): its lock went with it
            bodies.extend(m.body for m in g.messages)
        return len(bodies) >= 20

    wait_until(all_there, 60, "all twenty at the partner that took over")
    assert after.name != first
    assert bodies == [b"%d" % i for i in range(20)]  # none lost, doubled or out of order
    assert [e["secured"] for e in after.endpoints()] == [True]
    wait_until(lambda: front.receive("FQ", wait=1), 30, "a receipt, sealed by the new principal")
    files = b"".join(p.read_bytes() for p in tmp_path.glob(f"{name}-*.sqlite*"))
    assert b"BEGIN PRIVATE KEY" not in files and b"BEGIN ENCRYPTED PRIVATE KEY" in files


@pytest.mark.slow
def test_bench_mirror_writes_the_report_with_the_ratio_and_the_failover_time(tmp_path):
    # its own three-node cluster, so in a process of its own (this one has the session's Ray)
    path = tmp_path / "mirror.json"
    args = ["-m", "actors.tools.cli", "bench", "mirror", "--quick", "--messages", "3000"]
    args += ["--repeats", "3"]
    run = in_own_process([*args, "--json", str(path)], timeout=400)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(path.read_text())
    assert report["scenario"] == "mirror"
    variants = [r["variant"] for r in report["rows"]]
    assert variants[:2] == ["unmirrored: send, receive+commit", "mirrored: send, receive+commit"]
    for row in report["rows"][:2]:
        assert (row["lost"], row["doubled"], row["out_of_order"]) == (0, 0, 0), row
        # three measured runs, the row their median (--quick: no warm-up)
        assert len(row["runs"]) == 3 and row["messages_per_s"] == sorted(row["runs"])[1], row
        assert "median of 3 runs" in row["notes"], row
        # the CPU of the run's processes, the broker's own (both partners') apart (a run this
        # short can take less than the clock's tick of 10 ms of a process's CPU)
        assert 0 <= row["server_cpu_s_per_1k"] <= row["cpu_s_per_1k"], row
    unmirrored, mirrored = report["rows"][:2]
    assert re.search(r"CPU a message: broker [\d.]+ µs, driver [\d.]+ µs", unmirrored["notes"])
    assert re.search(
        r"CPU a message: principal [\d.]+ µs, mirror [\d.]+ µs, driver [\d.]+ µs",
        mirrored["notes"],
    )
    assert report["params"]["repeats"] == 3 and "warm-up" not in run.stdout
    assert "mirrored: run 3 of 3" in run.stdout
    assert report["params"]["ratio"] > 0 and 0 < report["params"]["failover_s"] < 30
    # failovers the mirror made on its own during the runs (a busy principal) are counted
    during = report["params"]["failovers_during_runs"]
    assert f"failovers during the runs: {during}" in report["rows"][2]["notes"]


def test_a_witness_record_that_cannot_be_written_or_other_partners_are_refused(
    ray_session, tmp_path
):
    a = Partner("wit-a", str(tmp_path / "wit-a.sqlite"))
    b = Partner("wit-b", str(tmp_path / "wit-b.sqlite"))
    nowhere = str(tmp_path / "no-such-dir" / "w.json")
    with pytest.raises(StoreError, match="witness_path"):
        start_mirrored_broker("wit", a, b, force=True, witness_path=nowhere)
    record = str(tmp_path / "w.json")
    # kept: a broker that is not detached lives while its starter's handle does
    running = start_mirrored_broker("wit", a, b, force=True, witness_path=record)
    try:
        with pytest.raises(InvalidArgument, match="already runs with store"):
            start_mirrored_broker(
                "wit", a, Partner("wit-b", str(tmp_path / "elsewhere.sqlite")), force=True,
                witness_path=record,
            )  # fmt: skip
    finally:
        stop_mirrored_broker("wit")
        del running
    wait_until(lambda: _gone("wit.witness"), 30, "the witness's name to be free")
    c = Partner("wit-c", str(tmp_path / "wit-c.sqlite"))
    with pytest.raises(MirrorMismatch, match="has partners 'wit-a' and 'wit-b'"):
        start_mirrored_broker("wit", a, c, force=True, witness_path=record)


def test_calls_between_partners_from_anyone_else_are_refused_and_change_nothing(mirrored):
    """The witness's and the mirror's calls that change roles or the mirror's store, made by a Ray
    client that does not hold this start's key (here the driver, with no key and with the key of
    another start under the same names), are refused; the pair carries on in step."""
    name, handle = mirrored(force=True)
    handle.create(Queue("Kept"))
    wait_until(lambda: mirror_status(name)["principal_state"]["lag_transactions"] == 0, 30,
               "the mirror in step")  # fmt: skip
    before = mirror_status(name)
    principal, mirror, epoch = before["principal"], before["mirror"], before["epoch"]
    held = before["partners"][mirror]["seq"]
    witness = ray.get_actor(f"{name}.witness", namespace="raybroker")
    partner = ray.get_actor(mirror, namespace="raybroker")
    other_start = PairKey(name, new_key(), (principal, mirror))
    # no proof, a made-up one, and the right proof for each call but of another start's key
    for prove in (lambda c, m: b"", lambda c, m: bytes(32), other_start.prove):
        calls = {
            "set_synchronized": witness.set_synchronized.remote(
                principal, epoch, False, prove(principal, "set_synchronized")
            ),
            "promote": witness.promote.remote(
                mirror, epoch, True, "forced", prove(mirror, "promote")
            ),
            "held": partner.held.remote(principal, prove(principal, "held"), epoch, "line"),
            "apply": partner.apply.remote(principal, prove(principal, "apply"), epoch, "line", []),
            "rebuild": partner.rebuild.remote(
                principal, prove(principal, "rebuild"), epoch, "line", held, [b"junk"], "id"
            ),
        }
        for method, ref in calls.items():
            with pytest.raises(MirrorCallerRefused, match=f"{method} refused") as err:
                ray.get(ref)
            assert err.value.caller in (principal, mirror)
    after = mirror_status(name)
    assert (after["principal"], after["epoch"], after["synchronized"]) == (principal, epoch, True)
    assert after["partners"][mirror]["state"] == "in step"
    handle.create(Service("StillMirrored", "Kept"))  # the pair goes on shipping as before
    wait_until(lambda: mirror_status(name)["partners"][mirror]["seq"] > held, 30, "the next ship")
    assert mirror_status(name)["synchronized"] and "Kept" in handle.queues()


def test_a_start_that_finds_only_part_of_a_mirrored_broker_running_is_refused(mirrored, tmp_path):
    name, handle = mirrored(force=True)
    ray.kill(ray.get_actor(f"{name}-b", namespace="raybroker"), no_restart=True)
    wait_until(lambda: _gone(f"{name}-b"), 30, "the partner stopped")
    a = Partner(f"{name}-a", str(tmp_path / f"{name}-a.sqlite"))
    b = Partner(f"{name}-b", str(tmp_path / f"{name}-b.sqlite"))
    with pytest.raises(
        MirrorMismatch, match=r"runs only in part \('mir-\w+\.witness', 'mir-\w+-a'"
    ):
        start_mirrored_broker(name, a, b, force=True)
    assert _gone(f"{name}-b")  # nothing was started


def test_a_witness_changes_its_record_only_once_the_change_is_on_disk(ray_session, tmp_path):
    path = tmp_path / "w.json"
    key = PairKey("wd", new_key(), ("wd-a", "wd-b"))
    witness = ray.remote(WitnessActor).remote("wd", "wd-a", "wd-b", str(path), "raybroker", key)
    synced, promoted = key.prove("wd-a", "set_synchronized"), key.prove("wd-b", "promote")
    ray.get(witness.set_synchronized.remote("wd-a", 1, True, synced))
    before = ray.get(witness.get.remote())
    assert before["synchronized"] and json.loads(path.read_text()) == before
    blocker = tmp_path / "w.json.tmp"  # where the next record is written first: now a directory
    blocker.mkdir()
    (blocker / "in-the-way").write_text("")
    for _ in range(2):  # a retry fails too: it does not find the change already made in memory
        with pytest.raises(StoreError, match="cannot write: Is a directory"):
            ray.get(witness.set_synchronized.remote("wd-a", 1, False, synced))
        assert ray.get(witness.get.remote()) == before
    with pytest.raises(StoreError, match="cannot write: Is a directory"):
        ray.get(witness.promote.remote("wd-b", 1, True, "an operator's failover", promoted))
    assert ray.get(witness.get.remote()) == before  # no epoch handed out
    assert json.loads(path.read_text()) == before
    # a witness restarted from its file says what the running one said
    ray.kill(witness)
    again = ray.remote(WitnessActor).remote("wd", "wd-a", "wd-b", str(path), "raybroker", key)
    assert ray.get(again.get.remote()) == before
    # once the file can be written, each change is on disk when it is answered
    (blocker / "in-the-way").unlink()
    blocker.rmdir()
    after = ray.get(again.promote.remote("wd-b", 1, True, "an operator's failover", promoted))
    assert after["principal"] == "wd-b" and after["epoch"] == 2
    assert json.loads(path.read_text()) == after
    ray.kill(again)


def _gone(actor: str) -> bool:
    try:
        ray.get_actor(actor, namespace="raybroker")
    except ValueError:
        return True
    return False
