"""docs/layout.md's feature index ("Where each feature lives") is held true: for each feature, the modules that
take part in it, found from the code, are exactly those the table lists (a folder stands for every module in it).

A module takes part in a feature when it is one of the feature's own modules (by name), imports one of them
(function-level imports too), or reads the campaign section the feature owns (an attribute of that name).
`python tests/test_feature_index.py` prints the table as the code has it, to paste into docs/layout.md.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_imports import ROOT, import_graph, module_names  # noqa: E402

# feature -> (the pattern of its own modules' dotted names, the campaign attributes it owns)
FEATURES: dict[str, tuple[str, set[str]]] = {
    "SLA search (`sla:`)": (r"^raysweep\.(sla(\.|$)|campaign\.slo$)", {"sla"}),
    "load levels (`bench.workload`)": (r"^raysweep\.(levels(\.|$)|campaign\.levels$)", set()),
    "P/D deployments (`pd:`)": (r"(^|\.)pd(_\w+)?$", {"pd"}),
    "energy and cost (`energy:`)": (r"(^|\.)(energy|point_energy|rapl|power_sources|cost)$", {"energy"}),
    "precision (`bench.precision`)": (r"^raysweep\.(maths|results)\.precision$|^raysweep\.drive\.sequential$",
                                      {"precision"}),
    "designs of server starts (`design:`)": (r"^raysweep\.(campaign|plan)\.design$", {"design"}),
    "the confirmation (`confirm:`)": (r"^raysweep\.confirm(\.|$)", {"confirm"}),
    "endpoints that already run (`endpoint:`)": (r"^raysweep\.drive\.endpoint$", {"endpoint"}),
    "the lab (`raysweep lab`)": (r"^raysweep\.(lab(\.|$)|cli\.lab)$", set()),
}
LAYOUT = ROOT / "docs" / "layout.md"
HEADING = "## Where each feature lives"


def _path(module: str, modules: dict[str, Path]) -> str:
    return str(modules[module].relative_to(ROOT))


def taking_part() -> dict[str, set[str]]:
    """Each feature's modules, by path, as the code has them."""
    modules = module_names()
    graph = import_graph(modules)
    trees = {m: ast.parse(p.read_text()) for m, p in modules.items()}
    out = {}
    for feature, (pattern, attrs) in FEATURES.items():
        own = {m for m in modules if re.search(pattern, m)}
        found = own | {m for m in modules if graph[m] & own}
        found |= {m for m, tree in trees.items()
                  if attrs and any(isinstance(n, ast.Attribute) and n.attr in attrs for n in ast.walk(tree))}
        out[feature] = {_path(m, modules) for m in found}
    return out


def table(found: dict[str, set[str]]) -> str:
    """The index as markdown: a folder whose every module takes part is named once."""
    rows = ["| feature | files |", "|---|---|"]
    for feature, paths in found.items():
        folders = sorted({str(Path(p).parent) for p in paths})
        names = []
        for folder in folders:
            inside = sorted(p for p in paths if str(Path(p).parent) == folder)
            every = sorted(str(p.relative_to(ROOT)) for p in (ROOT / folder).glob("*.py"))
            names += [f"`{folder}/`"] if folder != "raysweep" and inside == every else [f"`{p}`" for p in inside]
        rows.append(f"| {feature} | {', '.join(names)} |")
    return "\n".join(rows)


def listed() -> dict[str, set[str]]:
    """The index as docs/layout.md has it, folders expanded to their modules."""
    text = LAYOUT.read_text()
    assert HEADING in text, f"docs/layout.md has no section '{HEADING}'"
    out = {}
    for line in text.split(HEADING, 1)[1].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or cells[0] in ("feature", "---"):
            continue
        paths: set[str] = set()
        for name in re.findall(r"`([^`]+)`", cells[1]):
            target = ROOT / name
            assert target.exists(), f"docs/layout.md lists {name} for {cells[0]}, which does not exist"
            paths |= ({str(p.relative_to(ROOT)) for p in target.glob("*.py")} if name.endswith("/")
                      else {name})
        out[cells[0]] = paths
    return out


def test_the_feature_index_lists_every_module_of_each_feature():
    found, have = taking_part(), listed()
    assert set(have) == set(found), f"features: the table has {sorted(have)}, the code {sorted(found)}"
    for feature in found:
        missing, extra = found[feature] - have[feature], have[feature] - found[feature]
        assert not missing and not extra, (
            f"{feature}: not listed {sorted(missing)}, listed but not taking part {sorted(extra)}; the table as the "
            f"code has it (python tests/test_feature_index.py):\n{table(found)}")


if __name__ == "__main__":
    print(table(taking_part()))
