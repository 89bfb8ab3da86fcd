"""A broker moves to another node when its node dies, and its dialogs go on: run as a script.

A Ray cluster of four nodes on this machine (`ray.cluster_utils.Cluster`, in its own temp dir, so
it neither joins nor disturbs any other Ray here): a head with no broker resource, node A offering
`zone_a`, and nodes B1 and B2 both offering `zone_b`. A topology places broker mn-shop on
`zone_a` and broker mn-store on `zone_b`, with routes between them. mn-shop begins dialogs with
mn-store and sends on them in rounds while a reader here receives at mn-store, counting each
message into its conversation group's state in the same commit. Mid-stream the node hosting
mn-store is killed (its processes SIGKILLed, no graceful shutdown); Ray restarts the broker on
the other `zone_b` node, where it reopens its store (one filesystem here stands in for the
shared storage a real cluster needs) with the same broker id. The same dialogs carry on.

Prints one line `RESULT {json}` and exits 0 when placement was as declared, the broker moved,
and every message arrived exactly once and in order per dialog; else 1.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from typing import Any

import ray
from ray.cluster_utils import Cluster

from actors import Begin, Send
from actors.errors import BrokerUnavailable, LockNotHeld
from actors.remote.client import connect
from actors.remote.runtime import local_cluster
from tests.polling import wait_until  # run as a script, the project's root on the path
from topologies.deploy import deploy
from topologies.loader import load

DIALOGS = 40
ROUNDS = 60  # messages per dialog; one Send per dialog per round
KILL_AT = ROUNDS // 3  # rounds sent (and some received) before the node is killed
RESUME_AT = 2 * ROUNDS // 3  # rounds sent while the kill goes on; the rest only after it

TOPOLOGY = """
brokers:
  - name: mn-shop
    storage: mn-shop.sqlite
    placement: {resources: {zone_a: 1}}
    queues: [{name: ShopQueue}]
    services: [{name: Shop, queue: ShopQueue}]
    routes:
      - {name: ToStore, service_name: Store, broker_instance: mn-store, address: "ray://mn-store"}
  - name: mn-store
    storage: mn-store.sqlite
    placement: {resources: {zone_b: 1}}
    queues: [{name: StoreQueue}]
    services: [{name: Store, queue: StoreQueue, contracts: [DEFAULT]}]
    routes:
      - {name: ToShop, service_name: Shop, broker_instance: mn-shop, address: "ray://mn-shop"}
"""


class Reader(threading.Thread):
    """Receives groups at mn-store and commits each group's new state with the receive, so a
    message is counted exactly when it leaves the queue: {"count", "last" sequence number, "bad":
    messages whose sequence number or body counter `n` is not the one after the last}."""

    def __init__(self, broker: Any) -> None:
        super().__init__(daemon=True)
        self.broker = broker
        self.running = True
        self.committed = 0  # messages whose commit was answered (progress only; states decide)
        self.rolled_back = 0  # messages received whose commit the restart undid
        self.error: BaseException | None = None

    def run(self) -> None:
        held: list[Any] = []
        states: dict[str, bytes] = {}
        pending = 0
        try:
            while self.running:
                try:
                    groups = self.broker.receive(
                        "StoreQueue", max_groups=8, wait=0.2, commit=held, states=states
                    )
                    self.committed += pending
                except (LockNotHeld, BrokerUnavailable):
                    groups = []  # the broker restarted: those receives were rolled back
                    self.rolled_back += pending
                held, states, pending = groups, {}, 0
                for g in groups:
                    state = json.loads(g.state) if g.state else {"count": 0, "last": -1, "bad": 0}
                    for m in g.messages:
                        n = json.loads(m.body)["n"]
                        if m.sequence_number != state["last"] + 1 or n != state["last"] + 1:
                            state["bad"] += 1
                        state["last"] = m.sequence_number
                        state["count"] += 1
                        pending += 1
                    states[g.group_id] = json.dumps(state).encode()
            if held:
                self.broker.commit(held, states=states)
        except BaseException as exc:  # reported in the result, not lost in a thread
            self.error = exc


def counted(store: Any) -> tuple[int, list[dict[str, int]]]:
    states = [json.loads(g["state"]) for g in store.groups("StoreQueue") if g["state"]]
    return sum(s["count"] for s in states), states


def audit_keys(store: Any) -> tuple[Counter[tuple[str, int]], int]:
    """Each delivered (conversation, sequence number) with how often it was committed, and how
    many commits the audit's bound dropped unread."""
    keys: Counter[tuple[str, int]] = Counter()
    after, missed = 0, 0
    while True:
        page = store.audit(after_id=after, limit=1000)
        missed += page["missed"]
        if not page["records"]:
            return keys, missed
        keys.update((r["conversation_id"], r["sequence_number"]) for r in page["records"])
        after = page["next"]


def scenario(root: str, result: dict[str, Any]) -> None:
    """Start the cluster, run the stream with a node killed in it, and fill in `result`."""
    t0 = time.monotonic()
    cluster = local_cluster()
    try:
        node_a = cluster.add_node(num_cpus=1, resources={"zone_a": 1})
        b_nodes = [cluster.add_node(num_cpus=1, resources={"zone_b": 1}) for _ in range(2)]
        cluster.wait_for_nodes()
        ray.init(
            address=cluster.address,
            logging_level=logging.ERROR,
            log_to_driver=os.environ.get("RAYBROKER_QUIET") != "1",
        )
        result["cluster_up_s"] = round(time.monotonic() - t0, 1)
        stream(root, result, cluster, node_a, b_nodes)
    finally:
        ray.shutdown()
        cluster.shutdown()


def stream(root: str, result: dict[str, Any], cluster: Cluster, node_a: Any, b_nodes: list) -> None:
    path = os.path.join(root, "multinode.yaml")
    with open(path, "w") as f:
        f.write(TOPOLOGY)
    brokers = deploy(load(path), os.path.join(root, "data")).brokers
    shop, store = brokers["mn-shop"], brokers["mn-store"]

    b_ids = {n.node_id: n for n in b_nodes}
    before = store.info()
    shop_node, store_node = shop.info()["node"], before["node"]
    result["placement"] = {
        "mn-shop": "A" if shop_node == node_a.node_id else shop_node,
        "mn-store": "B" if store_node in b_ids else store_node,
    }
    if result["placement"] != {"mn-shop": "A", "mn-store": "B"}:
        return
    doomed = b_ids[store_node]

    handles = shop.apply([Begin("Shop", "Store", encryption=False) for _ in range(DIALOGS)])[
        "handles"
    ]
    reader = Reader(connect("mn-store"))  # its own handle: its own call order
    reader.start()

    rounds_sent = 0
    go, killed = threading.Event(), threading.Event()

    def send_stream() -> None:
        nonlocal rounds_sent
        for n in range(ROUNDS):
            if n == KILL_AT:
                go.wait()  # some of the stream is received first
            if n == RESUME_AT:
                killed.wait()  # the rest goes only once the node is gone
            body = json.dumps({"n": n}).encode()
            shop.apply([Send(h, "DEFAULT", body) for h in handles])
            rounds_sent = n + 1

    sender = threading.Thread(target=send_stream, daemon=True)
    sender.start()
    wait_until(
        lambda: rounds_sent >= KILL_AT and reader.committed > 0,
        60,
        "a third of the stream sent and some of it received",
    )
    go.set()  # the sender goes on; the node dies while it sends
    wait_until(lambda: rounds_sent >= KILL_AT + 2, 60, "the stream to go on")
    result["sent_before_kill"] = rounds_sent * DIALOGS
    result["received_before_kill"] = reader.committed
    t_kill = time.monotonic()
    cluster.remove_node(doomed, allow_graceful=False)  # a node crash, not a drain
    killed.set()
    result["kill_s"] = round(time.monotonic() - t_kill, 2)

    watcher = connect("mn-store")  # retries through the restart
    after = wait_until(
        lambda: (i := watcher.info())["node"] != store_node and i,
        120,
        "mn-store to answer from another node",
    )
    result["restart_s"] = round(time.monotonic() - t_kill, 2)
    result["node_changed"] = after["node"] != store_node
    result["moved_to_other_zone_b"] = after["node"] in b_ids and after["node"] != store_node
    result["same_broker_id"] = after["broker_id"] == before["broker_id"]
    result["same_store_path"] = after["path"] == before["path"]

    sender.join(timeout=120)
    result["sent"] = rounds_sent * DIALOGS
    expected = DIALOGS * ROUNDS
    try:
        wait_until(lambda: counted(watcher)[0] >= expected, 120, "every message counted")
    except AssertionError as exc:  # wait_until's timeout
        result["timeout"] = str(exc)  # the counts below say what is missing
    reader.running = False
    reader.join(timeout=30)
    result["received_then_rolled_back"] = reader.rolled_back
    if reader.error is not None:
        result["reader_error"] = repr(reader.error)

    total, states = counted(watcher)
    keys, missed = audit_keys(watcher)
    result["counted"] = total
    result["groups"] = len(states)
    result["out_of_order"] = sum(s["bad"] for s in states)
    result["doubled"] = sum(c - 1 for c in keys.values()) + max(0, total - expected)
    result["lost"] = expected - len(keys)
    result["audit_missed"] = missed
    result["dialogs_continued"] = len(states) == DIALOGS and all(
        s["last"] == ROUNDS - 1 for s in states
    )
    result["shop_stayed_on_a"] = shop.info()["node"] == node_a.node_id
    result["store_depth"] = watcher.queues()["StoreQueue"]["depth"]
    with contextlib.suppress(AssertionError):  # every message acknowledged back to the shop
        wait_until(lambda: not shop.transmission_queue(), 30, "the shop's transmission queue")
    result["shop_transmission_left"] = len(shop.transmission_queue())


def passed(r: dict[str, Any]) -> bool:
    return (
        r.get("placement") == {"mn-shop": "A", "mn-store": "B"}
        and r.get("moved_to_other_zone_b") is True
        and r.get("shop_stayed_on_a") is True
        and r.get("same_broker_id") is True
        and r.get("dialogs_continued") is True
        and r.get("sent") == DIALOGS * ROUNDS
        and r.get("counted") == DIALOGS * ROUNDS
        and (r.get("lost"), r.get("doubled"), r.get("out_of_order")) == (0, 0, 0)
        and r.get("audit_missed") == 0
        and r.get("store_depth") == 0
        and r.get("shop_transmission_left") == 0
        and "error" not in r
        and "reader_error" not in r
    )


def main() -> int:
    # Ray reads RAY_TMPDIR for its session files and for the "current cluster" address file, so
    # this cluster's files stay apart from any other Ray's on the machine.
    root = tempfile.mkdtemp(prefix="rbmn-")
    os.environ["RAY_TMPDIR"] = root
    os.environ.pop("RAY_ADDRESS", None)
    t0 = time.monotonic()
    result: dict[str, Any] = {"dialogs": DIALOGS, "messages": DIALOGS * ROUNDS}
    try:
        scenario(root, result)
    except BaseException as exc:
        result["error"] = repr(exc)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result["elapsed_s"] = round(time.monotonic() - t0, 1)
    result["passed"] = passed(result)
    print("RESULT " + json.dumps(result, sort_keys=True), flush=True)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
