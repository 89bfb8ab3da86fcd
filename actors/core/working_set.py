"""The broker's working set: the dialog endpoints and conversation groups in use, kept in memory
up to a bound (`Limits.endpoint_cache`), the least recently used of the rest read back from the
store by key when next used. The store is the truth; memory follows what is used, not how many
dialogs are open.

Plain Python: a miss calls the loader it was given (the store's keyed reads). Nothing is evicted
while a transaction is open: the unit of work trims the sets once its changes are written
(`trim`), and what is pinned (a group a receive holds, a dialog whose messages are on their way)
stays, whatever its age.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import TypeVar

from actors.core.changes import Group
from actors.model.dialogs import Endpoint

V = TypeVar("V")


class WorkingSet:  # of V (not `Generic[V]`: compiled, it is an extension type; see the .pxd)
    """Objects by number, the `capacity` most recently used kept; a miss reads the store."""

    def __init__(self, capacity: int, load: Callable[[int], V | None]) -> None:
        self.capacity = capacity
        self._load = load
        self._items: OrderedDict[int, V] = OrderedDict()
        # recency is kept (a hit moves its item to the back) only once the set is half full:
        # a broker whose dialogs all fit pays nothing for it
        self._tracking = False
        # whether every object the store holds is in memory (all were read at start, and none
        # evicted since): a miss then answers None without asking the store
        self.complete = False
        self.misses = 0  # reads of the store (since start)
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, no: object) -> bool:
        return self.get(no) is not None  # type: ignore[arg-type]

    def __getitem__(self, no: int) -> V:
        item = self._items.get(no)  # `get` in line: a hit (nearly every lookup) makes no call
        if item is None:
            item = self.get(no)
            if item is None:
                raise KeyError(no)
        elif self._tracking:
            self._items.move_to_end(no)
        return item

    def get(self, no: int) -> V | None:
        item = self._items.get(no)
        if item is None:
            if self.complete or type(no) is not int:
                return None
            return self._kept(self._load(no))
        if self._tracking:
            self._items.move_to_end(no)
        return item

    def _kept(self, item: V | None) -> V | None:
        """`item`, just read from the store (None: the store has none), now in memory."""
        if item is not None:
            self.misses += 1
            self.add(item)
        return item

    def peek(self, no: int) -> V | None:
        """The object numbered `no` if it is in memory (nothing is read, nothing moves)."""
        return self._items.get(no)

    def cached(self) -> Iterator[V]:
        """What is in memory now (not every object the store holds)."""
        return iter(list(self._items.values()))

    def add(self, item: V) -> None:
        self._items[self._no(item)] = item
        self._tracking = len(self._items) > self.capacity // 2

    def discard(self, no: int) -> V | None:
        return self._items.pop(no, None)

    def trim(self, pinned: Callable[[int], bool]) -> None:
        """Evict the least recently used beyond `capacity`, but those `pinned`."""
        excess = len(self._items) - self.capacity
        if excess <= 0:
            return
        self.complete = False
        items, kept = self._items, []
        while excess > 0 and items:
            no, item = items.popitem(last=False)
            if pinned(no):
                kept.append((no, item))
            else:
                self._forget(item)
                self.evicted += 1
                excess -= 1
        for no, item in kept:  # to the back: they are in use
            items[no] = item

    # what subclasses keep beside the numbers
    def _no(self, item: V) -> int:
        raise NotImplementedError

    def _forget(self, item: V) -> None:
        """`item` was evicted (already out of the numbers' map)."""


class Endpoints(WorkingSet):  # of Endpoint
    """Endpoints by number, handle and (conversation id, is initiator)."""

    def __init__(
        self,
        capacity: int,
        by_no: Callable[[int], Endpoint | None],
        by_handle: Callable[[str], Endpoint | None],
        by_conversation: Callable[[str, bool], Endpoint | None],
        evicted: Callable[[Endpoint], None] = lambda ep: None,
    ) -> None:
        super().__init__(capacity, by_no)
        self._load_handle = by_handle
        self._load_conversation = by_conversation
        self._on_evict = evicted
        self._handles: dict[str, Endpoint] = {}
        self._conversations: dict[tuple[str, bool], Endpoint] = {}

    def by_handle(self, handle: object) -> Endpoint | None:
        ep = self._handles.get(handle) if isinstance(handle, str) else None
        if ep is None:
            if self.complete or not isinstance(handle, str) or not handle:
                return None
            return self._kept(self._load_handle(handle))
        if self._tracking:
            self._items.move_to_end(ep.no)
        return ep

    def by_conversation(self, conversation_id: str, is_initiator: bool) -> Endpoint | None:
        ep = self._conversations.get((conversation_id, is_initiator))
        if ep is None:
            if self.complete:
                return None
            return self._kept(self._load_conversation(conversation_id, is_initiator))
        if self._tracking:
            self._items.move_to_end(ep.no)
        return ep

    def add(self, item: Endpoint) -> None:
        super().add(item)
        self._handles[item.handle] = item
        self._conversations[(item.conversation_id, item.is_initiator)] = item

    def discard(self, no: int) -> Endpoint | None:
        ep = super().discard(no)
        if ep is not None:
            self._unindex(ep)
        return ep

    def _unindex(self, ep: Endpoint) -> None:
        self._handles.pop(ep.handle, None)
        self._conversations.pop((ep.conversation_id, ep.is_initiator), None)

    def _no(self, item: Endpoint) -> int:
        return item.no

    def _forget(self, item: Endpoint) -> None:
        self._unindex(item)
        self._on_evict(item)


class Groups(WorkingSet):  # of Group
    """Conversation groups by number and by group id."""

    def __init__(
        self,
        capacity: int,
        by_no: Callable[[int], Group | None],
        no_of: Callable[[str], int | None],
    ) -> None:
        super().__init__(capacity, by_no)
        self._no_of = no_of
        self._ids: dict[str, int] = {}

    def by_id(self, group_id: object) -> int | None:
        """The number of the group with `group_id`, or None."""
        if not isinstance(group_id, str):
            return None
        no = self._ids.get(group_id)
        if no is None and not self.complete:
            no = self._no_of(group_id)
        return no

    def add(self, item: Group) -> None:
        super().add(item)
        self._ids[item.group_id] = item.no

    def discard(self, no: int) -> Group | None:
        g = super().discard(no)
        if g is not None:
            self._ids.pop(g.group_id, None)
        return g

    def _no(self, item: Group) -> int:
        return item.no

    def _forget(self, item: Group) -> None:
        self._ids.pop(item.group_id, None)
