"""How many finished runs passed their validity checks, failed one, or could not be judged on one: one count
and one sentence for `status`, `status --json` readers and the report, so that a run with a check nobody
could judge (its field not recorded) is never counted as one that passed it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from raysweep.drive.validity import CHECKS, unknown_checks
from raysweep.results.table import flagged

__all__ = ["ValidityCounts", "validity_counts"]


@dataclass(frozen=True)
class ValidityCounts:
    """Of `runs` finished runs: `failed` fail a check; `passed` were judged on every check and pass them all;
    `partly_judged` fail none but could not be judged on some (`not_judged`: runs per such check)."""

    runs: int
    failed: int
    passed: int
    partly_judged: int
    not_judged: dict[str, int] = field(default_factory=dict)

    def sentence(self) -> str:
        """`all 18 run(s) pass every check`, or `none of 18 run(s) fails a check; 2 pass every check, 16 were
        not judged on every check (not steady for 16)`, or `3 of 18 run(s) fail a check`."""
        if self.failed:
            text = f"{self.failed} of {self.runs} finished run(s) fail a check"
        elif not self.partly_judged:
            return f"all {self.runs} finished run(s) pass every check"
        else:
            text = (f"none of {self.runs} finished run(s) fails a check; {self.passed} pass every check, "
                    f"{self.partly_judged} were not judged on every check")
        return text + (f" (not judged, {self.gaps()})" if self.not_judged else "")

    def gaps(self) -> str:
        """Why checks were not judged, by check: `nothing recorded: not steady for 2 run(s); niced for 2 run(s)`,
        or `steady state too short to judge for 16 run(s)` where the run was judged for it and found too short."""
        unrecorded = "; ".join(f"{c} for {n} run(s)" for c, n in self.not_judged.items() if c not in _WHY)
        why = "; ".join(f"{_WHY[c]} for {n} run(s)" for c, n in self.not_judged.items() if c in _WHY)
        return "; ".join([f"nothing recorded: {unrecorded}"] * bool(unrecorded) + [why] * bool(why))

    def as_dict(self) -> dict[str, Any]:
        return {"runs": self.runs, "failed": self.failed, "passed": self.passed,
                "partly_judged": self.partly_judged, "not_judged": dict(self.not_judged), "checks": list(CHECKS)}


# a check that was looked at and could not be judged, by why (the run's `steady_state_note`): not "nothing recorded"
_WHY = {"steady state: too short": "steady state too short to judge",
        "steady state: too few requests": "steady state: too few requests to judge",
        "steady state: no request succeeded": "steady state: no request succeeded",
        "steady state: no output tokens": "steady state: no output tokens in the judged window"}


def _gaps(record: dict[str, Any]) -> list[str]:
    """The record's unjudged checks; the steady state's with the run's own reason where it recorded one."""
    note = str(record.get("steady_state_note") or "").removeprefix("not judged: ")
    out = []
    for check in unknown_checks(record):
        key = f"steady state: {note.split(' (')[0].split(' in the ')[0]}" if check == "not steady" else check
        out.append(key if key in _WHY else check)
    return out


def validity_counts(records: list[dict[str, Any]]) -> ValidityCounts:
    """The counts of these finished runs' records (`results.load_records`)."""
    bad = {id(r) for r in flagged(records)}
    gaps = [_gaps(r) for r in records]
    partly = sum(1 for r, g in zip(records, gaps) if g and id(r) not in bad)
    return ValidityCounts(runs=len(records), failed=len(bad), passed=len(records) - len(bad) - partly,
                          partly_judged=partly, not_judged=dict(Counter(c for g in gaps for c in g)))
