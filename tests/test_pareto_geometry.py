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


def _point_means_by_pandas(runs: pd.DataFrame, y: str = "tokens_per_gpu") -> pd.DataFrame:
    """`point_means` as it was written first: each point's interval by a pandas aggregate per point."""
    from raysweep.maths.verdicts import mean_interval
    from raysweep.results.rows import _POINT

    axes = list(dict.fromkeys(["tokens_per_user", y]))
    averaged = [c for c in dict.fromkeys(("output_throughput", "user_count", "gpus", "tokens_per_gpu", *axes))
                if c in runs.columns]
    groups = runs.groupby(_POINT, sort=False, dropna=False)
    values = runs[averaged].apply(pd.to_numeric, errors="coerce")
    added = {**values.groupby([runs[c] for c in _POINT], sort=False, dropna=False).mean(), "n_runs": groups.size()}
    for axis in axes:
        bounds = groups[axis].agg(lambda v: mean_interval(pd.to_numeric(v, errors="coerce").to_numpy(float))[1:])
        added[f"{axis}_low"] = bounds.map(lambda b: b[0])
        added[f"{axis}_high"] = bounds.map(lambda b: b[1])
    firsts = groups.first().drop(columns=averaged, errors="ignore")
    return pd.concat([firsts, pd.DataFrame(added, index=firsts.index)], axis=1).reset_index()


@pytest.mark.parametrize("seed", range(4))
def test_point_means_are_the_per_point_aggregates(seed):
    """The points' means and intervals read from the runs laid by point equal, to the bit, those of a pandas
    aggregate per point: runs of a point not next to each other, points of one run, NaN and missing values,
    a y axis that is not tokens per GPU."""
    from raysweep.results.front import point_means

    rng = random.Random(seed)
    rows = []
    for _ in range(rng.randint(1, 60)):
        s, b = rng.choice("ab"), rng.randint(0, 9)
        rows.append({"serve_id": s, "bench_id": f"b{b}", "label": f"{s}{b}", "output_throughput": rng.gauss(100, 9),
                     "user_count": float(b + 1), "gpus": 1.0, "tokens_per_user": rng.choice([rng.gauss(50, 5), None]),
                     "tokens_per_gpu": rng.gauss(100, 9), "j_per_output_token": rng.choice([rng.random(), math.nan])})
    runs = pd.DataFrame(rows).sample(frac=1.0, random_state=seed)
    for y in ("tokens_per_gpu", "j_per_output_token"):
        pd.testing.assert_frame_equal(point_means(runs, y), _point_means_by_pandas(runs, y), check_exact=True)
