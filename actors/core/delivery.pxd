# Build-only declarations (see locks.pxd): Delivery compiles as an extension type.
from actors.core.work cimport Part

cdef class Delivery(Part):
    cdef public object route_first
