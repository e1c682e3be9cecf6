"""The winners the confirmation runs again: each bench shape's leader and runner-up, as the conclusions name them
and the report shows them (`raysweep.results.data`: read once, `answer_of`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from raysweep.results.data import answer_of, read_data

if TYPE_CHECKING:
    from raysweep.record.directory import CampaignDir

__all__ = ["winner_pairs"]


def winner_pairs(directory: CampaignDir, objective: str | None) -> list[list[str]]:
    """(serve id, bench id, role, shape) of each leader and runner-up the conclusions name, as the report
    names them: what `confirm:` runs again on fresh servers (read through the directory's ledger)."""
    answer = answer_of(read_data(directory, objective))
    pairs = []
    for v in answer.verdicts:
        if v.runner_up is None:
            continue
        pairs += [[str(v.leader["serve_id"]), str(v.leader["bench_id"]), "leader", v.shape],
                  [str(v.runner_up["serve_id"]), str(v.runner_up["bench_id"]), "runner-up", v.shape]]
    return pairs
