# Build-only declarations (see locks.pxd): CorePort compiles as an extension type.
from actors.core.work cimport Part

cdef class CorePort(Part):
    cdef public object delivery, name, broker_id, limits
