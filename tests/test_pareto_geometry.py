"""The Pareto geometry (raysweep.maths.pareto) shared by tuning and the Pareto plot: the front as one sweep is
the set the pairwise definition gives, in every direction, with ties and identical points."""

from __future__ import annotations

import math
import random

import pandas as pd
import pytest

from raysweep.maths.pareto import _dominates, pareto_front
from raysweep.results.front import pareto_front as table_front


def pairwise(points, directions):
    return [i for i, p in enumerate(points) if not any(_dominates(q, p, directions) for q in points)]


@pytest.mark.parametrize("directions", [("maximize", "maximize"), ("minimize", "maximize"),
                                        ("maximize", "minimize"), ("minimize", "minimize")])
def test_the_sweep_finds_the_pairwise_front(directions):
    rng = random.Random(7)
    for _ in range(500):
        pts = [(rng.choice([1.0, 2.0, 3.0, 4.5]), rng.choice([1.0, 2.0, 3.0])) for _ in range(rng.randint(0, 12))]
        assert pareto_front(pts, directions) == pairwise(pts, directions), pts


def test_identical_points_all_or_once_and_nan_never():
    pts = [(1.0, 3.0), (2.0, 2.0), (2.0, 2.0), (1.0, 1.0), (math.nan, 9.0), (9.0, math.nan)]
    assert pareto_front(pts, ("maximize", "maximize")) == [0, 1, 2]
    assert pareto_front(pts, ("maximize", "maximize"), distinct=True) == [0, 1]


def test_the_plots_front_is_the_shared_one():
    df = pd.DataFrame({"tokens_per_user": [10.0, 20.0, 20.0, 5.0, 20.0],
                       "tokens_per_gpu": [50.0, 40.0, 40.0, 50.0, 30.0]})
    front = table_front(df)
    assert list(zip(front["tokens_per_user"], front["tokens_per_gpu"])) == [(10.0, 50.0), (20.0, 40.0)]
