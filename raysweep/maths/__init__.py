"""Pure maths that any room may use: the Pareto geometry of a front (`pareto`), intervals and verdicts over runs
on `scipy.stats` (`verdicts`), statistics over the order runs were measured in (`over_time`), the two-level
bootstrap of pooled percentiles (`bootstrap`), the sequential stopping rule of `bench.precision` (`precision`),
the order runs go in by design (`order`), the verdict of a winner's confirmation (`confirmation`), the spread
between server starts (`start_spread`), each point's level at its server's start with the server's drift fitted
out (`start_level`) and energy over a window from counters or power samples (`energy`).

Stage-free. May import: `errors` only. Knows nothing of Ray, HTTP, the ledger or a campaign's directory.
"""
