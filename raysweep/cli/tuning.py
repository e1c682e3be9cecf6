"""`raysweep tune OUTPUT_DIR`: the leaderboard of a tuning campaign's candidates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from raysweep.cli._common import OUTPUT_DIR, main, out, print_table
from raysweep.cli.jsonout import json_option, print_json
from raysweep.errors import UserError


@main.command()
@click.argument("output_dir", type=OUTPUT_DIR)
@click.option("--top", type=click.IntRange(min=1), default=None, help="Show only the first N candidates.")
@click.option("--csv", "csv_out", type=click.Path(dir_okay=False), default=None,
              help="Also write the leaderboard to this CSV file (nothing is written without it).")
@json_option
def tune(output_dir: str, top: int | None, csv_out: str | None, as_json: bool) -> None:
    """The candidates of a tuning campaign, best first: objective, state, parameters, GPU-hours, the
    validity of their runs and their SLA verdicts."""
    from raysweep.campaign import TuneSpec
    from raysweep.record.directory import CampaignDir
    from raysweep.tune import leaderboard, objective_names

    with CampaignDir(output_dir) as campaign_dir:
        ledger = campaign_dir.ledger
        campaign, rows, points, searches = (ledger.stored_campaign(), ledger.candidates(), ledger.points(),
                                            ledger.searches())
    if not campaign.get("tune"):
        raise UserError(f"{output_dir}: not a tuning campaign (its campaign has no tune: section)")
    if not rows:
        if as_json:
            print_json("tune", {"output_dir": output_dir, "objectives": [], "candidates": [], "written": []})
            return
        out.print("no candidate yet")
        return
    t = TuneSpec.model_validate(campaign["tune"])
    names = objective_names(t)
    board = leaderboard(campaign, rows)[:top]
    validity = _validity(Path(output_dir), points)
    verdicts = _sla_verdicts(searches)
    table = Table("rank", "#", "state", *names, "parameters", "GPUs", "GPU-h", "validity", "SLA", "reason")
    lines = []
    for r in board:
        objs = r["objective"] or [None] * len(names)
        cells = [str(r["rank"]), str(r["number"]), r["state"] + (" *" if r.get("on_front") else ""),
                 *("-" if v is None else f"{v:.4g}" for v in objs), _params(r["params"]), str(r["gpu_count"]),
                 f"{r['gpu_s'] / 3600:.2f}", validity.get(r["serve_id"], "-"), verdicts.get(r["serve_id"], "-"),
                 r["reason"] or ""]
        table.add_row(*(escape(c) for c in cells))
        lines.append(cells)
    if csv_out:
        import csv
        import io

        from raysweep.record.files import write_text_atomic

        text = io.StringIO()
        w = csv.writer(text)
        w.writerow(["rank", "number", "state", *names, "parameters", "gpu_count", "gpu_hours", "validity", "sla",
                    "reason"])
        w.writerows(lines)
        write_text_atomic(csv_out, text.getvalue())
    if as_json:
        print_json("tune", {"output_dir": output_dir, "objectives": names, "candidates": [
            {"rank": r["rank"], "number": r["number"], "state": r["state"], "on_front": bool(r.get("on_front")),
             "objective": list(r["objective"] or [None] * len(names)), "params": r["params"],
             "serve_id": r["serve_id"], "gpu_count": r["gpu_count"], "gpu_hours": r["gpu_s"] / 3600,
             "validity": validity.get(r["serve_id"]), "sla": verdicts.get(r["serve_id"]), "reason": r["reason"]}
            for r in board], "written": [csv_out] if csv_out else []})
        return
    print_table(table, out)
    if len(names) == 2:
        out.print("* on the Pareto front of the candidates")
    if csv_out:
        out.print(csv_out, highlight=False)


def _params(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def _validity(output_dir: Path, points: list[Any]) -> dict[str, str]:
    """Per configuration: 'ok' when every finished run passed the validity checks, else 'N flagged'."""
    import json

    flagged: dict[str, int] = {}
    done: dict[str, int] = {}
    for p in points:
        if p.state != "done" or not p.result_path:
            continue
        done[p.serve_id] = done.get(p.serve_id, 0) + 1
        try:
            ok = json.loads((output_dir / p.result_path).read_text()).get("validity_ok")
        except (OSError, ValueError):
            continue
        if ok is False:
            flagged[p.serve_id] = flagged.get(p.serve_id, 0) + 1
    return {sid: (f"{flagged[sid]}/{n} flagged" if flagged.get(sid) else f"ok ({n} runs)") for sid, n in done.items()}


def _sla_verdicts(searches: list[dict[str, Any]]) -> dict[str, str]:
    """Per configuration: each SLA target's largest passing load (bench points joined)."""
    by: dict[str, list[str]] = {}
    for s in searches:
        cap = s["largest_pass"]
        by.setdefault(s["serve_id"], []).append(f"{s['target']}: {'none' if cap is None else f'{cap:g}'}")
    return {sid: "; ".join(v) for sid, v in by.items()}
