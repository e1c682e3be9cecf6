"""The Python API: `raysweep.load(dir_or_uri)` reads a campaign's results for a notebook or a script, and
`raysweep.run(campaign)` runs one. Reading never writes into the campaign's directory; tables are pandas
DataFrames, computed on first use and kept.

    import raysweep
    c = raysweep.load("results/demo-cpu")          # an output dir, a storage URI, or a `vllm bench sweep` dir
    c.results                                      # one row per run
    c.summary                                      # one row per point: mean, confidence interval, noise
    c.conclusions.headlines                        # the best configuration per bench shape, judged
    c.plot(var_y="p99_ttft_ms")                    # matplotlib figures
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import raysweep.modes  # noqa: F401 - every mode registered (the report's sections)
from raysweep.bench.load import CONCURRENCY

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from raysweep.drive.driver import RunSummary
    from raysweep.results.answer import Answer
    from raysweep.results.conclusions import Conclusions as _Conclusions

__all__ = ["Campaign", "Conclusions", "load", "run"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Conclusions:
    """What the report's first section says: per bench shape, the best configuration for the objective and
    whether its lead over the others is shown (`headlines`, one line each); `points` (one row per point with
    the objective's statistics), `fronts` (Pareto front per shape) and `sla` (capacities); `detail` is the
    full `raysweep.results.conclusions.Conclusions`."""

    headlines: list[str]
    objective: str
    points: pd.DataFrame
    fronts: dict[str, pd.DataFrame]
    sla: pd.DataFrame
    detail: _Conclusions | None = field(default=None, repr=False)
    answer: Answer | None = None  # the one answer every face renders (`to_dict()` for JSON)


class Campaign:
    """A campaign's output directory, read: a raysweep output dir (finished or running), a storage URI it is
    mirrored to (downloaded first), a `vllm bench sweep` dir or an imported one (results and summary only)."""

    def __init__(self, output_dir: str | Path) -> None:
        self.output_dir = Path(output_dir)

    def __repr__(self) -> str:
        return f"Campaign({str(self.output_dir)!r})"

    @property
    def is_raysweep(self) -> bool:
        from raysweep.ledger import LEDGER_FILE

        return (self.output_dir / LEDGER_FILE).is_file()

    @functools.cached_property
    def name(self) -> str:
        if not self.is_raysweep:
            return self.output_dir.name
        from raysweep.results.directory import CampaignDir

        with CampaignDir(self.output_dir) as campaign_dir:
            ledger = campaign_dir.ledger
            return ledger.meta("name") or self.output_dir.name

    @functools.cached_property
    def results(self) -> pd.DataFrame:
        """One row per finished run: its parameters, every metric (vLLM's names), placement, validity and
        provenance (the columns of results.parquet)."""
        from raysweep.results.importer import read_table

        return read_table(self.output_dir).df

    @functools.cached_property
    def summary(self) -> pd.DataFrame:
        """One row per point (server config x bench point): for each headline metric its mean, median,
        std, cv and 95 % confidence interval over the runs, whether the point is noisy, runs needed."""
        return self.aggregate()

    def aggregate(self, confidence: float = 0.95, threshold: float = 0.05,
                  noise_metrics: list[str] | None = None) -> pd.DataFrame:
        """The summary with other settings (`raysweep results --aggregate`)."""
        from raysweep.results.directory import CampaignDir

        return CampaignDir(self.output_dir).summary(confidence, threshold, results=self.results,
                                                   noise_metrics=noise_metrics)

    @functools.cached_property
    def conclusions(self) -> Conclusions | None:
        """The report's conclusions for the default objective (output tokens/s per GPU); None when no run is
        done or the dir is not a raysweep one. `conclude(objective)` for another."""
        return self.conclude()

    def conclude(self, objective: str | None = None) -> Conclusions | None:
        """The conclusions for `objective` (`[max:|min:]METRIC[_per_gpu]`, as `report --objective`)."""
        if not self.is_raysweep:
            return None
        from raysweep.report.page import conclusions_of
        from raysweep.results import conclusions

        c = conclusions_of(self.output_dir, objective)
        if c is None:
            return None
        return Conclusions(conclusions.headlines(c), c.objective.name, c.points, c.fronts, c.sla, c, c.answer)

    @functools.cached_property
    def sla(self) -> pd.DataFrame:
        """One row per SLA search (server config x bench point x target): the largest load meeting the target;
        empty without `sla:`."""
        from raysweep.results.importer import read_sla

        return read_sla(self.output_dir)[0]

    def status(self) -> dict[str, Any]:
        """Where the campaign stands, as `raysweep status --json` says it (raysweep/schemas/status.json)."""
        from raysweep.record.jsonvalues import jsonable
        from raysweep.results.directory import CampaignDir

        with CampaignDir(self.output_dir) as directory:
            return jsonable(directory.status_document())

    def plot(self, var_x: str = "total_token_throughput", var_y: str = "median_ttft_ms", *,
             out: str | Path | None = None, fmt: str = "png", dpi: int = 150, **spec: Any) -> list[Any]:
        """The curves `raysweep plot` draws (mean over runs, band for the spread), one figure per `fig_by`
        value: matplotlib Figures, or with `out` the paths of the files written there. `spec`: the other
        options of `raysweep plot` as keywords (row_by, col_by, curve_by, filter_by, bin_by, scale_x, ...)."""
        from raysweep.report import plots
        from raysweep.results.rows import load_variable, split_list

        lists = ("row_by", "col_by", "curve_by", "fig_by", "filter_by", "bin_by")
        options: dict[str, Any] = {k: split_list(v) if k in lists else v for k, v in spec.items()}
        ps = plots.PlotSpec(var_x=var_x, var_y=var_y, **options)
        df = self.results
        ps = plots.default_layout(df, ps, load_variable(df, ps.var_x))
        plans = plots.plan_curves(df, ps)
        if out is not None:
            return plots.write_plots(plans, ps, out, fmt, dpi)
        figures: list[Figure] = [plots.render(p, ps) for p in plans]
        return figures

    def pareto(self, user_count_var: str = CONCURRENCY, gpu_count_var: str = "gpu_count") -> pd.DataFrame:
        """The Pareto front of output tokens/s per user against output tokens/s per GPU (`raysweep pareto`)."""
        from raysweep.results.front import pareto

        return pareto(self.results, user_count_var, gpu_count_var, ()).front

    def compare(self, baseline: str | Path | Campaign, metrics: list[str] | None = None) -> pd.DataFrame:
        """This campaign against `baseline`: points matched by parameters, per metric both values, the ratio
        and the verdict (`raysweep compare BASELINE THIS`)."""
        from raysweep.results import compare

        base = baseline.output_dir if isinstance(baseline, Campaign) else baseline
        a, b = compare.distinct_names([compare.load_side(base), compare.load_side(self.output_dir)])
        return compare.compare(a, b, None, metrics).table

    def report(self, out: str | Path, objective: str | None = None) -> Path:
        """Write the HTML report to `out` (never into the campaign's directory unless `out` says so)."""
        from raysweep.report.page import write_report

        return write_report(self.output_dir, out, objective)


def load(dir_or_uri: str | Path) -> Campaign:
    """A campaign's results: an output directory, the storage URI it is mirrored to (`s3://`, `gs://`,
    `file://`..., downloaded into ~/.cache/raysweep/mirrors), a `vllm bench sweep` dir or an imported dir.

    :raises UserError: nothing readable is there.
    """
    from raysweep.errors import UserError
    from raysweep.record import storage

    path = storage.resolve_output(str(dir_or_uri))
    if not path.is_dir():
        raise UserError(f"raysweep.load({str(dir_or_uri)!r}): no such directory")
    return Campaign(path)


def run(campaign: str | Path | dict[str, Any], *, output_dir: str | Path | None = None, address: str | None = None,
        force: bool = False, retry_failed: bool = False, accept_changes: bool = False) -> Campaign:
    """Run a campaign (a YAML file, or its content as a dict) as `raysweep run` does, on an embedded Ray or
    the cluster at `address`, and return it loaded. The results table is written at the end; the run's
    counts are in `.last_run` (a `raysweep.drive.driver.RunSummary`). `accept_changes`: go on although what the
    finished points were measured with changed (`raysweep.record.drift`).

    :raises CampaignError: (a `UserError`) the campaign is invalid, naming the field (`.field`): the file or
        dict, its data files, a `serve.url` endpoint that does not answer as an OpenAI server, a `tracking`
        backend not installed or a URI it refuses. Nothing is started or written.
    :raises UserError: the output dir's ledger refuses the campaign (changed without `force`, another driver
        alive, changed measuring settings without `accept_changes`). Nothing is started.

    The checks before the start are `raysweep run`'s own (`raysweep.drive.checks`).
    """
    from raysweep.campaign import campaign_from_dict, load_campaign
    from raysweep.drive.checks import check_before_run, finished
    from raysweep.results.directory import default_path

    if isinstance(campaign, dict):
        spec = campaign_from_dict(campaign, base_dir=Path.cwd())
    else:
        spec = load_campaign(campaign)
    c = spec.campaign
    out = default_path(c.name, output_dir, c.output_dir)
    ended = finished(spec, out, retry_failed)
    if ended is not None:  # nothing left to run: answered from its files, without Ray
        done = Campaign(out)
        done.last_run = _summary(out, *ended)  # type: ignore[attr-defined]
        return done
    from raysweep.drive.driver import driver_cpus, ray_session, run_campaign
    from raysweep.errors import LedgerError
    from raysweep.results.table import write_results

    check_before_run(spec, out, force=force, accept_changes=accept_changes)
    summary: RunSummary | None = None
    refused = False
    try:
        with ray_session(address, driver_cpus(spec)):
            summary = run_campaign(spec, out, force=force, retry_failed=retry_failed, accept_changes=accept_changes,
                                   finish=write_results)
    except LedgerError:  # another driver took the campaign meanwhile: its results are not ours to write
        refused = True
        raise
    finally:
        if not refused:
            write_results(out)
    loaded = Campaign(out)
    loaded.last_run = summary  # type: ignore[attr-defined]
    return loaded


@dataclass
class _Finished:
    """What `.last_run` holds for a campaign that had nothing left to run (the fields of `RunSummary`, whose
    module would import Ray)."""

    output_dir: Path
    counts: dict[str, int]
    failures: list[Any] = field(default_factory=list)
    stopped_early: str | None = None


def _summary(output_dir: Path, counts: dict[str, int], failed: list[Any]) -> _Finished:
    return _Finished(output_dir, counts, failed)
