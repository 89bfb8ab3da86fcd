"""Checks of the numbers and flags callers pass: times, counts, limits, switches.

One place, used on both sides: the client checks before it calls (a clear error at once), and the
broker checks again (another client may not). A NaN, an infinity, a bool where a number belongs,
a negative, an int too large for the store or a wrong type is an `InvalidArgument` naming what was
wrong, before anything changes.
"""

from __future__ import annotations

import math
from typing import Any

from actors.errors import InvalidArgument, shown

MAX_SECONDS = float(2**31 - 1)  # about 68 years: Service Broker's lifetimes are INT seconds
INT_MAX = 2**63 - 1  # SQLite's INTEGER


def seconds(what: str, value: Any, *, zero: bool = False, none: bool = False) -> Any:
    """A finite time in seconds: > 0 (>= 0 with `zero`), at most MAX_SECONDS; None if `none`."""
    if value is None and none:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and isinstance(value, int) and value > MAX_SECONDS:  # isfinite() overflows on a huge int
        raise InvalidArgument(
            f"{what} must be at most {MAX_SECONDS:.0f} seconds, not {shown(value)}"
        )
    if not ok or value < 0 or (value == 0 and not zero) or not math.isfinite(value):
        bound = ">= 0" if zero else "> 0"
        also = " or None" if none else ""
        raise InvalidArgument(
            f"{what} must be a finite number of seconds {bound}{also}, not {shown(value)}"
        )
    if value > MAX_SECONDS:
        raise InvalidArgument(f"{what} must be at most {MAX_SECONDS:.0f} seconds, not {value!r}")
    return float(value)


def whole(what: str, value: Any, *, least: int = 0, most: int = INT_MAX, none: bool = False) -> Any:
    """An int in [least, most] (not a bool); None if `none`."""
    if value is None and none:
        return None
    ok = isinstance(value, int) and not isinstance(value, bool)
    if not ok or not least <= value <= most:
        also = " or None" if none else ""
        raise InvalidArgument(
            f"{what} must be an int from {least} to {most}{also}, not {shown(value)}"
        )
    return value


def flag(what: str, value: Any) -> bool:
    """True or False, nothing else ("no" is not False)."""
    if not isinstance(value, bool):
        raise InvalidArgument(f"{what} must be True or False, not {value!r}")
    return value


MAX_GROUPS = 10_000  # groups one receive may lock


def receive(max_groups: Any, top: Any, lease: Any) -> None:
    """RECEIVE's numbers."""
    if (
        type(max_groups) is int
        and 0 < max_groups <= MAX_GROUPS
        and (top is None or type(top) is int and 0 < top <= INT_MAX)
        and lease is None
    ):
        return  # the usual receive, checked at once
    whole("max_groups", max_groups, least=1, most=MAX_GROUPS)
    whole("top", top, least=1, none=True)
    seconds("lease", lease, none=True)


def page(after_id: Any, limit: Any) -> None:
    """A view's cursor and page size."""
    whole("after_id", after_id)
    whole("limit", limit, least=1)


def items(what: str, value: Any) -> list[Any]:
    """A list, tuple or other iterable of items (not a string, bytes or mapping), as a list."""
    if isinstance(value, (str, bytes, bytearray, dict)) or not hasattr(value, "__iter__"):
        raise InvalidArgument(f"{what} must be a list, not {type(value).__name__}")
    return list(value)


def states(value: Any) -> dict[str, bytes | None]:
    """Group states to write at commit: {group_id: bytes or None}."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidArgument(
            f"states must be a dict of group id -> bytes, not {type(value).__name__}"
        )
    for gid, state in value.items():
        if not isinstance(gid, str) or not (state is None or isinstance(state, bytes)):
            raise InvalidArgument(
                f"states must map group ids (str) to bytes or None, not {gid!r}: "
                f"{type(state).__name__}"
            )
    return dict(value)
