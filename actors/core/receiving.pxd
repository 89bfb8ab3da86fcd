# Build-only declarations (see locks.pxd): Receiving compiles as an extension type.
from actors.core.work cimport Part

cdef class Receiving(Part):
    cdef public object conversations
