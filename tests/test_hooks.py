"""The parts of the rooms above the run that it calls (`raysweep.drive.hooks`; the estimate's, `raysweep.plan.hooks`):
every one is lent once the modes are imported (as both faces do), each is what the run calls, and one nobody lent
stops the run by name. No Ray."""

from __future__ import annotations

import pytest

import raysweep.modes  # noqa: F401 - as the faces do
from raysweep.drive import hooks
from raysweep.plan import hooks as plan_hooks


def test_every_part_the_run_calls_is_lent_by_its_room():
    from raysweep.confirm import runs
    from raysweep.confirm.conclusions import confirmed
    from raysweep.confirm.estimate import with_confirmation
    from raysweep.levels import search
    from raysweep.offline.points import OfflinePoints
    from raysweep.report import tracking
    from raysweep.sla import book
    from raysweep.sla import plan as sla_plan
    from raysweep.sla.capacities import capacities
    from raysweep.sla.probe import SlaSearches
    from raysweep.sla.report import capacities_html
    from raysweep.tune.candidates import restore_plan
    from raysweep.tune.work import TunedCluster, TuneWork

    assert hooks.levels() is search
    assert hooks.sla_searches() is SlaSearches
    assert hooks.sla_book() is book
    assert hooks.sla_capacities() is capacities
    assert hooks.sla_capacities_html() is capacities_html
    assert hooks.offline_points() is OfflinePoints
    assert (hooks.tune().restore_plan, hooks.tune().TuneWork, hooks.tune().TunedCluster) == (
        restore_plan, TuneWork, TunedCluster)
    assert hooks.tracking() is tracking
    assert hooks.confirmation() is runs
    assert hooks.confirmed() is confirmed
    assert plan_hooks.confirmation() is with_confirmation
    assert plan_hooks.sla() is sla_plan


def test_a_part_nobody_lent_stops_the_run_with_its_name(monkeypatch):
    monkeypatch.setattr(hooks.LOADERS, "_items", {})
    monkeypatch.setattr(hooks.LOADERS, "_loaded", {})
    with pytest.raises(LookupError, match="`levels`.*import raysweep.modes"):
        hooks.levels()
    hooks.register("levels", lambda: "lent")
    assert hooks.levels() == "lent"
