"""Shipped classifiers. A classifier is `module:function` called as
`classify(body, message_type, options) -> service name` with the first message of a dialog;
`options` are the router set's `classifier_options` plus `targets` (the set's target services).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import msgpack


def _document(body: bytes) -> Any:
    """A JSON body, or failing that a msgpack one."""
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return msgpack.unpackb(body, raw=False)


def _field(body: bytes, name: str) -> Any:
    doc = _document(body)
    if not isinstance(doc, dict) or name not in doc:
        raise ValueError(f"the body has no field {name!r}")
    return doc[name]


def field(body: bytes, message_type: str, options: Mapping[str, Any]) -> str:
    """The service named by a field of a JSON or msgpack body (`field`, default "region"),
    through `map` ({value: service}) when given, else `template` ("Sales{value}") or the value."""
    value = _field(body, options.get("field", "region"))
    mapping = options.get("map")
    if mapping is not None:
        if str(value) not in mapping:
            raise ValueError(f"{value!r} is not in the classifier's map")
        return mapping[str(value)]
    template = options.get("template")
    return template.format(value=value) if template else value


def hash_partition(body: bytes, message_type: str, options: Mapping[str, Any]) -> str:
    """One of `partitions` (default: the router set's targets) by a stable hash of the body's
    `key` field: the same key always goes to the same partition."""
    key = _field(body, options.get("key", "key"))
    partitions = list(options.get("partitions") or options.get("targets") or ())
    if not partitions:
        raise ValueError("no partitions to hash into")
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).digest()
    return partitions[int.from_bytes(digest[:8], "big") % len(partitions)]
