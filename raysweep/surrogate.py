"""The Pareto tuner's model, now `raysweep.tune.surrogate`; this name stays for code that imports it here."""

from raysweep.tune.surrogate import GaussianProcess, best_addition

__all__ = ["GaussianProcess", "best_addition"]
