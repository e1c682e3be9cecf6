"""Answers that hold over time, on the real vLLM CPU server: A/A campaigns and repeated demos.

`--mode aa` (the default) runs the CPU demo's design (configs/demo-cpu.yaml: its bench points, precision,
rounds and confirmation) with two identical server configurations: `max_num_seqs` 16 for both, told apart
only by `--max-log-len` 1000 and 1001, which does nothing while request logging is off (vLLM's default).
Each sitting is a fresh campaign in its own output directory, one after another. Target: no sitting names a
winner (the headline's verdict is not "better" / no green card) in 5 of 5 sittings.

`--mode demos` runs the demo campaign itself N times, fresh, one after another, and checks how well each
sitting's intervals hold the others: for every point (configuration x load) and every ordered pair of
sittings (i, j), whether sitting i's reported 95 % interval of output throughput holds sitting j's estimate
(target: at least 90 % of cases; `held_centres` also counts the cases where it holds the middle of sitting j's
interval, the level j estimates), and whether the leader is the same in all sittings or called tied (or
not confirmed better). Each sitting's wall time is recorded (the demo's target: within 6 minutes). On the
design's model (`design:`) it also checks the answer: the same leader, or "not shown", in every sitting
(`leader_same_or_not_shown`), and each sitting's interval of the lead (leader over runner-up, t over server
starts) holding the other sittings' leads in at least 90 % of pairs (`lead_coverage`; `met_answer`).
`--name` names the record (default aa or demos).

    .venv/bin/python benchmarks/bench_aa.py --model DIR [--mode aa|demos] [--sittings 5] [--work /tmp/aa]
    .venv/bin/python benchmarks/bench_aa.py --mode demos --reread

`--reread` runs nothing: it reads the recorded sittings' output directories again with the current code (a
change to the analysis, measured on the same runs) and writes demos-reread.json / aa-reread.json beside the
record, which it leaves as it was.

`--model`: the tiny model `raysweep tiny-model DIR` writes. Writes benchmarks/results/aa.json (or
demos.json) and a Markdown table beside it; exits 0 when the target was met, 1 when not, 2 on bad input.
The machine's load average before and after each sitting is recorded: on a shared machine the figures are
measured with other work running and say so.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from raysweep.record.directory import CampaignDir

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "configs" / "demo-cpu.yaml"
RESULTS = ROOT / "benchmarks" / "results"
METRIC = "output_throughput"


def _campaign(mode: str, out: Path, model: str) -> Path:
    """The campaign file of one sitting: the demo, or the demo with two identical configurations."""
    data = yaml.safe_load(DEMO.read_text())
    data["output_dir"] = str(out)
    data["report"] = True
    if mode == "aa":
        data["name"] = "demo-cpu-aa"
        data["serve"]["params"] = {"grid": {"max_num_seqs": [16], "max_log_len": [1000, 1001]}}
    f = out.parent / f"{out.name}.yaml"
    f.write_text(yaml.safe_dump(data, sort_keys=False))
    return f


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def _sitting(mode: str, work: Path, i: int, model: str) -> dict[str, Any]:
    out = work / f"{mode}-{i}"
    f = _campaign(mode, out, model)
    env = {**os.environ, "RAYSWEEP_DEMO_MODEL": model, "PYTHONPATH": str(ROOT)}
    before, t0 = _load(), time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "raysweep", "run", str(f)], env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    res: dict[str, Any] = {"sitting": i, "exit": proc.returncode, "wall_s": round(wall, 1),
                           "load_before": round(before, 2), "load_after": round(_load(), 2), "out": str(out)}
    if proc.returncode != 0:
        res["error"] = (proc.stderr or proc.stdout)[-2000:]
        return res
    res.update(_read(out))
    return res


def _read(out: Path) -> dict[str, Any]:
    """What a sitting answered: its headline, whether it names a winner, every point's estimate and interval."""
    import raysweep.modes  # noqa: F401 - every mode registered (the confirmation's verdict), as the faces do
    from raysweep.results.conclusions import headlines
    from raysweep.results.data import answer_of, read_data

    with CampaignDir(out) as directory:
        answer = answer_of(read_data(directory))
    points = {}
    for _, r in answer.points.iterrows():
        key = f"{r['serve_label']} @ max_concurrency={r.get('max_concurrency')}"
        points[key] = {"mean": float(r["objective_mean"]), "low": float(r["objective_ci_low"]),
                       "high": float(r["objective_ci_high"]), "runs": int(r.get("runs") or 0),
                       "ci_method": str(r.get("ci_method") or "")}
    v = answer.verdicts[0] if answer.verdicts else None
    against = getattr(v, "against", None) if v is not None else None
    lead = None
    if against is not None and math.isfinite(getattr(against, "ratio", math.nan)):
        lead = {"lead": against.ratio - 1, "low": against.low - 1, "high": against.high - 1,
                "level": against.level, "word": against.word, "starts": [against.starts_a, against.starts_b],
                "over": None if v.runner_up is None else str(v.runner_up["serve_label"])}
    return {"headline": headlines(answer), "points": points, "lead": lead,
            "leader": None if v is None else str(v.leader["serve_label"]),
            "winner_named": bool(v is not None and v.clear),
            "confirmed": None if v is None or v.confirmation is None else bool(v.confirmation.significant),
            "tied": [] if v is None else list(v.tied)}


def _coverage(sittings: list[dict[str, Any]], of: str = "mean") -> tuple[int, int]:
    """How many (point, ordered pair of sittings) cases have sitting i's interval holding sitting j's `of`:
    `mean` (its estimate) or `centre` (the middle of its interval: the level it estimates, which is its level
    at its server's start where the summary fitted the server's drift)."""
    held = total = 0
    ok = [s for s in sittings if "points" in s]
    for a in ok:
        for b in ok:
            if a is b:
                continue
            for key, pa in a["points"].items():
                pb = b["points"].get(key)
                if pb is None:
                    continue
                total += 1
                value = pb["mean"] if of == "mean" else (pb["low"] + pb["high"]) / 2
                held += pa["low"] <= value <= pa["high"]
    return held, total


def _oriented(s: dict[str, Any], leader: str) -> tuple[float, float, float] | None:
    """A sitting's lead and its interval as the ratio of `leader` over the other configuration (inverted where the
    sitting's own leader is the other one); None where the sitting compared other configurations."""
    lead = s["lead"]
    ratio, low, high = 1 + lead["lead"], 1 + lead["low"], 1 + lead["high"]
    if s["leader"] == leader:
        return ratio, low, high
    if lead.get("over") == leader and ratio > 0:
        return 1 / ratio, (1 / high if high > 0 else math.nan), (1 / low if low > 0 else math.inf)
    return None


def _lead_coverage(sittings: list[dict[str, Any]]) -> tuple[int, int]:
    """How many ordered pairs of sittings (i, j) have sitting i's interval of the lead (the most frequent leader over
    the other configuration, every sitting's ratio turned that way) holding sitting j's lead."""
    held = total = 0
    ok = [s for s in sittings if s.get("lead") and math.isfinite(s["lead"]["lead"])]
    if not ok:
        return 0, 0
    leaders = [s["leader"] for s in ok]
    leader = max(set(leaders), key=leaders.count)
    turned = [t for s in ok if (t := _oriented(s, leader)) is not None]
    for i, a in enumerate(turned):  # a sitting with no interval (one start a side) is held, never holds
        if not (math.isfinite(a[1]) and math.isfinite(a[2])):
            continue
        for j, b in enumerate(turned):
            if i != j:
                total += 1
                held += a[1] <= b[0] <= a[2]
    return held, total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="the tiny model `raysweep tiny-model DIR` wrote")
    ap.add_argument("--mode", choices=("aa", "demos"), default="aa")
    ap.add_argument("--sittings", type=int, default=5)
    ap.add_argument("--work", default="/tmp/raysweep-aa", help="where the sittings' output dirs go")
    ap.add_argument("--name", default=None, help="the record's file name in benchmarks/results (default: aa or demos)")
    ap.add_argument("--reread", action="store_true",
                    help="run nothing: read the recorded sittings' output dirs again with today's code and write "
                         "aa-reread / demos-reread beside the record")
    args = ap.parse_args()
    name = args.name or ("aa" if args.mode == "aa" else "demos")
    if args.reread:
        record = RESULTS / f"{name}.json"
        if not record.is_file():
            print(f"--reread: no record {record} to read again", file=sys.stderr)
            return 2
        sittings = json.loads(record.read_text())["sittings"]
        for s in sittings:
            if s.get("exit") == 0 and Path(s["out"]).is_dir():
                s.update(_read(Path(s["out"])))
        return _write(args.mode, f"{name}-reread", sittings, len(sittings),
                      {"reread_at": time.strftime("%Y-%m-%d %H:%M")})
    if args.sittings < 1 or not args.model or not (Path(args.model) / "config.json").is_file():
        print("--sittings must be at least 1 and --model a directory `raysweep tiny-model` wrote", file=sys.stderr)
        return 2
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    sittings = []
    for i in range(args.sittings):
        s = _sitting(args.mode, work, i, str(Path(args.model).resolve()))
        sittings.append(s)
        print(json.dumps({k: v for k, v in s.items() if k != "points"}), flush=True)
    return _write(args.mode, name, sittings, args.sittings, {"at": time.strftime("%Y-%m-%d %H:%M")})


def _write(mode: str, name: str, sittings: list[dict[str, Any]], asked: int, when: dict[str, str]) -> int:
    """The sittings' summary against the targets, written to `name`.json and .md; 0 when met, 1 when not."""
    done = [s for s in sittings if "points" in s]
    summary: dict[str, Any] = {"mode": mode, "sittings": len(sittings), "finished": len(done),
                               "nproc": os.cpu_count(), **when}
    if mode == "aa":
        named = sum(s["winner_named"] for s in done)
        summary.update(winner_named=named, met=len(done) == asked and named == 0)
    else:
        held, total = _coverage(done)
        centres = _coverage(done, "centre")[0]
        leaders = {s["leader"] for s in done}
        lead_held, lead_pairs = _lead_coverage(done)
        named = {s["leader"] for s in done if s["winner_named"]}
        summary.update(held=held, cases=total, coverage=held / total if total else None, held_centres=centres,
                       leaders=sorted(str(x) for x in leaders),
                       leader_same_or_tied=len(leaders) <= 1 or all(s["tied"] or s["confirmed"] is False for s in done),
                       # the answer: the same leader, or "not shown", in every sitting (no two winners named)
                       leader_same_or_not_shown=len(leaders) <= 1 or len(named) == 0 or (
                           len(named) == 1 and all(s["winner_named"] is False or s["leader"] in named for s in done)),
                       lead_held=lead_held, lead_pairs=lead_pairs,
                       lead_coverage=lead_held / lead_pairs if lead_pairs else None,
                       within_5_min=sum(s["wall_s"] <= 300 for s in done),
                       within_6_min=sum(s["wall_s"] <= 360 for s in done))
        summary["met"] = bool(total and held / total >= 0.9 and summary["leader_same_or_tied"]
                              and len(done) == asked)
        summary["met_answer"] = bool(lead_pairs and lead_held / lead_pairs >= 0.9
                                     and summary["leader_same_or_not_shown"] and len(done) == asked)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({"summary": summary, "sittings": sittings}, indent=1))
    lines = [f"# {name}: {summary}", "", "| sitting | exit | wall s | load before/after | leader | winner named | "
             "lead [interval] | headline |", "|---|---|---|---|---|---|---|---|"]
    for s in sittings:
        lead = s.get("lead")
        said = "" if not lead else f"{lead['lead']:+.1%} [{lead['low']:+.1%}, {lead['high']:+.1%}]"
        lines.append(f"| {s['sitting']} | {s['exit']} | {s['wall_s']} | {s['load_before']}/{s['load_after']} | "
                     f"{s.get('leader')} | {s.get('winner_named')} | {said} | {' '.join(s.get('headline') or [])} |")
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print(json.dumps(summary))
    return 0 if summary["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
