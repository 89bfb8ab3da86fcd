# Build-only declarations (see locks.pxd): the working sets compile as extension types.

cdef class WorkingSet:
    cdef public object capacity, _load, _items, _tracking, complete, misses, evicted

cdef class Endpoints(WorkingSet):
    cdef public object _load_handle, _load_conversation, _on_evict, _handles, _conversations

cdef class Groups(WorkingSet):
    cdef public object _no_of, _ids
