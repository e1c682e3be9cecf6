"""Pure maths that any room may use: the Pareto geometry of a front (`pareto`), intervals and verdicts over runs
on `scipy.stats` (`verdicts`), statistics over the order runs were measured in (`over_time`), the two-level
bootstrap of pooled percentiles (`bootstrap`), the sequential stopping rule of `bench.precision` (`precision`),
the order runs go in by design (`order`), the one model of a measurement from runs to the answer (`hierarchy`:
the server start as the replicate) and energy over a window from counters or power samples (`energy`). The
verdict of a winner's confirmation on that model is the confirmation's own (`raysweep.confirm.verdict`).

Stage-free. May import: `errors` only. Knows nothing of Ray, HTTP, the ledger or a campaign's directory.
"""
