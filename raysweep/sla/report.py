"""SLA search's part of the report: the SLA capacities shown under the conclusions' cards (`capacities_html`, lent
to `raysweep.report.cards` through `raysweep.drive.hooks`). The report's SLA section, the table of every search as
the ledger recorded it, is the report's own (`raysweep.report.sections`): it is shown for every campaign."""

from __future__ import annotations

from raysweep.report.markup import esc, html_table
from raysweep.results.conclusions import Conclusions, rounded

__all__ = ["capacities_html"]


def capacities_html(c: Conclusions) -> str:
    """The SLA capacities the conclusions ranked (`raysweep.sla.capacities`), as the report shows them under its
    cards."""
    if c.sla.empty:
        return ""
    metric = str(c.sla["cheapest_metric"].iloc[0]) if "cheapest_metric" in c.sla.columns else ""
    rows = [[r["bench_label"], r["target"], r["serve_label"], r["largest_pass"], r["state"],
             *([rounded(r[f"{metric}_at_pass"]), "cheapest" if r["cheapest"] else ""] if metric else [])]
            for _, r in c.sla.iterrows()]
    cost = (f" Beside it, the {metric} of its runs at that load, and the cheapest configuration that meets the "
            "bound." if metric else "")
    return ("<h3>SLA capacities</h3><p>Per bench point and target, the largest load each server config meets it "
            f"at, best first (inf: met at every load tried).{esc(cost)}</p>"
            + html_table(["bench point", "target", "server config", "largest passing value", "search",
                          *([f"{metric} at it", ""] if metric else [])], rows))
