"""Connecting a driver to Ray: a running cluster if one is named, else a local embedded one."""

from __future__ import annotations

import logging
import os
from typing import Any

import ray

# Ray notices a crashed node by missed health checks (by default after about 15 s); a check every
# 0.5 s and 4 misses keep a test's or a benchmark's wait for the restart short
QUICK_HEALTH = {"health_check_period_ms": 500, "health_check_failure_threshold": 4}
QUIET = "RAYBROKER_QUIET"  # "1": the workers' logs are not printed by the driver


def ensure_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Initialise Ray once: `address` (or $RAY_ADDRESS) for a cluster started with `ray up`,
    otherwise a local Ray inside this process, quiet and without the dashboard."""
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS") or None
    quiet = {"logging_level": logging.ERROR, "log_to_driver": os.environ.get(QUIET) != "1"}
    if address:
        ray.init(address=address, **quiet)
        return
    ray.init(num_cpus=num_cpus or max(2, os.cpu_count() or 2), include_dashboard=False, **quiet)


def local_cluster(**head: Any) -> Any:
    """A `ray.cluster_utils.Cluster` of one head node on this machine (add nodes to it) with quick
    health checks and no dashboard (its fixed port may be taken by another Ray here, and nothing
    reads it), for a multi-node test, benchmark or fault run. `head`: the head's node arguments
    (num_cpus=1 unless given)."""
    from ray.cluster_utils import Cluster

    args = {"num_cpus": 1, "include_dashboard": False, "_system_config": QUICK_HEALTH, **head}
    return Cluster(initialize_head=True, head_node_args=args)
