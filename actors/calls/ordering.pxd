# Build-only declarations (see actors/core/locks.pxd): these compile as extension types.

cdef class _Client:
    cdef public object next, seen, waiting

cdef class Sequencer:
    cdef public object gap_s, idle_s, clock, _clients, _sweep_at, skipped
