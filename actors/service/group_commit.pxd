# Build-only declarations (see actors/core/locks.pxd): these compile as extension types.

cdef class _Waiting:
    cdef public object change, take, tag, request_id, shares, future

cdef class GroupCommit:
    cdef public object uow, after_commit, _queued, _loop, groups, changes
