"""`raybroker bench mirror`: a mirrored broker beside the same broker unmirrored, in one run, and
the failover time from a node's loss to the first write the new principal accepts.

It starts its own Ray cluster of three nodes on this machine (`ray.cluster_utils.Cluster`, in a
temp dir; a head, a `zone_a` node and a `zone_b` node), so the mirror really is on another node
(another raylet and object store; on one machine the network is loopback). The unmirrored broker
and the principal run on `zone_a`, the mirror on `zone_b`. Throughput: N messages in batches over
K dialogs, sent and received+committed concurrently (as `bench local`); p50/p99: each message's
time from its send to the commit of its receive (the delivery audit). Every message is checked
once and in order through the audit. Failover: the node the principal runs on then (`zone_a`,
unless a failover during the runs moved it) is removed, and a probe writes
through a `MirroredBroker` handle until the new principal accepts.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import asdict, replace
from typing import Any

import ray
from ray.cluster_utils import Cluster

from actors import Begin, Queue, Send, Service, start_broker
from actors.errors import InvalidArgument, NoFailover
from actors.remote.client import Broker
from actors.remote.mirrored import (
    MirroredBroker,
    Partner,
    mirror_status,
    roles_of,
    start_mirrored_broker,
)
from actors.remote.runtime import local_cluster
from actors.store.audit import read_all
from actors.tools.bench.local import receive_all, send_all
from actors.tools.bench.peers.driver import ProcessCpu
from actors.tools.bench.repeat import check_repeats
from actors.tools.bench.report import (
    DEFAULT_LOAD,
    Load,
    Progress,
    Report,
    Row,
    median_row,
    percentile,
)

GOAL_RATIO = 0.7  # mirrored throughput at least this share of unmirrored
GOAL_FAILOVER_S = 5.0
FAILOVER_GIVE_UP_S = 120.0  # the failover probe reports a failure past this
REPEATS = 3


def run(
    load: Load = DEFAULT_LOAD,
    progress: Progress = print,
    repeats: int = REPEATS,
    warm_up: bool = True,
) -> Report:
    """Its repeats run inside the one cluster it starts (a cluster per run would measure Ray's
    start as much as the broker): after a warm-up (unless not `warm_up`), `repeats` runs of
    each broker, interleaved, each row their median; the failover, which costs the cluster a
    node, once."""
    check_repeats(repeats)
    report = Report("mirror", {**asdict(load), "body_bytes": 100, "repeats": repeats})
    if ray.is_initialized():
        raise InvalidArgument(
            "bench mirror starts its own three-node local cluster; run it in a process that has "
            "not started or joined Ray"
        )
    with tempfile.TemporaryDirectory(prefix="raybroker-bench-mirror-") as tmp:
        os.environ["RAY_TMPDIR"] = tmp  # this cluster's session files stay apart
        os.environ.pop("RAY_ADDRESS", None)
        progress("starting a 3-node local Ray cluster (head, zone_a, zone_b)")
        cluster = local_cluster()
        try:
            zones = [cluster.add_node(num_cpus=1, resources={z: 1}) for z in ("zone_a", "zone_b")]
            cluster.wait_for_nodes()
            ray.init(address=cluster.address, logging_level=logging.ERROR, log_to_driver=False)
            _measure(report, load, repeats, warm_up, tmp, cluster, zones, progress)
        finally:
            ray.shutdown()
            cluster.shutdown()
    return report


def _measure(
    report: Report,
    load: Load,
    repeats: int,
    warm_up: bool,
    tmp: str,
    cluster: Cluster,
    zones: list[Any],
    progress: Progress,
) -> None:
    tag = uuid.uuid4().hex[:6]
    zone_a, zone_b = {"resources": {"zone_a": 0.01}}, {"resources": {"zone_b": 0.01}}
    plain = start_broker(f"bench-plain-{tag}", os.path.join(tmp, "plain.sqlite"), **zone_a)
    mm = start_mirrored_broker(
        f"bench-mm-{tag}",
        Partner(f"bench-mm-{tag}-a", os.path.join(tmp, "a.sqlite"), zone_a),
        Partner(f"bench-mm-{tag}-b", os.path.join(tmp, "b.sqlite"), zone_b),
    )
    brokers = {"unmirrored": plain, "mirrored": mm}
    for broker in brokers.values():
        _define(broker)
    warm = replace(load, messages=max(load.batch, load.messages // 10))
    runs: dict[str, list[Row]] = {label: [] for label in brokers}
    for i in range(0 if warm_up else 1, repeats + 1):
        for label, broker in brokers.items():  # interleaved: the machine's drift hits both
            what = "warm-up" if i == 0 else f"run {i} of {repeats}"
            n = warm if i == 0 else load
            progress(f"{label}: {what}, {n.messages:,} messages, sent and received+committed")
            r = _stream(broker, n)
            if i:
                cpu = r["cpu_s"]  # by process: this driver's and the broker's
                brokers_s = sum(v for k, v in cpu.items() if k != "driver")
                shares = ", ".join(f"{k} {v / n.messages * 1e6:.2f} µs" for k, v in cpu.items())
                runs[label].append(
                    Row(
                        "raybroker",
                        f"{label}: send, receive+commit",
                        r["rate"],
                        r["p50"],
                        r["p99"],
                        cpu_s_per_1k=sum(cpu.values()) / (n.messages / 1000),
                        notes=f"CPU a message: {shares}",
                        lost=r["lost"],
                        doubled=r["doubled"],
                        out_of_order=r["out_of_order"],
                        server_cpu_s_per_1k=brokers_s / (n.messages / 1000),
                    )  # fmt: skip
                )
    rows = {label: median_row(runs[label]) for label in brokers}
    ratio = rows["mirrored"].messages_per_s / rows["unmirrored"].messages_per_s
    rows["mirrored"].notes = (
        f"{ratio:.2f}x unmirrored (goal >= {GOAL_RATIO}x); mirror on another node, every "
        f"transaction on it before the caller is answered; {rows['mirrored'].notes}"
    )
    report.rows += [rows["unmirrored"], rows["mirrored"]]
    status = mirror_status(mm.mirrored)
    # the mirror takes over when the principal stops answering pings, also when it is only
    # too busy to: such failovers during the runs are reported, not hidden
    during = status["failovers"]
    progress("failover: the principal's node is removed; a probe writes until accepted")
    failover_s = _failover(mm, cluster, _node_of(zones, status["principal_state"]))
    report.rows.append(
        Row(
            "raybroker",
            "failover: node loss -> first write accepted by the new principal",
            0.0,
            notes=f"{failover_s:.2f} s (goal < {GOAL_FAILOVER_S} s); mirror lag before: "
            f"{status['principal_state'].get('lag_transactions')} transactions; failovers "
            f"during the runs: {during}",
        )  # fmt: skip
    )
    report.params |= {"ratio": round(ratio, 3), "failover_s": round(failover_s, 2),
                      "failovers_during_runs": during}  # fmt: skip


def _define(b: Broker) -> list[str]:
    b.create(Queue("InitiatorQueue"))
    b.create(Queue("TargetQueue"))
    b.create(Service("Initiator", "InitiatorQueue"))
    b.create(Service("Target", "TargetQueue", ["DEFAULT"]))
    return b.apply([Begin("Initiator", "Target") for _ in range(1)])["handles"]


def _stream(b: Broker, load: Load) -> dict[str, Any]:
    handles = b.apply([Begin("Initiator", "Target") for _ in range(load.dialogs)])["handles"]
    _, after = read_all(b.audit)
    body = os.urandom(100)

    async def both() -> None:
        await asyncio.gather(
            send_all(b, handles, load.messages, load.batch, body, inflight=4),
            receive_all(b, load.messages, max_groups=16, readers=1),
        )

    cpu = {k: ProcessCpu([pid]) for k, pid in _pids(b).items()}
    t0 = time.perf_counter()
    asyncio.run(both())
    rate = load.messages / (time.perf_counter() - t0)
    cpu_s = {k: c.used() for k, c in cpu.items()}
    records, _ = read_all(b.audit, after)
    lat = sorted((r["committed_at"] - r["sent_at"]) * 1000 for r in records)
    keys = Counter((r["conversation_id"], r["sequence_number"]) for r in records)
    last: dict[str, int] = {}
    disorder = 0
    for r in records:
        cid, seq = r["conversation_id"], r["sequence_number"]
        disorder += seq < last.get(cid, -1)
        last[cid] = max(seq, last.get(cid, -1))
    return {
        "rate": rate,
        "p50": percentile(lat, 0.5),
        "p99": percentile(lat, 0.99),
        "lost": load.messages - len(keys),
        "doubled": sum(c - 1 for c in keys.values()),
        "out_of_order": disorder,
        "cpu_s": cpu_s,
    }


def _pids(b: Broker) -> dict[str, int]:
    """The processes whose CPU a stream costs: the broker's (a mirrored broker's principal and
    mirror, wherever a failover has put them) and this driver's."""
    if isinstance(b, MirroredBroker):
        roles = roles_of(b.mirrored, b.namespace)
        pids = {
            role: ray.get(ray.get_actor(roles[role], namespace=b.namespace).info.remote())["pid"]
            for role in ("principal", "mirror")
        }
    else:
        pids = {"broker": b.info()["pid"]}
    return {**pids, "driver": os.getpid()}


def _node_of(zones: list[Any], principal: dict[str, Any]) -> Any:
    """The zone node the principal runs on now (a failover during the runs may have moved it
    from zone_a)."""
    for node in zones:
        if node.node_id == principal.get("node"):
            return node
    raise NoFailover(principal.get("broker", "?"), f"its principal is on no zone node: {principal}")


def _failover(mm: MirroredBroker, cluster: Cluster, node: Any) -> float:
    before = mm.name
    t0 = time.monotonic()
    cluster.remove_node(node, allow_graceful=False)
    while time.monotonic() - t0 < FAILOVER_GIVE_UP_S:
        op = Begin("Initiator", "Target")
        mm.apply([op, Send(op.handle, "DEFAULT", b"probe")])
        if mm.name != before:  # accepted by the new principal, not the dying old one
            return time.monotonic() - t0
        time.sleep(0.02)
    raise NoFailover(
        mm.mirrored,
        f"none within {FAILOVER_GIVE_UP_S:.0f} s of losing the principal's node; writes are "
        f"still accepted by {before!r} (the witness: {roles_of(mm.mirrored)})",
    )
