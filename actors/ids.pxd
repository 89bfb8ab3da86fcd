# Build-only declarations (see actors/core/locks.pxd): RandomBytes compiles as an extension type.

cdef class RandomBytes:
    cdef public object _buffer, _at
