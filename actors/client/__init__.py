"""What a driver process runs: the verbs of a broker handle (verbs), coalescing of concurrent
calls, the call loop, the direct channel to a broker, and `LocalBroker` (local): the same verbs
on an in-process broker. The Ray handle built on them is `actors.remote.client`.
"""
