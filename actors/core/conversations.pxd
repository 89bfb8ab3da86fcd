# Build-only declarations (see locks.pxd): Conversations compiles as an extension type.
from actors.core.work cimport Part

cdef class Conversations(Part):
    cdef public object delivery, _ops, _ended
