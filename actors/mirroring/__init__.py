"""Broker mirroring: a principal and a mirror of one broker on two nodes (no Ray here).

- `capture`: every transaction the principal's store commits, as its write statements, numbered;
- `replay`: the mirror applies them in order, or is rebuilt from a snapshot of the principal;
- `shipper`: ships the captured log to the mirror in batches; callers are answered only once the
  mirror holds their transaction (synchronous, "safety full");
- `roles`: the witness's record of who is principal (epochs, compare-and-set), failover rules;
- `choice`: routes with a mirror address (seed 001): which partner a sender sends to.

The Ray actors are in `actors.remote.mirrored`.
"""
