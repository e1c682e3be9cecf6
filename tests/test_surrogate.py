"""The Pareto tuner's model (raysweep.tune.surrogate): a Gaussian process fit, and the candidate whose optimistic
predicted points add the most hypervolume. Pure numpy."""

from __future__ import annotations

import math

import numpy as np

from raysweep.maths.pareto import hypervolume
from raysweep.tune.surrogate import GaussianProcess, best_addition


def test_the_process_fits_what_it_saw_and_knows_less_far_from_it():
    xs = [[x / 10] for x in range(0, 11, 2)]
    ys = [[math.sin(3 * x[0]), 2 * x[0]] for x in xs]
    gp = GaussianProcess.fit(xs, ys)
    mean, sd = gp.predict(xs)
    assert np.allclose(mean, ys, atol=0.05)
    _, near = gp.predict([[0.5]])
    _, far = gp.predict([[3.0]])
    assert (far > 5 * near).all()             # away from every observation, the uncertainty is large


def test_the_candidate_extending_the_front_is_chosen_over_one_behind_it():
    # one feature, two objectives to maximize that trade off along x: (x, 1 - x) run at 0.2 and 0.4
    xs = [[0.2], [0.4]]
    ys = [[0.2, 0.8], [0.4, 0.6]]
    run = [list(y) for y in ys]
    behind = [[0.3]]          # between the two points run: predicted on the line between them, adds little
    beyond = [[0.9]]          # far out along the trade-off, uncertain: its optimistic point adds much
    i, gain = best_addition(xs, ys, [behind, beyond], run, ["maximize", "maximize"], hypervolume)
    assert i == 1 and gain > 0


def test_nothing_to_go_on_proposes_nothing():
    assert best_addition([[0.1]], [[1.0, 1.0]], [[[0.2]]], [[1.0, 1.0]], ["maximize", "maximize"], hypervolume) is None
    assert best_addition([[0.1], [0.2]], [[1.0, 1.0], [2.0, 0.5]], [], [[1.0, 1.0]], ["maximize", "maximize"],
                         hypervolume) is None
