"""Connecting a driver to Ray: a running cluster if one is named, else a local embedded one."""

from __future__ import annotations

import logging
import os

import ray


def ensure_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Initialise Ray once: `address` (or $RAY_ADDRESS) for a cluster started with `ray up`,
    otherwise a local Ray inside this process, quiet and without the dashboard."""
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        ray.init(address=address, logging_level=logging.ERROR)
        return
    ray.init(
        num_cpus=num_cpus or max(2, os.cpu_count() or 2),
        include_dashboard=False,
        logging_level=logging.ERROR,
        log_to_driver=os.environ.get("RAYBROKER_QUIET") != "1",
    )
