"""Trying raysweep on one machine: a lab of real hosts in network namespaces (`hosts`: each its own address,
hostname and Ray node; faults on their links), a slow or lossy relay between them (`relay`), a real Slurm on
them (`slurm`), and the demo's tiny dummy-weight model (`tiny_model`). The tests, the benchmarks, `raysweep lab`
and `raysweep tiny-model` use it; no stage of a campaign does.

May import: the stage-free rooms and every stage; no mode, no face.
"""
