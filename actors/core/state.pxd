# Build-only declarations (see locks.pxd): BrokerState compiles as an extension type.

cdef class BrokerState:
    cdef public object name, limits, counts, broker_id, catalog, keyring, locks, poison, cache
    cdef public object store, groups, endpoints, timers, _current, horizon, reruns, queues
    cdef public object parked, sending, next_endpoint, next_group, next_message, routes
    cdef public object forwarding, dialog_counts, transmission_count, turns
