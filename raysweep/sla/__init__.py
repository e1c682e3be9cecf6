"""The SLA mode: targets, their judgment over runs, the search for the largest concurrency or request rate
that meets them (`sla.search`), and its probes against a live server (`sla.probe`).

A mode: may import every stage and the stage-free rooms, never another mode.
"""
