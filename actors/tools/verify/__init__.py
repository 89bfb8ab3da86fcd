"""`raybroker verify`: the whole system under a fault schedule, every message checked.

`schedule` (the seeded fault schedule), `checker` (lost, doubled, out of order) and `report` are
pure; `workload`, `malformed`, `history` and `spark` drive brokers through their handles;
`cluster` and `faults` are the Ray side (the local multi-node cluster and the injectors); `run`
puts them together. Nothing here loads Ray on import.
"""
