"""`--json`: one JSON document on stdout instead of the tables, for scripts and CI; progress and logs stay on
stderr. Each document has a `kind` and follows the JSON Schema `raysweep/schemas/<kind>.json` (docs/cli-json.md).

Non-finite numbers, which JSON lacks, are written as null (NaN: no value) or "inf" / "-inf" (an unbounded
SLA capacity, vLLM's infinite request rate), as results.json writes them."""

from __future__ import annotations

import json
import sys
from importlib import resources
from typing import TYPE_CHECKING, Any

import click

from raysweep.record.jsonvalues import jsonable

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeVar

    F = TypeVar("F", bound=Callable[..., Any])  # a command's function, as click's decorators hand it back

__all__ = ["JSON_COMMANDS", "json_option", "jsonable", "print_json", "schema"]

JSON_COMMANDS = ("status", "results", "compare", "tune", "sla", "validate", "report", "run", "history", "catalog list",
                 "catalog compare")
SCHEMA_VERSION = 1


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True,
                        help="Print one JSON document on stdout instead of the tables (progress and logs go to "
                             "stderr); its schema: raysweep/schemas, docs/cli-json.md.")(f)


def document(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    return jsonable({"kind": kind, "schema_version": SCHEMA_VERSION, **body})


def print_json(kind: str, body: dict[str, Any], one_line: bool = False) -> None:
    """Write the document to stdout, whole, as the only thing there; `one_line`: on one line, as each line
    of a stream of documents (JSON lines, `status --watch --json`) is."""
    sys.stdout.write(json.dumps(document(kind, body), indent=None if one_line else 2, allow_nan=False) + "\n")
    sys.stdout.flush()


def schema(kind: str) -> dict[str, Any]:
    """The JSON Schema of a `--json` document."""
    return json.loads(resources.files("raysweep.schemas").joinpath(f"{kind}.json").read_text())
