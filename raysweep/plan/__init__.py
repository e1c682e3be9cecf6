"""The plan: a validated campaign expanded into server configurations x bench points x runs, each with a
stable id (`plan.plan`), and how long it will take (`plan.estimate`).

May import: the stage-free rooms and every earlier stage (`ledger`, `record`, `bench`, `campaign`). Knows nothing
of Ray.
"""
