"""Pure maths that any room may use: the Pareto geometry of a front, intervals and verdicts over runs on
`scipy.stats`, the sequential stopping rule of `bench.precision`, and the order runs go in by design (`order:`).

Stage-free: imports nothing of raysweep but `raysweep.errors`, and knows nothing of Ray, HTTP, the ledger
or a campaign's directory.
"""
