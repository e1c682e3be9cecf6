"""`design:`: how many server starts each configuration gets and how many runs of each point every start runs,
for a campaign that asks for verdicts.

A configuration's value is the mean over its server starts of each start's mean, so the replicate that compares
two configurations is the server start (`reference/statistics.md`, "Levels of replication"). Following Kalibera
and Jones ("Rigorous Benchmarking in Reasonable Time", ISMM 2013), the runs per start follow from the variance at
each level and the cost of each level, and the starts from the precision asked for
(`raysweep.plan.design` chooses them). This module holds the section's schema; the plan applies it as
`order.instances` (the starts, in interleaved blocks) and `runs` (starts x runs per start).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["DesignSpec", "MIN_STARTS", "PILOT", "PRECISION_MOVED"]

MIN_STARTS = 2  # fewer starts than this give no spread between starts to judge a difference by
PILOT = (3, 2)  # starts x runs per start where nothing is known: the least that estimates both levels' spread

# bench.precision's fields that have no place in a design, and what replaces them
PRECISION_MOVED = {"min_runs": "design.starts and design.runs_per_start",
                   "max_runs": "design.max_starts and design.max_runs_per_start",
                   "max_duration_s": "design.max_starts (the design's cost is in the estimate before it starts)"}


class DesignSpec(BaseModel):
    """`design:`: the server starts per configuration and the runs per start (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    starts: int | Literal["auto"] = Field("auto", description="server starts per configuration, in blocks ordered "
                                          "AB BA (at the same time where the cluster has room); auto: the fewest "
                                          "whose interval reaches rel_half_width, at least 3, at most max_starts")
    runs_per_start: int | Literal["auto"] = Field("auto", description="runs of each point per server start; auto: "
                                                  "from the spread between starts and between runs and the cost "
                                                  "of a start and of a run (Kalibera and Jones)")
    metric: str = Field("output_throughput", description="the per-run metric the precision is asked of")
    rel_half_width: float = Field(0.1, gt=0, lt=1, description="the interval of a configuration's value wanted "
                                  "within +- this fraction of it (0.1: +-10 %)")
    confidence: float = Field(0.95, gt=0, lt=1, description="the interval's two-sided confidence")
    max_starts: int = Field(6, ge=MIN_STARTS, le=64, description="the most server starts auto gives a "
                            "configuration")
    max_runs_per_start: int = Field(5, ge=1, le=100, description="the most runs per start auto gives a point")
    start_cv: float | None = Field(None, ge=0, lt=10, description="the spread of a start's mean between starts, as "
                                   "a fraction of the mean (e.g. 0.08), measured by an earlier campaign; unset: "
                                   "the pilot design (3 x 2)")
    run_cv: float | None = Field(None, ge=0, lt=10, description="the spread of a run's value between the runs of "
                                 "one start, as a fraction of the mean; unset: the pilot design (3 x 2)")
    start_s: float | None = Field(None, gt=0, description="what a server start costs, in s (start, warmup and "
                                  "stop); unset: the estimate's (measured in the output dir, else guessed)")
    run_s: float | None = Field(None, gt=0, description="what one run costs, in s; unset: the estimate's")

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, v: str) -> str:
        from raysweep.maths.precision import PrecisionSpec

        PrecisionSpec.model_validate({"metric": v, "rel_half_width": 0.5})  # the same metrics, the same message
        return v

    @field_validator("starts")
    @classmethod
    def _enough_starts(cls, v: int | str) -> int | str:
        if isinstance(v, int) and not MIN_STARTS <= v <= 64:
            raise ValueError(f"{v} server start(s): accepted {MIN_STARTS} to 64, or auto (one start per "
                             "configuration gives no verdict: leave `design:` out for that)")
        return v

    @field_validator("runs_per_start")
    @classmethod
    def _runs(cls, v: int | str) -> int | str:
        if isinstance(v, int) and not 1 <= v <= 100:
            raise ValueError(f"{v} run(s) per start: accepted 1 to 100, or auto")
        return v

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if data is True or data == "auto":
            return {}
        if isinstance(data, dict):
            for key, instead in PRECISION_MOVED.items():
                if key in data:
                    raise ValueError(f"`{key}` is bench.precision's (runs added inside one server start); a design "
                                     f"says {instead}")
        return data

    @property
    def known(self) -> bool:
        """Whether both levels' spreads were given (auto can then choose; else the pilot design)."""
        return self.start_cv is not None and self.run_cv is not None
