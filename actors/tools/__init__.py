"""The operator's tools, on top of everything else: the `raybroker` command line (cli), the demo,
the benchmarks (bench), the fault verifier (verify) and the mirror commands. They drive whole
clusters, so they may import Ray.
"""
