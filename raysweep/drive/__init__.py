"""The drive of a campaign: the driver, a server configuration's life, a bench point's life (reset, warmup,
runs, validity record), the runs `bench.precision` adds, recovery of what a dead driver left, endpoints that
already run, crosschecks and campaigns as Ray jobs. (Not `run`: `raysweep.run(campaign)` is the Python API.)

May import: every earlier stage (`ledger`, `record`, `bench`, `campaign`, `plan`, `place`, `serve`) and the
stage-free rooms. The optional modes (SLA search, load levels, offline points, tuning), the results and the
report sit above it: what the run calls of them, they lend it in `drive.hooks`.
"""
