"""The report's sections, registered where the report sees them.

A section is an anchor, a title, a place in the page (`order`: lower comes first) and what makes its HTML
(without the heading) from the report's data (`results.data.ReportData`), or None to leave it out. `applies`,
when given, says from the data whether the section can have anything to show; when it says no, the section is
left out without calling `make` (whose imports run only then: a campaign without `tune:` does not import
Optuna). The report's own sections register in `report.page`; a mode registers its section when its package
is imported (`raysweep.modes` imports every mode for the faces).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raysweep.registry import Registry

if TYPE_CHECKING:
    from raysweep.results.data import ReportData

__all__ = ["SECTIONS", "Section", "register", "sections"]


@dataclass(frozen=True)
class Section:
    """One section of the report (see the module docstring)."""

    sid: str
    title: str
    make: Callable[[ReportData], str | None]
    applies: Callable[[ReportData], bool] | None = None
    order: int = 0


SECTIONS: Registry[Section] = Registry("report section", "a room registers its sections when it is imported")


def register(section: Section) -> Section:
    """Add `section` to the report (a second registration of its id replaces the first)."""
    return SECTIONS.register(section.sid, section)


def sections() -> list[Section]:
    """Every registered section, in the page's order."""
    return sorted(SECTIONS.values(), key=lambda s: s.order)
