# Build-only declarations (see locks.pxd): Changes compiles as an extension type.

cdef class Changes:
    cdef public object now, messages, arrivals, removals, transmission, touched, settled
    cdef public object new_endpoints, new_nos, dead_endpoints, new_groups, events, audit, undo
    cdef public object after, sent, passed, states, keys, _queued, _queued_n
