"""Topology files: brokers and their catalogs in YAML, checked before anything starts, then
deployed onto the Ray cluster the driver is connected to.

A file has `brokers:`, each with `name`, `storage` (a file name under the deploy's data
directory, or ":memory:"), and lists of `message_types`, `contracts`, `queues` (with optional
`activation`) and `services`, written as the definitions' fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from actors.catalog import Catalog, Definition, check_name, from_record
from actors.errors import BrokerError, TopologyError

SECTIONS = (
    ("message_types", "message_type"),
    ("contracts", "contract"),
    ("queues", "queue"),
    ("services", "service"),
)
BROKER_KEYS = {"name", "storage", *(s for s, _ in SECTIONS)}


@dataclass
class BrokerSpec:
    name: str
    storage: str = ":memory:"
    definitions: list[Definition] = field(default_factory=list)


@dataclass
class Topology:
    brokers: list[BrokerSpec]


def load(path: str) -> Topology:
    """Read and check a topology file; TopologyError says where and what is wrong."""
    try:
        with open(path) as f:
            doc = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as exc:
        raise TopologyError(f"{path}: cannot read the topology: {exc}") from None
    return parse(doc, path)


def parse(doc: Any, where: str = "topology") -> Topology:
    if not isinstance(doc, dict) or not isinstance(doc.get("brokers"), list) or not doc["brokers"]:
        raise TopologyError(f"{where}: needs a non-empty list `brokers:`")
    specs, names = [], set()
    for i, b in enumerate(doc["brokers"]):
        at = f"{where}: brokers[{i}]"
        if not isinstance(b, dict):
            raise TopologyError(f"{at}: a broker is a mapping with name, storage, queues, ...")
        unknown = set(b) - BROKER_KEYS
        if unknown:
            raise TopologyError(
                f"{at}: unknown key(s) {sorted(unknown)}; use {sorted(BROKER_KEYS)}"
            )
        try:
            name = check_name("broker", b.get("name"))
        except BrokerError as exc:
            raise TopologyError(f"{at}.name: {exc}") from None
        if name in names:
            raise TopologyError(f"{at}.name: broker {name!r} is declared twice")
        names.add(name)
        spec = BrokerSpec(name, str(b.get("storage", ":memory:")))
        catalog = Catalog()  # checks the definitions in order, as the broker will
        for section, kind in SECTIONS:
            items = b.get(section) or []
            if not isinstance(items, list):
                raise TopologyError(f"{at}.{section}: must be a list")
            for j, rec in enumerate(items):
                try:
                    if not isinstance(rec, dict):
                        raise TopologyError("each entry is a mapping of the definition's fields")
                    defn = from_record(kind, rec)
                    catalog.check_new(defn)
                    catalog.add(defn)
                except BrokerError as exc:
                    raise TopologyError(f"{at}.{section}[{j}]: {exc}") from None
                spec.definitions.append(defn)
        specs.append(spec)
    return Topology(specs)
