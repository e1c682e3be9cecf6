"""The README's sample output, made again from a demo's result directory (never copied by hand):
`python scripts/readme_sample.py results/demo-cpu [--readme README.md] [--no-figures] [--check]`.

It rewrites what lies between the markers `<!-- sample-output:begin -->` and `<!-- sample-output:end -->` in
the README: a line saying which run it comes from (the campaign, the date of its last finished point, the
machine's cores), then the lines `raysweep run` ends with: the report's path, the figures' paths and the
report's conclusions (one line per bench shape, `raysweep.results.conclusions.headlines`), exactly as `run`
prints them. The figures are drawn again into DIR/plots/ (what `raysweep plot DIR` draws) unless
`--no-figures`, which lists the ones already there. `--check` writes nothing and exits 1 when the README's
block differs from what DIR gives. Paths are shown as DIR was given (`results/demo-cpu` after `make demo`).

`--screenshot docs/img/report-first-screen.png` also takes the first screen (1366 x 900) of DIR/report.html
in headless Chromium (`scripts/install-browser.sh`), the figure docs/report.md shows.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BEGIN, END = "<!-- sample-output:begin -->", "<!-- sample-output:end -->"


def sample_lines(output_dir: Path, shown_as: str, figures: bool = True) -> list[str]:
    """What `raysweep run` prints at its end for this finished campaign: `Report: ...`, `Figures: ...` and the
    conclusions, with paths under `shown_as`."""
    from raysweep.record.directory import CampaignDir
    from raysweep.report.page import conclusions_of
    from raysweep.results.conclusions import headlines

    if figures:
        from raysweep.cli.analysing import default_figures

        drawn = default_figures(output_dir)[0]
    else:
        drawn = sorted((output_dir / "plots").glob("*.png"))
    with CampaignDir(output_dir) as directory:
        answer = conclusions_of(directory)
    shown = [f"{shown_as}/{Path(p).resolve().relative_to(output_dir.resolve())}" for p in drawn]
    return [f"Report: {shown_as}/report.html", f"Figures: {', '.join(shown)}",
            *(headlines(answer) if answer is not None else [])]


def when_line(output_dir: Path) -> str:
    """`From the run of campaign demo-cpu that ended 2026-11-28 15:27 UTC:`, from its ledger."""
    from raysweep.ledger import Ledger

    ledger = Ledger.open_existing(output_dir)
    try:
        name = ledger.meta("name")
        ended = max((p.ended_at or 0.0 for p in ledger.points()), default=0.0) or float(ledger.meta("created_at") or 0)
    finally:
        ledger.close()
    when = datetime.datetime.fromtimestamp(ended, tz=datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"From the run of campaign `{name}` that ended {when}, made again by `scripts/readme_sample.py`:"


def block(output_dir: Path, shown_as: str, figures: bool = True) -> str:
    """The text between the markers (their own lines excluded)."""
    return "\n".join([when_line(output_dir), "", "```", *sample_lines(output_dir, shown_as, figures), "```"])


def replace_block(readme: str, new: str) -> str:
    """`readme` with the text between the markers replaced by `new`.

    :raises ValueError: the markers are not there exactly once, in order."""
    if readme.count(BEGIN) != 1 or readme.count(END) != 1 or readme.index(BEGIN) > readme.index(END):
        raise ValueError(f"the README must hold {BEGIN} and then {END}, once each")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{new}\n{END}{tail}"


BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")


def screenshot(report: Path, png: Path, query: str = "", wait_ms: int = 0, size: str = "1366,900") -> None:
    """The first screen of `report` (with `query` after its URL) as `png`, taken by headless Chromium in a
    window of `size` (`WIDTH,HEIGHT`), after `wait_ms` of the page's own time (scripts that draw after the load).

    :raises RuntimeError: no Chromium on PATH, or it failed."""
    import shutil
    import subprocess

    exe = next((path for name in BROWSERS if (path := shutil.which(name))), None)
    if exe is None:
        raise RuntimeError(f"no headless Chromium ({', '.join(BROWSERS)}) on PATH: scripts/install-browser.sh")
    tmp = png.with_name(f".{png.name}.tmp.png")
    wait = [f"--virtual-time-budget={wait_ms}"] if wait_ms else []
    done = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *wait,
                           f"--screenshot={tmp}", f"--window-size={size}", report.resolve().as_uri() + query],
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0 or not tmp.is_file():
        raise RuntimeError(f"{exe} failed ({done.returncode}): {done.stderr[-1000:]}")
    os.replace(tmp, png)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir", help="a finished demo's result directory (results/demo-cpu after make demo)")
    parser.add_argument("--readme", default=str(ROOT / "README.md"))
    parser.add_argument("--no-figures", action="store_true", help="list the figures in DIR/plots, draw none")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when the README differs")
    parser.add_argument("--screenshot", metavar="PNG", help="also the first screen of DIR/report.html, as PNG")
    args = parser.parse_args(argv)
    out = Path(args.output_dir)
    readme = Path(args.readme)
    text = readme.read_text()
    new = replace_block(text, block(out, args.output_dir.rstrip("/"), figures=not args.no_figures))
    if args.check:
        if new != text:
            print(f"{readme}: the sample output differs from what {out} gives", file=sys.stderr)
            return 1
        return 0
    if new != text:
        tmp = readme.with_name(f".{readme.name}.tmp")
        tmp.write_text(new)
        os.replace(tmp, readme)
        print(f"{readme}: sample output made again from {out}")
    if args.screenshot:
        screenshot(out / "report.html", Path(args.screenshot))
        print(f"{args.screenshot}: the first screen of {out / 'report.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
