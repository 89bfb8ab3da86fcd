# Build-only declarations (see locks.pxd): these compile as extension types. (Not UnitOfWork:
# its hooks are set from outside, and tests watch its calls.)

cdef class _Group:
    cdef public object units, audit, touched, settled, requests, looked_up, found

cdef class _Shared:
    cdef public object w, request_ids

cdef class Part:
    cdef public object uow, state, store
