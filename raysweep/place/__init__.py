"""Placement: the cluster's topology, GPU shapes to placement-group bundles, the scheduler stepped one event at
a time against a cluster interface, preflight of every node, and the transport and fabric checks of a link.

May import: the stage-free rooms, `campaign`, `plan`, `ledger` and `record`. Knows nothing of how a server or
a benchmark works inside.
"""
