"""Error messages of the campaign file: pydantic's validation errors as field paths, with what is accepted."""

from __future__ import annotations

import difflib
import typing
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from raysweep.campaign.models import Campaign
from raysweep.errors import CampaignError


def _did_you_mean(word: str, choices: set[str] | list[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _loc_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] = Campaign
    for part in loc:
        info = model.model_fields.get(str(part))
        ann = info.annotation if info else None
        options = typing.get_args(ann) or (ann,)  # `ServeSpec | None` is a union
        found = [a for a in options if isinstance(a, type) and issubclass(a, BaseModel)]
        if not found:
            return None
        model = found[0]
    return model


def _describe(err: ErrorDetails) -> str:
    kind, loc = err["type"], tuple(err["loc"])
    if kind == "extra_forbidden":
        parent = _model_at(loc[:-1])
        accepted = sorted(parent.model_fields) if parent else []
        return (f"unknown key{_did_you_mean(str(loc[-1]), accepted)}; accepted: {', '.join(accepted)}")
    if kind == "missing":
        model = _model_at(loc[:-1])
        info = model.model_fields.get(str(loc[-1])) if model else None
        what = f" ({info.description})" if info and info.description else ""
        return f"is required{what}"
    got = err.get("input")
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    return f"{msg[0].lower()}{msg[1:]} (got {got!r})"


def _campaign_error(exc: ValidationError) -> CampaignError:
    errors = exc.errors()
    lines = [f"{_loc_path(tuple(e['loc']))}: {_describe(e)}" for e in errors]
    first = _loc_path(tuple(errors[0]["loc"]))
    err = CampaignError(first, _describe(errors[0]))
    if len(lines) > 1:
        err.args = ("\n".join(lines),)
    return err
