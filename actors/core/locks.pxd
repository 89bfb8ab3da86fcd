# Build-only declarations (Cython reads them beside locks.py; Python never does): these classes
# compile as extension types, so their methods reach their own attributes as C fields rather
# than by a dictionary lookup each. Every field stays a Python object, as in locks.py.

cdef class QueueIndex:
    cdef public object pending, depth, removed, _key, _heap

cdef class LockTable:
    cdef public object default_lease_s, _prefix, _seq, by_id, by_group

cdef class Turn:
    cdef public object counted

cdef class Lock:
    cdef public object lock_id, group, queue, owner, expires_at, ready_key, first_id, last_id
    cdef public object count, received_at, turn, audit, settled, to_end
