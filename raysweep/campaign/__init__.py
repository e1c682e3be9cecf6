"""The campaign file: its YAML schema, validation with field-path errors, and parameter resolution.

`load_campaign(path)` reads a YAML file and returns a `CampaignSpec`: the validated model, the resolved
parameter sets (files read, grids expanded, exclusions applied) and `${VAR}` references expanded.
Every problem raises `CampaignError` naming the field path and what would be accepted.

Rooms: `models` (the schema, each field with its own rule), `loading` (the file, parameter files and grids,
`${VAR}` expansion, `CampaignSpec`), `checks` (rules spanning several fields, and the registry through which
an owning layer such as tuning adds its own), `messages` (pydantic errors as field paths), `levels` (the
`bench.workload` schema and vLLM's rule for the levels), `slo` (the service-level vocabulary: SLA targets and
the `slo:` objective, the metrics they may name, whether values meet them), `schema` (the JSON Schema of a
campaign file).

May import: the stage-free rooms, `ledger`, `record` and `bench` (what a bench command means). Knows nothing
of Ray or processes.
"""

from raysweep.campaign.checks import register_check
from raysweep.campaign.loading import CampaignSpec, campaign_from_dict, load_campaign
from raysweep.campaign.models import (
    NATIVE_DEFAULT_CMD,
    BenchSpec,
    Campaign,
    ClientGuardSpec,
    CostSpec,
    EndpointSpec,
    EnvValue,
    NodeRule,
    OfflineSpec,
    Pin,
    PlacementSpec,
    ServeSpec,
    SlaSpec,
    TrackingSpec,
    TransportSpec,
    TuneBudget,
    TuneEarlyStop,
    TuneObjective,
    TuneParam,
    TuneSpec,
)

__all__ = ["NATIVE_DEFAULT_CMD", "BenchSpec", "Campaign", "CampaignSpec", "ClientGuardSpec", "CostSpec",
           "EndpointSpec", "EnvValue",
           "NodeRule", "OfflineSpec", "Pin", "PlacementSpec", "ServeSpec", "SlaSpec", "TrackingSpec", "TransportSpec",
           "TuneBudget",
           "TuneEarlyStop", "TuneObjective", "TuneParam", "TuneSpec", "campaign_from_dict", "load_campaign",
           "register_check"]
