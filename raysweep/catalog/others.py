"""Other tools' result files: recognised by their content (`kind_of`) and read into catalogue rows."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from raysweep.errors import UserError

if TYPE_CHECKING:
    from raysweep.catalog.sources import Source

__all__ = ["kind_of", "read"]


def kind_of(path: Path) -> str | None:
    """The tool that wrote a JSON file, or None when it is none this reads."""
    return None


def read(kind: str, path: Path) -> Source:
    raise UserError(f"DIR {path}: {kind} output is not read yet")
