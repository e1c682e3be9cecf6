"""raysweep: vLLM serving benchmark sweeps across a Ray cluster.

A campaign (one YAML file) is expanded into a plan of server configurations x benchmark points x runs;
the driver runs them on Ray, every finished point lands in a durable SQLite ledger, and the results are
merged into one table.
"""

__version__ = "0.1.0"
