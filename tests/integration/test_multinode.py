"""A broker on a node that dies restarts on another node its placement allows, reopens its store
and carries on its dialogs: nothing lost, nothing doubled, nothing out of order.

The session's own Ray is one node, so the multi-node cluster (`ray.cluster_utils.Cluster`, four
nodes on this machine) runs in a subprocess, `multinode_check.py`, with its own temp dir; it
prints one `RESULT {json}` line, checked here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import in_own_process, script_result

SCRIPT = Path(__file__).with_name("multinode_check.py")


@pytest.mark.slow
def test_brokers_follow_their_placement_and_survive_the_loss_of_their_node():
    run = in_own_process([str(SCRIPT)], timeout=300, quiet=True)
    r = script_result(run)

    # placed as the topology declares: mn-shop on the zone_a node, mn-store on a zone_b node
    assert r["placement"] == {"mn-shop": "A", "mn-store": "B"}, r
    # mn-store's node was killed mid-stream: it came back on the other zone_b node, same broker
    # (id and store file), while mn-shop stayed where it was
    assert r["node_changed"] and r["moved_to_other_zone_b"], r
    assert r["same_broker_id"] and r["same_store_path"] and r["shop_stayed_on_a"], r
    assert r["received_before_kill"] > 0 and r["sent_before_kill"] < r["messages"], r
    # the dialogs begun before the kill went on, and every message arrived once, in order
    assert r["dialogs_continued"] and r["groups"] == r["dialogs"], r
    assert r["sent"] == r["counted"] == r["messages"], r
    assert (r["lost"], r["doubled"], r["out_of_order"]) == (0, 0, 0), r
    assert r["audit_missed"] == 0 and r["store_depth"] == 0, r
    assert r["shop_transmission_left"] == 0, r  # every message acknowledged back to the shop
    assert run.returncode == 0 and r["passed"], r
