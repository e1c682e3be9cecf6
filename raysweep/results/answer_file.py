"""The campaign's answer kept beside its results (`answer.json`), written whole by `run` when it ends, so that
the faces that read many campaigns (`compare`, the catalogue, its site) render the answer the campaign gave
instead of computing another. A kept answer is used only while no point finished after it was written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from raysweep.record.files import write_json_atomic

__all__ = ["ANSWER_FILE", "keep_answer", "kept_answer"]

ANSWER_FILE = "answer.json"


def _finished(output_dir: Path) -> list[float]:
    from raysweep.record.directory import CampaignDir

    with CampaignDir(output_dir) as campaign_dir:
        done, last = campaign_dir.ledger.finished()
    return [float(done), float(last)]


def keep_answer(output_dir: str | Path, answer: Any) -> Path:
    """Write the answer (`raysweep.results.answer.Answer`) with the finished points it was made from."""
    out = Path(output_dir)
    return write_json_atomic(out / ANSWER_FILE, {"finished": _finished(out), "lines": answer.lines(),
                                                  "answer": answer.to_dict()})


def kept_answer(output_dir: str | Path) -> dict[str, Any] | None:
    """The kept answer ({lines, answer}) of a raysweep output dir, or None: none kept, or a point finished since
    (or the dir is not a raysweep campaign)."""
    out = Path(output_dir)
    path = out / ANSWER_FILE
    if not path.is_file():
        return None
    try:
        kept = json.loads(path.read_text())
        fresh = kept.get("finished") == _finished(out)
    except Exception:  # noqa: BLE001 - damaged or unreadable: as if none was kept
        return None
    return kept if fresh else None
