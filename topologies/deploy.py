"""Deploying a loaded topology onto the Ray cluster this driver is connected to (loading and
validating, in `topologies.loader`, needs no Ray)."""

from __future__ import annotations

import os
from typing import Any

from actors import Broker, start_broker
from actors.catalog import kind_of

from .loader import Topology


def deploy(topology: Topology, data_dir: str, **broker_options: Any) -> dict[str, Broker]:
    """Start every broker (or attach to it if it runs) and create what it does not have yet."""
    os.makedirs(data_dir, exist_ok=True)
    out = {}
    for spec in topology.brokers:
        path = spec.storage if spec.storage == ":memory:" else os.path.join(data_dir, spec.storage)
        broker = start_broker(spec.name, path, **broker_options)
        have = {(kind, rec["name"]) for kind, rec in broker.definitions()}
        for defn in spec.definitions:
            if (kind_of(defn), defn.name) not in have:
                broker.create(defn)
        out[spec.name] = broker
    return out
