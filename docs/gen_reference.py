"""The campaign file reference, generated from the pydantic models of `raysweep/campaign.py`.

The docs site builds it at build time (`docs/hooks.py`), so it cannot drift from the code.
`python docs/gen_reference.py` prints it.
"""

from __future__ import annotations

import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

try:
    from raysweep.campaign import Campaign
except ImportError:  # run from a checkout without an install
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from raysweep.campaign import Campaign

HEADER = """# Campaign file reference

Every key of the campaign YAML file, generated from the schema in `raysweep/campaign.py` when this site is
built. A key not listed here is refused, naming the closest accepted one. The [campaign file](campaign.md)
page walks through a whole file, the forms a parameter set (`params`) takes and how parameters become flags.
"""

_BOUNDS = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤"}


def _models_in(ann: Any) -> list[tuple[type[BaseModel], bool]]:
    """The models an annotation holds, each with whether it sits in a list."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [(ann, False)]
    found = []
    for arg in typing.get_args(ann):
        for model, in_list in _models_in(arg):
            found.append((model, in_list or typing.get_origin(ann) is list))
    return found


def _type_name(ann: Any) -> str:
    if ann is type(None):
        return "null"
    if ann is Any:
        return "any"
    origin = typing.get_origin(ann)
    if origin is typing.Literal:
        return " or ".join(f'"{a}"' for a in typing.get_args(ann))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(ann))
    if origin in (list, dict):
        inner = ", ".join(_type_name(a) for a in typing.get_args(ann))
        return f"{'list' if origin is list else 'mapping'} of {inner}" if origin is list else f"mapping ({inner})"
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return "section (below)"
    return getattr(ann, "__name__", str(ann))


def _constraints(info: FieldInfo) -> str:
    parts = []
    for meta in info.metadata:
        for attr, sign in _BOUNDS.items():
            value = getattr(meta, attr, None)
            if value is not None:
                parts.append(f"{sign} {value:g}")
        pattern = getattr(meta, "pattern", None)
        if pattern:
            parts.append(f"matches `{pattern}`")
    return ", ".join(parts)


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    value = info.default_factory() if info.default_factory is not None else info.default
    if value is PydanticUndefined:
        return "required"
    if isinstance(value, BaseModel):
        return "see below"
    if value is None or isinstance(value, bool):
        return f"`{str(value).lower() if value is not None else 'null'}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`" if not isinstance(value, str) else f'`"{value}"`'


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _section(model: type[BaseModel], path: str) -> list[str]:
    title = f"`{path}`" if path else "Top level"
    lines = [f"## {title}", "", (model.__doc__ or "").strip(), "",
             "| key | type | default | description |", "|---|---|---|---|"]
    for name, info in model.model_fields.items():
        kind = _type_name(info.annotation)
        bounds = _constraints(info)
        if bounds:
            kind = f"{kind} ({bounds})"
        lines.append(f"| `{name}` | {_cell(kind)} | {_cell(_default(info))} | {_cell(info.description or '')} |")
    return lines + [""]


def _walk(model: type[BaseModel], path: str, out: list[tuple[type[BaseModel], str]]) -> None:
    out.append((model, path))
    for name, info in model.model_fields.items():
        for sub, in_list in _models_in(info.annotation):
            sub_path = f"{path}.{name}" if path else name
            _walk(sub, sub_path + ("[]" if in_list else ""), out)


def campaign_reference() -> str:
    """The whole reference page, in Markdown."""
    sections: list[tuple[type[BaseModel], str]] = []
    _walk(Campaign, "", sections)
    lines = [HEADER]
    for model, path in sections:
        lines += _section(model, path)
    return "\n".join(lines)


if __name__ == "__main__":
    print(campaign_reference())
