"""The name rule for everything a broker names: message types, contracts, queues, services,
routes and brokers (a broker's name goes into "ray://<name>" addresses)."""

from __future__ import annotations

import re

from actors.errors import InvalidDefinition, shown

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:/\-]{0,127}")


_CHECKED: set[str] = set()  # names already found valid: every op names its message type


def check_name(kind: str, name: object) -> str:
    if type(name) is str and name in _CHECKED:
        return name
    # fullmatch: with match and "$" a trailing newline passed ("Q\n" matched "^Q$")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidDefinition(
            f"{kind} name {shown(name)} is not valid: use 1-128 characters from letters, digits "
            "and _ . : / - (not starting with punctuation; no spaces or newlines)"
        )
    if len(_CHECKED) < 10_000:  # bounded: names are few, but a caller may try many
        _CHECKED.add(name)
    return name
