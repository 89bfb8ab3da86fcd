"""`raybroker bench peers`: the same workloads on raybroker and on its peers (Redis Streams,
RabbitMQ, Ray's own queue, raw SQLite), each row checked for exactly-once and per-conversation
order. See docs/benchmarks.md for how each peer is configured."""
