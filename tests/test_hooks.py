"""The parts of the rooms above the run that it calls (`raysweep.drive.hooks`): every one is lent once the modes
are imported (as both faces do), each is what the run calls, and one nobody lent stops the run by name. No Ray."""

from __future__ import annotations

import pytest

import raysweep.modes  # noqa: F401 - as the faces do
from raysweep.drive import hooks


def test_every_part_the_run_calls_is_lent_by_its_room():
    from raysweep.levels import search
    from raysweep.offline.points import OfflinePoints
    from raysweep.report import tracking
    from raysweep.results.data import winner_pairs
    from raysweep.sla.probe import SlaSearches
    from raysweep.tune.candidates import restore_plan
    from raysweep.tune.work import TunedCluster, TuneWork

    assert hooks.levels() is search
    assert hooks.sla_searches() is SlaSearches
    assert hooks.offline_points() is OfflinePoints
    assert (hooks.tune().restore_plan, hooks.tune().TuneWork, hooks.tune().TunedCluster) == (
        restore_plan, TuneWork, TunedCluster)
    assert hooks.tracking() is tracking
    assert hooks.winners() is winner_pairs


def test_a_part_nobody_lent_stops_the_run_with_its_name(monkeypatch):
    monkeypatch.setattr(hooks.LOADERS, "_items", {})
    monkeypatch.setattr(hooks, "_LOADED", {})
    with pytest.raises(LookupError, match="`levels`.*import raysweep.modes"):
        hooks.levels()
    hooks.register("levels", lambda: "lent")
    assert hooks.levels() == "lent"
