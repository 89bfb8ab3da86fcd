# Build-only declarations (see actors/core/locks.pxd): these compile as extension types.

cdef class HeldWrites:
    cdef public object db, held, unit, broken

cdef class Savepoint:
    cdef public object writes, opened, held, outer
