"""The multi-node Ray cluster `raybroker verify` runs on: several nodes on this machine
(`ray.cluster_utils.Cluster`) in a temp dir of their own, so it neither joins nor disturbs any
other Ray here. The head hosts the drivers, Spark and most brokers (the `vf_head` resource);
`store_nodes` nodes offer the `vf_store` resource, so the broker placed by it can move when its
node is removed."""

from __future__ import annotations

import logging
import os
from typing import Any

import ray

from actors.remote.runtime import QUIET, local_cluster
from actors.tools.verify.topology import HEAD_RESOURCE, STORE_RESOURCE


def ray_running() -> bool:
    """Whether this process is connected to a Ray already (verify then runs in another)."""
    return ray.is_initialized()


class LocalCluster:
    def __init__(self, root: str, head_cpus: int = 4) -> None:
        self.root, self.head_cpus = root, head_cpus
        self.cluster: Any = None
        self.store_nodes: dict[str, Any] = {}  # node id -> the node's handle

    def start(self) -> None:
        """The head, and this driver connected to it; store nodes come with `add_store_nodes`
        (after Spark starts, if it does: RayDP's JVM joins Ray as a driver on the first node it
        finds at this address, and must find the head, not a node that will be removed)."""
        # Ray reads RAY_TMPDIR for its session files and its "current cluster" address file.
        os.environ["RAY_TMPDIR"] = self.root
        os.environ.pop("RAY_ADDRESS", None)
        self.cluster = local_cluster(num_cpus=self.head_cpus, resources={HEAD_RESOURCE: 1000})
        ray.init(
            address=self.cluster.address,
            logging_level=logging.ERROR,
            log_to_driver=os.environ.get(QUIET) != "1",
        )

    def add_store_nodes(self, n: int = 1) -> None:
        # No CPUs: only zero-CPU actors (brokers, reader actors) land here, never Spark.
        for _ in range(n):
            node = self.cluster.add_node(num_cpus=0, resources={STORE_RESOURCE: 1})
            self.store_nodes[node.node_id] = node
        self.cluster.wait_for_nodes()

    def remove_node(self, node_id: str) -> None:
        """Crash a store node: its processes are SIGKILLed, no graceful shutdown."""
        self.cluster.remove_node(self.store_nodes.pop(node_id), allow_graceful=False)

    def shutdown(self) -> None:
        try:
            ray.shutdown()
        finally:
            if self.cluster is not None:
                self.cluster.shutdown()
