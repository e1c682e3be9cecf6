"""One plug-in idiom (`raysweep.registry.Registry`) for the run's hooks, the report's sections, the bench backends
and the campaign checks; the campaign schema reads its backend names from the backends' registry."""

from __future__ import annotations

import pytest

from raysweep.bench import backend
from raysweep.campaign import checks
from raysweep.campaign.models import BenchSpec
from raysweep.drive import hooks
from raysweep.registry import Registry
from raysweep.report import registry as sections


def test_a_registry_lends_by_name_and_names_what_it_lacks():
    reg: Registry[int] = Registry("widget", "widgets register when their room is imported")
    assert reg.add("one")(1) == 1
    reg.register("two", 2)
    assert reg.get("two") == 2 and reg.names() == ["one", "two"] and "one" in reg and len(reg) == 2
    reg.register("one", 11)                    # a second registration replaces the first
    assert reg.get("one") == 11 and reg.values() == [11, 2]
    with pytest.raises(LookupError, match="no widget `three` is registered \\(known: `one`, `two`\\): widgets "
                                          "register when their room is imported"):
        reg.get("three")


def test_the_four_plug_in_kinds_are_registries():
    assert all(isinstance(r, Registry) for r in (hooks.LOADERS, sections.SECTIONS, backend.BACKENDS, checks.CHECKS))


def test_the_schema_takes_its_backend_names_from_the_registry(monkeypatch):
    assert backend.BACKENDS.names() == ["native", "command"]
    assert BenchSpec.model_json_schema()["properties"]["backend"]["enum"] == backend.BACKENDS.names()
    with pytest.raises(ValueError, match="'native' or 'command'"):
        BenchSpec(backend="nope")


def test_a_lent_part_is_loaded_when_first_asked_for_once_and_anew_after_a_second_lend():
    from raysweep.registry import Lenders

    loads: list[str] = []
    lenders = Lenders("part of the widget", "lent when its room is imported")
    lenders.register("a", lambda: loads.append("a") or "first")
    assert loads == []                          # lending costs nothing
    assert lenders.part("a") == lenders.part("a") == "first" and loads == ["a"]
    lenders.register("a", lambda: "second")
    assert lenders.part("a") == "second"
    with pytest.raises(LookupError, match="no part of the widget `b` is registered"):
        lenders.part("b")
