"""A campaign's directory, the one object that both faces (the `raysweep` command and the Python API) read it
through: where it is by default (`default_path`: the one place that says `results/NAME`), its ledger (opened
once, on first use), its records (one row per finished run), its summary (one row per point) and where it
stands (`status_document`: what `raysweep status --json` prints and `raysweep.load(...).status()` returns).
Reading never writes into the directory.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from raysweep import grid
from raysweep.ledger import Ledger, PointState

if TYPE_CHECKING:
    import pandas as pd

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
        if self._ledger is not None:
            self._ledger.close()
            self._ledger = None

    def __enter__(self) -> CampaignDir:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def records(self) -> list[dict[str, Any]]:
        """One record per finished run, as its result file holds it."""
        from raysweep.results.table import load_records

        return load_records(self.path)

    def summary(self, confidence: float = 0.95, threshold: float = 0.05, results: pd.DataFrame | None = None,
                noise_metrics: list[str] | None = None) -> pd.DataFrame:
        """One row per point: the statistics over its runs (`raysweep results --aggregate`)."""
        from raysweep.results import aggregate

        return aggregate.summary_table(self.path, confidence, threshold, results=results, noise_metrics=noise_metrics)

    def status_document(self) -> dict[str, Any]:
        """Where the campaign stands (raysweep/schemas/status.json)."""
        from raysweep.plan.cost import campaign_spend
        from raysweep.plan.estimate import eta_s, measured_from
        from raysweep.results.table import flagged
        from raysweep.results.validity_story import validity_counts
        from raysweep.serve import hardware

        ledger = self.ledger
        counts, points, servers = ledger.counts(), ledger.points(), ledger.servers()
        name, driver = ledger.meta("name"), ledger.last_driver()
        stored = ledger.stored_campaign()
        block = stored.get("cost")
        live = False
        if driver is not None and driver["ended_at"] is None:  # modules imported only where they are needed
            from raysweep.drive.recovery import driver_alive

            live = driver_alive(driver["hostname"], driver["pid"], driver["pid_create_time"])
        precision = None
        if (stored.get("bench") or {}).get("precision"):
            from raysweep.results.precision import precision_counts

            precision = precision_counts(ledger)
        spec = None
        if block:
            from raysweep.campaign import CostSpec

            spec = CostSpec.model_validate(block)
        running = {s.serve_id for s in servers if s.stopped_at is None} if live else set()
        configs = []
        for serve_id in dict.fromkeys(p.serve_id for p in points):
            pts = [p for p in points if p.serve_id == serve_id]
            n = {st: sum(1 for p in pts if p.state == st) for st in PointState}
            left = n[PointState.PENDING] + n[PointState.RUNNING]
            configs.append({"serve_id": serve_id, "params": pts[0].serve_params,
                            "label": grid.combo_label(pts[0].serve_params) or "base command",
                            "done": n[PointState.DONE], "failed": n[PointState.FAILED], "left": left,
                            "total": len(pts),
                            "state": "running" if serve_id in running else "finished" if not left else "waiting"})
        left_runs = [(p.serve_id, p.bench_id) for p in points if p.state in (PointState.PENDING, PointState.RUNNING)]
        eta = eta_s(left_runs, measured_from(self.path), running, max(1, len(running))) if left_runs else 0.0
        records = self.records() if counts.get("done") else []
        bad = flagged(records)
        judged = validity_counts(records)
        total = {k: counts.get(k, 0) for k in ("done", "running", "failed", "pending")}
        return {
            "campaign": name, "output_dir": self.given, "counts": {**total, "total": sum(counts.values())},
            "complete": not total["pending"] and not total["running"] and not live,
            "driver": None if not driver else {"pid": driver["pid"], "hostname": driver["hostname"], "alive": live,
                                               "outcome": driver["outcome"]},
            "server_configs": configs, "eta_s": eta,
            "servers_running": [{"server_id": s.server_id, "serve_id": s.serve_id, "port": s.port,
                                 "state": s.state} for s in servers if s.stopped_at is None and live],
            "validity": {"runs": len(records), "flagged": len(bad), "passed": judged.passed,
                         "partly_judged": judged.partly_judged, "not_judged": judged.not_judged,
                         "flagged_runs": [{"point_id": r.get("point_id"), "issues": r.get("validity_issues")}
                                          for r in bad],
                         "hardware_mixed": hardware.mixed(records)},
            "failures": [{"point_id": p.point_id, "serve_id": p.serve_id, "bench_id": p.bench_id, "run": p.run,
                          "attempts": p.attempts_made, "error": p.error}
                         for p in points if p.state == PointState.FAILED],
            "spend": campaign_spend(spec, servers),
            "precision": precision,
        }
