"""A server's life: host actors that launch `vllm serve` on its nodes, the guard that outlives no driver,
readiness, start-up phases, compilation caches, provenance, GPU telemetry and the `/metrics` scrape, and the
live server that the driver sees; the tiny demo model that tests and demos serve.

May import: the stage-free rooms, `campaign`, `plan`, `ledger`, `record` and `place`. Knows nothing of the
grid's expansion or of how a bench point is judged.
"""
