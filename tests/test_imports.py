"""The import graph of the raysweep package has no circle.

Every `import` and `from ... import` of a raysweep module is an edge, wherever it stands (a function-level
import runs too, only later); imports under `if TYPE_CHECKING:` are not (they never run). `from pkg import
name` is an edge to the submodule `pkg.name` when there is one, else to `pkg`. The parent packages a module's
import runs first are not edges: a package's `__init__` re-exporting its rooms would otherwise close a circle
with every room that imports a sibling. Nor are the imports inside a package `__init__`'s module-level
`__getattr__` (a name loaded on first use, PEP 562): they run for the caller that asks the package for that
name, never while the package itself is imported, so the edge is the caller's.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "raysweep"


def module_names(root: Path = ROOT) -> dict[str, Path]:
    """The modules of the package under `root`, by dotted name (a package by its own name)."""
    out = {}
    for path in (root / "raysweep").rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module, package_init: bool) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if package_init and node is tree and isinstance(child, ast.FunctionDef) and child.name == "__getattr__":
                continue
            if isinstance(child, ast.If) and _type_checking(child):
                for sub in child.orelse:
                    walk(sub)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            walk(child)
    walk(tree)
    return found


def _base(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    package = package[:len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def import_graph(modules: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """Each module's edges to the modules its imports run (`scripts/house_figures.py` draws from it too)."""
    modules = module_names() if modules is None else modules
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for node in _imports(ast.parse(path.read_text(), str(path)), path.name == "__init__.py"):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = _base(module, path, node)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                while target and target not in modules:  # `import raysweep.x.y` of a name inside a module
                    target = target.rpartition(".")[0]
                if target in modules and target != module:
                    graph[module].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component of more than one module, as a path through it."""
    return [_circle(graph, comp) for comp in components(graph)]


def components(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _circle(graph: dict[str, set[str]], comp: list[str]) -> list[str]:
    """A shortest circle through the first module of a component, for the message."""
    start, members = comp[0], set(comp)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & members):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    return comp


def test_the_graph_sees_the_imports_that_matter():
    graph = import_graph()
    assert "raysweep.campaign.models" in graph["raysweep.campaign.loading"]    # from raysweep.campaign.models import
    assert "raysweep.grid" in graph["raysweep.campaign.loading"]              # from raysweep import grid
    assert "raysweep.tune.surrogate" in graph["raysweep.tune.proposals"]     # from raysweep.tune import surrogate
    assert "raysweep.plan.estimate" in graph["raysweep.tune.dry_run"]             # a function-level import
    # its names load on first use (__getattr__); its Tuning section registers, made on first use; it lends itself
    # to the run (raysweep.drive.hooks)
    assert graph["raysweep.tune"] == {"raysweep.drive.hooks", "raysweep.report.registry",
                                      "raysweep.tune.report_section"}


def test_the_cycle_finder_finds_a_circle_and_names_it():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_among_raysweep_modules():
    graph = import_graph()
    found = components(graph)
    assert not found, "import circles:\n" + "\n".join(
        f"{' -> '.join(_circle(graph, comp))} (modules in the circle: {', '.join(comp)})" for comp in found)


def test_the_campaign_schema_imports_nothing_of_tuning():
    graph = import_graph()
    for module in [m for m in graph if m == "raysweep.campaign" or m.startswith("raysweep.campaign.")]:
        assert not {t for t in graph[module] if t.startswith("raysweep.tune")}, module


def test_the_loader_runs_tunings_check_without_the_caller_importing_tuning(tmp_path):
    """The check is registered by `raysweep.tune.space`, which the loader imports when `tune:` is set."""
    import subprocess
    import sys

    import yaml

    data = {"name": "t", "serve": {"cmd": "vllm serve m"}, "bench": {"params": [{"max_concurrency": 1}]},
            "tune": {"space": {"max_num_seqs": {"low": 256, "high": 64}}, "objective": {"metric": "output_throughput"},
                     "budget": {"candidates": 2}}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    code = ("import sys\nfrom raysweep.campaign import load_campaign\nfrom raysweep.errors import CampaignError\n"
            "assert not any(m.startswith('raysweep.tune') for m in sys.modules)\n"
            f"try:\n    load_campaign({str(path)!r})\nexcept CampaignError as e:\n    print('refused', e.field)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.strip() == "refused tune.space.max_num_seqs"


# -- the floors: a stage imports only its own room and earlier stages; modes above the stages; faces on top ----

# The rooms of `raysweep/` from the ground up; rooms on one floor may import each other (no circle among them).
FLOORS: list[tuple[str, ...]] = [
    # stage-free: used by every stage
    ("raysweep", "version", "registry", "errors", "procs", "grid", "vllm_plugin", "maths", "schemas"),
    ("ledger", "record"),            # what is kept: the SQLite ledger, whole-or-nothing files, mirrors, drift
    ("bench",),                      # the client: what a bench command means, and running it
    ("campaign",),                   # the campaign file, validated
    ("plan",),                       # its expansion to configurations x points x runs, estimates
    ("place",),                      # where each configuration goes: topology, bundles, the scheduler, checks
    ("serve",),                      # a server's life
    ("drive",),                      # the driver, a configuration's and a point's life
    ("results",),                    # the merged table, statistics, verdicts, conclusions, compare
    ("report",),                     # figures, the page and its sections, export, tracking
    ("catalog",),                    # every campaign in one place: the catalogue, history, the site
    ("lab",),                        # trying it on one machine: real hosts, a Slurm on them, the tiny model
    ("tune", "sla", "levels", "offline", "confirm"),  # the optional modes: above the stages, never one another
    ("cli", "api", "modes", "__main__"),   # the faces
]
MODES = set(FLOORS[-2])

# Imports that still run against the flow, each to be cut (a function moved to the room it belongs in, or a
# value passed in instead of imported); the list may only shrink.
SEAMS_TO_CUT: set[tuple[str, str]] = set()


def room_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def floor_of(room: str) -> int | None:
    return next((n for n, rooms in enumerate(FLOORS) if room in rooms), None)


def against_the_flow(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """The imports from a room to a higher floor, or from one mode to another."""
    out = set()
    for src, targets in graph.items():
        for dst in targets:
            a, b = room_of(src), room_of(dst)
            if a != b and (floor_of(b) > floor_of(a) or (a in MODES and b in MODES)):
                out.add((src, dst))
    return out


def test_every_room_has_a_floor_and_says_what_it_is_for():
    for module in import_graph():
        assert floor_of(room_of(module)) is not None, f"{module}: its room is on no floor of FLOORS"
    for init in PACKAGE.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and "import" in doc, f"{init.parent.name}/__init__.py: say what the room is for and may import"


def test_the_floor_finder_sees_an_import_that_runs_back_up():
    graph = {"raysweep.plan.plan": {"raysweep.results.table"}, "raysweep.results.table": {"raysweep.plan.plan"},
             "raysweep.sla.probe": {"raysweep.levels.search"}, "raysweep.cli.x": {"raysweep.tune.y"}}
    assert against_the_flow(graph) == {("raysweep.plan.plan", "raysweep.results.table"),
                                       ("raysweep.sla.probe", "raysweep.levels.search")}


def test_imports_run_with_the_flow_of_the_data():
    """A stage imports only its own room and earlier stages, a mode no other mode, the faces whatever they
    call; function-level imports count (they run too). The seams still to cut are listed, and only shrink."""
    found = against_the_flow(import_graph())
    new = sorted(found - SEAMS_TO_CUT)
    assert not new, "imports against the flow (move the code to its room, or pass the value in):\n" + "\n".join(
        f"{a} -> {b}" for a, b in new)
    cut = sorted(SEAMS_TO_CUT - found)
    assert not cut, "seams cut (remove them from SEAMS_TO_CUT):\n" + "\n".join(f"{a} -> {b}" for a, b in cut)


def test_no_circle_among_rooms_but_through_the_seams_to_cut():
    graph = import_graph()
    rooms: dict[str, set[str]] = {}
    for src, targets in graph.items():
        rooms.setdefault(room_of(src), set()).update(
            room_of(t) for t in targets if room_of(t) != room_of(src) and (src, t) not in SEAMS_TO_CUT)
    assert not components(rooms), f"circles among rooms: {components(rooms)}"


# The load of a bench point is typed (raysweep/bench/load.py: `Load`, and the names `CONCURRENCY`, `RATE`,
# `VARIABLES`, `LoadVariable`): no other module spells a load variable as a string, column names included
# (they are the same names, so the files read as before). The exceptions, each for its reason:
LOAD_NAMES = ("max_concurrency", "request_rate")
SPELLS_LOAD_NAMES = {
    "raysweep/bench/load.py": "names the two variables",
    "raysweep/bench/options.py": "the client's option parser: each `vllm bench serve` option by its name, these "
                                 "two among some eighty",
    "raysweep/bench/checks.py": "the client's checks: vLLM's own defaults, option by option",
    "raysweep/catalog/others.py": "AIPerf's key `request_rate` in its own files (another tool's name, not ours)",
    "raysweep/catalog/br.py": "Benchmark Report v0.2's key `request_rate` (llm-d's format's name, not ours)",
}


def load_name_literals(path: Path) -> int:
    """The string literals of a module that are exactly a load variable's name (docstrings and longer texts
    that mention one are not)."""
    return sum(isinstance(n, ast.Constant) and n.value in LOAD_NAMES for n in ast.walk(ast.parse(path.read_text())))


def test_the_load_variables_are_named_once():
    spelled = {str(p.relative_to(ROOT)): n for p in sorted(PACKAGE.rglob("*.py")) if (n := load_name_literals(p))}
    assert not set(spelled) - set(SPELLS_LOAD_NAMES), (
        "use raysweep.bench.load's CONCURRENCY, RATE or VARIABLES, not the string: "
        + ", ".join(f"{m} ({n})" for m, n in spelled.items() if m not in SPELLS_LOAD_NAMES))
    assert set(spelled) == set(SPELLS_LOAD_NAMES), f"no longer spelled there: {set(SPELLS_LOAD_NAMES) - set(spelled)}"


def test_the_load_literal_finder_sees_a_name_and_not_a_text(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('"""Per max_concurrency."""\nx = {"max_concurrency": 1}\ny = "request_rate"\nz = "request_rates"\n')
    assert load_name_literals(f) == 2


# -- each room's `__init__` says what it may import, and says it true ------------------------------------------

STAGE_FREE = set(FLOORS[0]) - {"raysweep"}


def may_import(room: str, doc: str) -> set[str] | None:
    """The rooms that the sentence `May import: ...` of a room's docstring allows (its own not included), or None
    where the docstring has no such sentence. Backticked room names count, and the phrases `the stage-free rooms`,
    `every earlier stage`, `every stage` (up to the report) and `every room`."""
    text = " ".join(doc.split())
    start = text.find("May import:")
    if start < 0:
        return None
    sentence = text[start + len("May import:"):].split(". ")[0]
    floor = floor_of(room)
    assert floor is not None
    allowed = {name for name in re.findall(r"`([a-z_]+)`", sentence) if floor_of(name) is not None}
    if "stage-free" in sentence:
        allowed |= STAGE_FREE
    if "every earlier stage" in sentence:
        allowed |= {r for rooms in FLOORS[:floor] for r in rooms} - {"raysweep"}
    if "every stage" in sentence:
        allowed |= {r for rooms in FLOORS[:10] for r in rooms} - {"raysweep"}  # up to the report
    if "every room" in sentence:
        allowed |= {r for rooms in FLOORS for r in rooms} - {"raysweep"}
    return allowed - {room}


def test_each_room_says_what_it_may_import_and_the_floors_agree():
    """Each room's `May import:` line names only rooms on its floor or below it (a mode no other mode), and every
    room its modules import is among them (the package itself, `raysweep`, counts as stage-free)."""
    graph = import_graph()
    imported: dict[str, set[str]] = {}
    for src, targets in graph.items():
        imported.setdefault(room_of(src), set()).update(room_of(t) for t in targets)
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        room = init.parent.name
        allowed = may_import(room, ast.get_docstring(ast.parse(init.read_text())) or "")
        assert allowed is not None, f"{room}/__init__.py: no `May import:` sentence"
        floor = floor_of(room)
        assert floor is not None
        above = {r for r in allowed if (floor_of(r) or 0) > floor or (room in MODES and r in MODES)}
        assert not above, f"{room}/__init__.py says it may import {sorted(above)}, above its floor in FLOORS"
        used = imported.get(room, set()) - {room, "raysweep"}
        assert used <= allowed, f"{room}/__init__.py leaves out rooms it imports: {sorted(used - allowed)}"


def test_the_may_import_reader_reads_names_and_phrases():
    assert may_import("record", "May import: the stage-free rooms and `ledger`. Knows nothing.") == (
        STAGE_FREE | {"ledger"})
    assert may_import("plan", "May import: `campaign`.") == {"campaign"}
    assert "catalog" not in (may_import("sla", "A mode. May import: every stage; never another mode.") or set())
    assert may_import("plan", "Says nothing of imports.") is None
