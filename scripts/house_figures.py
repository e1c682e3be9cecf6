"""The floor plan of the raysweep package, counted from its imports: `python scripts/house_figures.py [ROOT]`.

Prints, as JSON, the figures that say whether the house is in order:
- the modules at the top of `raysweep/` and their share of the lines, the largest package and its share;
- the import arrows that run back up against the flow of the data, by module and by room, and the circles
  (strongly connected components) among modules and among rooms. Every `import` counts, function-level ones
  too; imports under `if TYPE_CHECKING:` do not (they never run);
- how many modules (and rooms) a mode touches: its own modules and every module below the faces that imports
  one of them (a package's `__init__` not counted);
- `output_dir`: the functions that take it, the rooms they lie in, and the arrows between those modules that
  climb back up.

A room is a package directly under `raysweep/` (or a top-level module on its own). Its floor is its place in
`FLOORS` of `tests/test_imports.py`: a stage may import only its own floor and those below; a mode sits above
the stages and imports no other mode; the faces sit on top. `--moves FILE` (lines `old/path.py new/path.py`,
or a folder for a folder) reads an older tree as if its modules already lay where FILE moves them: the figures
of a plan before the move.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
from pathlib import Path


def _graph_module():
    """`tests/test_imports.py`, which holds the floors (one order, kept by the test) and reads the import graph."""
    path = Path(__file__).resolve().parent.parent / "tests" / "test_imports.py"
    spec = importlib.util.spec_from_file_location("raysweep_test_imports", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_GRAPH = _graph_module()
FLOORS: list[tuple[str, ...]] = list(_GRAPH.FLOORS)
MODES = set(FLOORS[-2])
MODE_MODULES = {"SLA search": "sla", "load levels": "levels", "offline": "offline", "tune": "tune",
                "confirmation": "confirm", "endpoints": "drive.endpoint"}
module_paths = _GRAPH.module_names
components = _GRAPH.components
room_of = _GRAPH.room_of
floor_of = _GRAPH.floor_of


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """The test's import graph, without the arrows from a module to a package it lies in."""
    return {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in _GRAPH.import_graph(modules).items()}


def rename(module: str, moves: dict[str, str]) -> str:
    for old, new in sorted(moves.items(), key=lambda kv: -len(kv[0])):
        if module == old or module.startswith(old + "."):
            return new + module[len(old):]
    return module


def upward(src: str, dst: str) -> bool:
    """An arrow against the flow: to a higher floor, or from one mode to another."""
    a, b = room_of(src), room_of(dst)
    if a == b:
        return False
    fa, fb = floor_of(a), floor_of(b)
    if fa is None or fb is None:
        return True
    return fb > fa or (a in MODES and b in MODES)


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def output_dir_functions(paths: dict[str, Path]) -> dict[str, int]:
    out: dict[str, int] = {}
    for module, path in paths.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                if any(a.arg == "output_dir" for a in args):
                    out[module] = out.get(module, 0) + 1
    return out


def figures(root: Path, moves: dict[str, str]) -> dict[str, object]:
    paths = {rename(m, moves): p for m, p in module_paths(root).items()}
    raw = import_graph(module_paths(root))
    graph = {rename(m, moves): {rename(t, moves) for t in ts} for m, ts in raw.items()}
    total = sum(lines(p) for p in paths.values())
    top = [m for m in paths if m.count(".") == 1 and paths[m].name != "__init__.py"]
    packages: dict[str, int] = {}
    for m, p in paths.items():
        if m.count(".") >= 1 and m not in top:
            packages[room_of(m)] = packages.get(room_of(m), 0) + lines(p)
    biggest = max(packages, key=lambda k: packages[k])
    up = sorted((s, d) for s, ts in graph.items() for d in ts if upward(s, d))
    rooms: dict[str, set[str]] = {}
    for s, ts in graph.items():
        for d in ts:
            if room_of(s) != room_of(d):
                rooms.setdefault(room_of(s), set()).add(room_of(d))
    up_rooms = sorted({(room_of(s), room_of(d)) for s, d in up})
    touched = {}
    for name, prefix in MODE_MODULES.items():
        own = {m for m in graph if (m == f"raysweep.{prefix}" or m.startswith(f"raysweep.{prefix}."))
               and paths[m].name != "__init__.py"}
        users = {s for s, ts in graph.items() if ts & own and room_of(s) not in FLOORS[-1]
                 and s != f"raysweep.{prefix}"} - own
        touched[name] = {"modules": len(own | users), "own": len(own), "rooms": len({room_of(m) for m in own | users})}
    od = output_dir_functions(paths)
    od_climbs = sorted((s, d) for s, d in up if s in od and d in od)
    return {
        "modules": len(paths), "lines": total,
        "top-level modules": len(top),
        "top-level share of lines %": round(100 * sum(lines(paths[m]) for m in top) / total, 1),
        "largest package": biggest, "largest package share %": round(100 * packages[biggest] / total, 1),
        "rooms": len({room_of(m) for m in paths}),
        "upward arrows (modules)": len(up), "upward arrows (rooms)": len(up_rooms),
        "circles among modules": len(components(graph)),
        "circles among rooms": len(components(rooms)),
        "largest room circle": max((len(c) for c in components(rooms)), default=0),
        "modules a mode touches": touched,
        "output_dir functions": sum(od.values()), "output_dir modules": len(od),
        "output_dir rooms": len({room_of(m) for m in od}), "output_dir climbs": len(od_climbs),
        "upward arrow list": [f"{s} -> {d}" for s, d in up],
    }


def read_moves(path: Path | None) -> dict[str, str]:
    if path is None:
        return {}
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            old, new = line.split()[:2]
            out[old.removesuffix(".py").replace("/", ".")] = new.removesuffix(".py").replace("/", ".")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument("--moves", type=Path, help="lines `old new` read as already moved")
    parser.add_argument("--short", action="store_true", help="leave out the list of upward arrows")
    args = parser.parse_args()
    out = figures(Path(args.root), read_moves(args.moves))
    if args.short:
        out.pop("upward arrow list")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
