# Build-only declarations (see locks.pxd): ReadCache compiles as an extension type.

cdef class ReadCache:
    cdef public object max_bytes, bytes, _runs, _taken, _sizes, _counts
