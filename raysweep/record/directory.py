"""A campaign's directory, the one object that the stages, the modes and both faces (the `raysweep` command and
the Python API) read it through: where it is by default (`default_path`: the one place that says
`results/NAME`), its ledger (opened once, on first use) and its records (one per finished run, as the run wrote
it). What is worked out of them sits with the results, which take a `CampaignDir`: its summary
(`raysweep.results.aggregate.summary_table`) and where it stands (`raysweep.results.status.status_document`:
what `raysweep status --json` prints and `raysweep.load(...).status()` returns). Reading through it never
writes into the directory; the run writes through the ledger it makes there (`raysweep.drive.driver`).
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Any

from raysweep.ledger import Ledger
from raysweep.record.runs import read_records

__all__ = ["DEFAULT_ROOT", "CampaignDir", "default_path"]

DEFAULT_ROOT = "results"  # a campaign without `output_dir:` or --output-dir writes under results/NAME


def default_path(name: str, given: str | Path | None = None, configured: str | Path | None = None) -> Path:
    """A campaign's directory: `given` (a command's --output-dir), else the campaign's `output_dir:`
    (`configured`), else results/NAME."""
    return Path(given or configured or f"{DEFAULT_ROOT}/{name}")


class CampaignDir:
    """One campaign's output directory (see the module docstring); a context manager that closes its ledger."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.given = str(path)  # as named, for the documents that say where it is
        self._ledger: Ledger | None = None
        self._owned = True  # its ledger is its own to close (`around`: lent by whoever opened it)

    @classmethod
    def around(cls, path: str | Path, ledger: Ledger) -> CampaignDir:
        """The directory at `path` read through a ledger already open there (the run's own, which the driver
        opened and closes): closing this one only lets go of it."""
        directory = cls(path)
        directory._ledger, directory._owned = ledger, False
        return directory

    @classmethod
    def of(cls, spec: Any, given: str | Path | None = None) -> CampaignDir:
        """The directory of a loaded campaign (`CampaignSpec`), `given` overriding where it is."""
        return cls(default_path(spec.campaign.name, given, spec.campaign.output_dir))

    @property
    def ledger(self) -> Ledger:
        """The directory's ledger, opened on first use and kept until `close`."""
        if self._ledger is None:
            self._ledger = Ledger.open_existing(self.path)
        return self._ledger

    def check(self) -> None:
        """Raise as `Ledger.open_existing` does when the directory holds no campaign's ledger (a command's
        first check); nothing is kept open."""
        if self._ledger is None:
            Ledger.open_existing(self.path).close()

    def close(self) -> None:
        if self._ledger is not None and self._owned:
            self._ledger.close()
        self._ledger = None

    def __enter__(self) -> CampaignDir:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __del__(self) -> None:  # one dropped without `close` (a caller's expression) closes its ledger with it
        if getattr(self, "_ledger", None) is not None and getattr(self, "_owned", True):
            self.close()

    def records(self) -> list[dict[str, Any]]:
        """One record per done point of the current plan, as its result file holds it
        (`raysweep.record.runs.read_records`)."""
        return read_records(self)
