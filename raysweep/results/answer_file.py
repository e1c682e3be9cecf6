"""The campaign's answer kept beside its results (`answer.json`), written whole by `run` when it ends, so that
the faces that read many campaigns (`compare`, the catalogue, its site) render the answer the campaign gave
instead of computing another. A kept answer is used only while no point finished after it was written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysweep.record.files import write_json_atomic

if TYPE_CHECKING:
    from raysweep.record.directory import CampaignDir

__all__ = ["ANSWER_FILE", "keep_answer", "kept_answer"]

ANSWER_FILE = "answer.json"


def _finished(directory: CampaignDir) -> list[float]:
    done, last = directory.ledger.finished()
    return [float(done), float(last)]


def keep_answer(directory: CampaignDir, answer: Any) -> Path:
    """Write the answer (`raysweep.results.answer.Answer`) with the finished points it was made from."""
    return write_json_atomic(directory.path / ANSWER_FILE, {"finished": _finished(directory),
                                                             "lines": answer.lines(), "answer": answer.to_dict()})


def kept_answer(directory: CampaignDir) -> dict[str, Any] | None:
    """The kept answer ({lines, answer}) of a raysweep output dir, or None: none kept, or a point finished since
    (or the dir is not a raysweep campaign)."""
    path = directory.path / ANSWER_FILE
    if not path.is_file():
        return None
    try:
        kept = json.loads(path.read_text())
        fresh = kept.get("finished") == _finished(directory)
    except Exception:  # noqa: BLE001 - damaged or unreadable: as if none was kept
        return None
    return kept if fresh else None
