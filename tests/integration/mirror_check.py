"""A mirrored broker loses its principal's node mid-stream and nothing is lost: run as a script.

A Ray cluster of three nodes on this machine (`ray.cluster_utils.Cluster`, in its own temp dir):
the head (the witness, and a plain front broker mm-front), node A (`zone_a`) and node B
(`zone_b`). The mirrored broker mm has partner mm-a on A (the first principal) and mm-b on B, each
with its own store file. mm-front begins dialogs to service Store on mm through a route whose
`address` is the mirror mm-b and `mirror_address` the principal mm-a (seed 001: the sender must
ask both and send to the principal only), and sends in rounds while a reader here receives at mm
through a `MirroredBroker` handle, counting each message into its group's state in the same
commit. Mid-stream node A is removed (its processes killed); mm-b becomes principal, the route
and the reader follow it, and the stream finishes. A probe measures the failover time: from the
node's removal to the first write the new principal accepts. Then a new `zone_a` node is added:
Ray restarts mm-a there, it rejoins as mirror and is rebuilt; an operator's failover moves the
principal back to it, and a last round goes through. Last, seed 001 across nodes: a second
mirrored broker loses its principal while its mirror does not claim principal; the front sends
that partner nothing until an operator's failover makes it principal.

Prints one line `RESULT {json}` and exits 0 when every message arrived exactly once and in order,
and the partners' roles ended as expected; else 1.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from typing import Any

import ray
from multinode_check import Reader, counted  # a script beside this one (run from its folder)
from ray.cluster_utils import Cluster
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors import Activation, Begin, Queue, Send, Service, Timer
from actors.remote.factory import start_broker
from actors.remote.mirrored import (
    MirroredBroker,
    Partner,
    failover,
    mirror_status,
    start_mirrored_broker,
)
from actors.remote.runtime import local_cluster
from tests.polling import (  # the project's root is on the path (in_own_process)
    process_gone,
    wait_until,
)

DIALOGS = 20
ROUNDS = 40
KILL_AT = ROUNDS // 3
RESUME_AT = 2 * ROUNDS // 3


def scenario(root: str, result: dict[str, Any]) -> None:
    t0 = time.monotonic()
    cluster = local_cluster()
    try:
        node_a = cluster.add_node(num_cpus=1, resources={"zone_a": 1})
        cluster.add_node(num_cpus=1, resources={"zone_b": 1})
        cluster.wait_for_nodes()
        ray.init(
            address=cluster.address,
            logging_level=logging.ERROR,
            log_to_driver=os.environ.get("RAYBROKER_QUIET") != "1",
        )
        result["cluster_up_s"] = round(time.monotonic() - t0, 1)
        stream(root, result, cluster, node_a)
    finally:
        ray.shutdown()
        cluster.shutdown()


def setup(root: str) -> tuple[Any, MirroredBroker]:
    head = ray.get_runtime_context().get_node_id()
    front = start_broker(
        "mm-front",
        os.path.join(root, "front.sqlite"),
        scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False),
    )
    mm = start_mirrored_broker(
        "mm",
        Partner("mm-a", os.path.join(root, "a.sqlite"), {"resources": {"zone_a": 0.01}}),
        Partner("mm-b", os.path.join(root, "b.sqlite"), {"resources": {"zone_b": 0.01}}),
    )
    for d in (Queue("StoreQueue"), Queue("ProbeQueue"), Service("Store", "StoreQueue", ["DEFAULT"]),
              Service("Probe", "ProbeQueue", ["DEFAULT"])):  # fmt: skip
        mm.create(d)
    front.create(Queue("ShopQueue"))
    front.create(Service("Shop", "ShopQueue"))
    # seed 001: the mirror first, so the sender has to find out which partner is principal
    front.create_route("ToStore", "Store", mm.info()["broker_id"], "ray://mm-b", "ray://mm-a")
    mm.create_route("ToShop", "Shop", front.info()["broker_id"], "ray://mm-front")
    return front, mm


def before_kill(mm: MirroredBroker) -> None:
    """What a failover must carry over besides the stream: an activated queue, rows parked in
    the transmission queue (for a broker not started yet), a conversation timer."""
    act = Activation(
        "actors.activation.handlers:count_in_order", placement="internal", idle_timeout=1
    )
    mm.create(Queue("ActQueue", activation=act))
    mm.create(Service("Act", "ActQueue", ["DEFAULT"]))
    _activated(mm, 10)
    mm.create_route("ToLate", "Late", None, "ray://mm-late")
    late = Begin("Probe", "Late", encryption=False)
    mm.apply([late, Send(late.handle, "DEFAULT", [b"%d" % i for i in range(5)])])
    timed = Begin("Probe", "Probe")
    mm.apply([timed, Timer(timed.handle, 6.0)])  # fires after the failover


def _activated(mm: MirroredBroker, n: int) -> None:
    op = Begin("Probe", "Act")
    mm.apply([op, Send(op.handle, "DEFAULT", [b"x"] * n)])


def _act_count(mm: MirroredBroker) -> int:
    return sum(json.loads(g["state"])["count"] for g in mm.groups("ActQueue") if g["state"])


def after_failover(mm: MirroredBroker, root: str, result: dict[str, Any]) -> None:
    """The new principal carries on what the old one held."""
    wait_until(lambda: _act_count(mm) >= 10, 60, "the activated queue's first messages read")
    _activated(mm, 10)  # the new principal's readers take these
    wait_until(lambda: _act_count(mm) >= 20, 60, "the activated queue's readers on the new one")
    result["activation_counted"] = _act_count(mm)
    result["parked_before_late"] = len(mm.transmission_queue())
    late = start_broker("mm-late", os.path.join(root, "late.sqlite"))
    late.create(Queue("LateQueue"))
    late.create(Service("Late", "LateQueue", ["DEFAULT"]))
    wait_until(lambda: late.queues()["LateQueue"]["depth"] >= 5, 60, "parked rows delivered")
    result["late_delivered"] = late.queues()["LateQueue"]["depth"]

    def fired() -> bool:
        return any(m["message_type"] == "DialogTimer" for m in mm.queue("ProbeQueue"))

    wait_until(fired, 60, "the conversation timer to fire on the new principal")
    result["timer_fired"] = True


def stream(root: str, result: dict[str, Any], cluster: Cluster, node_a: Any) -> None:
    front, mm = setup(root)
    status = mirror_status("mm")
    result["first_principal"] = status["principal"]
    nodes = {p["node"] for p in status["partners"].values()}
    result["apart"] = len(nodes) == 2
    witness = ray.get_actor("mm.witness", namespace="raybroker")
    result["witness_on_head"] = (
        ray.get(witness.node.remote()) == ray.get_runtime_context().get_node_id()
    )
    handles = front.apply([Begin("Shop", "Store", encryption=False) for _ in range(DIALOGS)])[
        "handles"
    ]
    reader = Reader(MirroredBroker("mm"))
    reader.start()
    rounds_sent = 0
    go, killed = threading.Event(), threading.Event()

    def send_stream() -> None:
        nonlocal rounds_sent
        for n in range(ROUNDS):
            if n == KILL_AT:
                go.wait()
            if n == RESUME_AT:
                killed.wait()
            body = json.dumps({"n": n}).encode()
            front.apply([Send(h, "DEFAULT", body) for h in handles])
            rounds_sent = n + 1

    sender = threading.Thread(target=send_stream, daemon=True)
    sender.start()
    wait_until(lambda: rounds_sent >= KILL_AT and reader.committed > 0, 60, "a third received")
    go.set()
    wait_until(lambda: rounds_sent >= KILL_AT + 2, 60, "the stream to go on")
    before_kill(mm)
    result["received_before_kill"] = reader.committed

    probe = MirroredBroker("mm")
    t_kill, t_kill_wall = time.monotonic(), time.time()
    cluster.remove_node(node_a, allow_graceful=False)  # the principal's node crashes
    killed.set()

    def accepted_by_the_new_principal() -> bool:  # not by the dying old one
        op = Begin("Probe", "Probe")
        probe.apply([op, Send(op.handle, "DEFAULT", b"first after the failover")])
        return probe.name == "mm-b"

    wait_until(accepted_by_the_new_principal, 60, "a write accepted by the new principal")
    result["failover_s"] = round(time.monotonic() - t_kill, 2)
    status = mirror_status("mm")
    result["principal_after_kill"] = status["principal"]
    result["promoted_s"] = round(status["last_failover"]["at"] - t_kill_wall, 2)
    result["epoch_after_kill"] = status["epoch"]

    after_failover(probe, root, result)
    sender.join(timeout=120)
    result["sent"] = rounds_sent * DIALOGS
    expected = DIALOGS * ROUNDS
    watcher = MirroredBroker("mm")
    try:
        wait_until(lambda: counted(watcher)[0] >= expected, 120, "every message counted")
    except AssertionError as exc:
        result["timeout"] = str(exc)

    # the old principal's node comes back: Ray restarts mm-a there; it rejoins as mirror
    t_back = time.monotonic()
    cluster.add_node(num_cpus=1, resources={"zone_a": 1})
    wait_until(lambda: _in_step("mm", "mm-a"), 120, "mm-a back as mirror, in step")
    result["rejoin_s"] = round(time.monotonic() - t_back, 2)
    # the operator moves the principal back; a last round goes through it
    failover("mm")
    result["principal_after_manual"] = mirror_status("mm")["principal"]
    front.apply([Send(h, "DEFAULT", json.dumps({"n": ROUNDS}).encode()) for h in handles])
    result["sent"] += DIALOGS
    expected += DIALOGS
    try:
        wait_until(lambda: counted(watcher)[0] >= expected, 120, "the last round counted")
    except AssertionError as exc:
        result["timeout"] = str(exc)
    wait_until(lambda: _in_step("mm", "mm-b"), 120, "mm-b back as mirror, in step")
    reader.running = False
    reader.join(timeout=30)
    result["received_then_rolled_back"] = reader.rolled_back  # locks the failover released
    if reader.error is not None:
        result["reader_error"] = repr(reader.error)
    total, states = counted(watcher)
    keys, missed = store_keys(watcher)
    result["expected"] = expected
    result["counted"] = total
    result["out_of_order"] = sum(s["bad"] for s in states)
    result["doubled"] = sum(c - 1 for c in keys.values()) + max(0, total - expected)
    result["lost"] = expected - len(keys)
    result["audit_missed"] = missed
    result["dialogs_continued"] = len(states) == DIALOGS and all(
        s["last"] == ROUNDS for s in states
    )
    wait_until(lambda: not front.transmission_queue(), 30, "the front's transmission queue")
    no_claim(front, root, result)
    final = mirror_status("mm")
    result["final"] = {
        "principal": final["principal"],
        "epoch": final["epoch"],
        "failovers": final["failovers"],
        "synchronized": final["synchronized"],
        "lag": final["principal_state"].get("lag_transactions"),
    }
    result["events"] = [e["kind"] for e in final["events"]]


def store_keys(broker: Any) -> tuple[Counter[tuple[str, int]], int]:
    """Each (conversation, sequence number) committed from StoreQueue, with how often, and how
    many commits the audit's bound dropped unread (the other queues' records are left out)."""
    keys: Counter[tuple[str, int]] = Counter()
    after, missed = 0, 0
    while True:
        page = broker.audit(after_id=after, limit=1000)
        missed += page["missed"]
        if not page["records"]:
            return keys, missed
        keys.update((r["conversation_id"], r["sequence_number"]) for r in page["records"]
                    if r["queue"] == "StoreQueue")  # fmt: skip
        after = page["next"]


def no_claim(front: Any, root: str, result: dict[str, Any]) -> None:
    """Seed 001 across nodes: a second mirrored broker ms (partners on zone_a and zone_b, its
    mirror slow to take over) loses its principal; the front, unable to reach it, must send
    nothing to the partner, which does not claim principal, until an operator's failover."""
    ms = start_mirrored_broker(
        "ms",
        Partner("ms-a", os.path.join(root, "ms-a.sqlite"), {"resources": {"zone_a": 0.01}}),
        Partner("ms-b", os.path.join(root, "ms-b.sqlite"), {"resources": {"zone_b": 0.01}}),
        failover_after_s=600,
    )
    ms.create(Queue("SQ"))
    ms.create(Service("S", "SQ", ["DEFAULT"]))
    front.create_route("ToS", "S", ms.info()["broker_id"], "ray://ms-a", "ray://ms-b")
    h = front.begin_dialog("Shop", "S", encryption=False)
    front.send(h, "DEFAULT", b"1")
    wait_until(lambda: ms.queues()["SQ"]["depth"] == 1, 60, "the first message at ms-a")
    pid = ms.info()["pid"]  # (all the nodes are this machine's)
    ray.kill(ray.get_actor("ms-a", namespace="raybroker"), no_restart=True)
    # ray.kill returns before the process is gone, and the front's open channel to it would
    # still take a send until then
    wait_until(lambda: process_gone(pid), 60, "ms-a's process to be gone")
    front.send(h, "DEFAULT", b"2")

    def held_back() -> bool:
        rows = [r for r in front.transmission_queue() if "claim" in r["transmission_status"]]
        return bool(rows) and rows[0]["attempts"] >= 2

    wait_until(held_back, 60, "the front to find no principal, twice")
    partner = mirror_status("ms")["partners"]["ms-b"]
    result["no_claim_refused_at_mirror"] = partner["refused_not_principal"]
    result["no_claim_mirror_role"] = partner["role"]
    failover("ms")
    wait_until(lambda: MirroredBroker("ms").queues()["SQ"]["depth"] == 2, 60, "both at ms-b")
    result["no_claim_then_followed"] = MirroredBroker("ms").name == "ms-b"


def _in_step(name: str, mirror: str) -> bool:
    status = mirror_status(name)
    return status["mirror"] == mirror and status["synchronized"]


def passed(r: dict[str, Any]) -> bool:
    return (
        r.get("apart") is True
        and r.get("first_principal") == "mm-a"
        and r.get("principal_after_kill") == "mm-b"
        and r.get("principal_after_manual") == "mm-a"
        and r.get("sent") == r.get("expected") == r.get("counted")
        and (r.get("lost"), r.get("doubled"), r.get("out_of_order")) == (0, 0, 0)
        and r.get("audit_missed") == 0
        and r.get("dialogs_continued") is True
        and r.get("final", {}).get("synchronized") is True
        and r.get("activation_counted") == 20
        and r.get("late_delivered") == 5
        and r.get("timer_fired") is True
        and r.get("no_claim_refused_at_mirror") == 0
        and r.get("no_claim_mirror_role") == "mirror"
        and r.get("no_claim_then_followed") is True
        and "error" not in r
        and "reader_error" not in r
        and "timeout" not in r
    )


def main() -> int:
    root = tempfile.mkdtemp(prefix="rbmm-")
    os.environ["RAY_TMPDIR"] = root
    os.environ.pop("RAY_ADDRESS", None)
    t0 = time.monotonic()
    result: dict[str, Any] = {"dialogs": DIALOGS, "rounds": ROUNDS}
    try:
        scenario(root, result)
    except BaseException as exc:
        result["error"] = repr(exc)
        traceback.print_exc()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result["elapsed_s"] = round(time.monotonic() - t0, 1)
    result["passed"] = passed(result)
    print("RESULT " + json.dumps(result, sort_keys=True), flush=True)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
