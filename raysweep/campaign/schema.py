"""The JSON Schema of a campaign file, generated from the pydantic models of `raysweep.campaign`.

A copy is checked in as configs/raysweep-campaign.schema.json (a test keeps it equal to this one), so that
editors with the YAML language server complete and check campaign files that name it in a
`# yaml-language-server: $schema=raysweep-campaign.schema.json` comment.
"""

from __future__ import annotations

from typing import Any

from raysweep.campaign import Campaign

__all__ = ["SCHEMA_FILE", "campaign_schema"]

SCHEMA_FILE = "raysweep-campaign.schema.json"  # in configs/


def campaign_schema() -> dict[str, Any]:
    """The campaign file's JSON Schema (draft 2020-12)."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "raysweep campaign",
            **{k: v for k, v in Campaign.model_json_schema().items() if k != "title"}}
