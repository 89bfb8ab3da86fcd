"""The lock holders outside a broker (drivers, tasks, actors), each with the handle the broker
checks it is alive by. Plain Python: the runtime supplies the check (`BrokerService.holder_alive`).

A receive names its holder as (holder id, handle). Within one call a client gives a holder's
handle once and names it by id alone after that (actors.client.coalesce), so an id alone must be a
holder this broker already has: `full` turns it back into the pair."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from actors.errors import InvalidArgument

Holder = tuple[str, Any]  # (holder id, the handle to check it by)


class LockHolders:
    def __init__(self) -> None:
        self._handles: dict[str, Any] = {}

    def full(self, holder: Holder | str | None) -> Holder | None:
        """`holder` as (id, handle); an id alone is looked up among the known holders."""
        if type(holder) is not str:
            return holder
        handle = self._handles.get(holder)
        if handle is None:
            raise InvalidArgument(
                f"lock holder {holder!r} is named by its id alone, but no earlier receive of the "
                "call gave its handle: name it as (holder id, handle)"
            )
        return holder, handle

    def adopt(self, holder: Holder | str | None) -> str | None:
        """Remember who will hold the locks, to notice if it dies; its id (None: nobody)."""
        if holder is None:
            return None
        holder_id, handle = self.full(holder)
        self._handles[holder_id] = handle
        return holder_id

    def keep_only(self, holding: Collection[str]) -> list[Holder]:
        """Forget the holders that hold no lock now; the rest, to check."""
        for holder_id in [h for h in self._handles if h not in holding]:
            del self._handles[holder_id]
        return list(self._handles.items())

    def forget(self, holder_id: str) -> None:
        self._handles.pop(holder_id, None)
