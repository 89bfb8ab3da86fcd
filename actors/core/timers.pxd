# Build-only declarations (see locks.pxd): Timers compiles as an extension type.
from actors.core.work cimport Part

cdef class Timers(Part):
    cdef public object delivery, receiving, next_prune
