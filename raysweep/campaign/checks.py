"""Checks of a campaign that span several fields or need the resolved parameters (the rules of one field
sit beside it, in `raysweep.campaign.models`).

Each raises `CampaignError` naming the field at fault. A layer that owns a section (tuning) registers its
own check with `register_check`, so the schema knows nothing of it.
"""

from __future__ import annotations

import importlib
import shlex
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysweep import grid
from raysweep.campaign.messages import _did_you_mean
from raysweep.campaign.models import Campaign
from raysweep.errors import CampaignError
from raysweep.registry import Registry

if TYPE_CHECKING:
    from typing import TypeVar

    T = TypeVar("T")  # what a check returns

Origins = list[str | None]  # per combination: the parameter file entry it comes from, if any


Check = Callable[[Campaign, list[dict[str, Any]], list[dict[str, Any]]], None]

# section -> the module that owns its checks and registers them when imported; the loader imports it by name
# when the section is set, so the schema depends on no owner
SECTION_OWNERS = {"tune": "raysweep.tune.space"}
CHECKS: Registry[list[Check]] = Registry("campaign check", "a section's owner registers its checks when imported")


def register_check(section: str, check: Check) -> None:
    """Run `check(campaign, serve_combos, bench_combos)` on every campaign that sets `section`."""
    checks = CHECKS.get(section) if section in CHECKS else CHECKS.register(section, [])
    if check not in checks:
        checks.append(check)


def run_registered_checks(campaign: Campaign, serve_combos: list[dict[str, Any]],
                          bench_combos: list[dict[str, Any]]) -> None:
    """The owning layers' checks of the sections this campaign sets (serve and bench combos resolved)."""
    for section, owner in SECTION_OWNERS.items():
        if getattr(campaign, section) is not None and section not in CHECKS:
            importlib.import_module(owner)
    for section in CHECKS:
        if getattr(campaign, section, None) is not None:
            for check in CHECKS.get(section):
                check(campaign, serve_combos, bench_combos)


def _reraise_at(check: Callable[[], T], origin: str | None) -> T:
    """Run a check; a refusal names the parameter file entry the combination comes from."""
    try:
        return check()
    except CampaignError as exc:
        if origin is None or origin in exc.message:
            raise
        raise CampaignError(exc.field, f"{origin}: {exc.message}") from None


def _refuse(fld: str, message: str) -> None:
    raise CampaignError(fld, message)


def _check_mode(campaign: Campaign) -> None:
    """Each mode has its own sections: serve + bench, or offline."""
    if campaign.mode == "serve":
        for part in ("serve", "bench"):
            if getattr(campaign, part) is None:
                raise CampaignError(part, "is required (mode: serve); for a sweep without a server write "
                                          "`mode: offline` and an `offline:` section")
        if campaign.offline is not None:
            raise CampaignError("offline", "is only for `mode: offline`; add `mode: offline` (and drop serve and "
                                           "bench) or remove it")
        return
    if campaign.offline is None:
        raise CampaignError("offline", "is required (mode: offline): e.g. `offline: {cmd: vllm bench throughput "
                                       "--model MODEL --dataset-name random}`")
    for part in ("serve", "bench", "sla", "tune"):
        if getattr(campaign, part) is not None:
            raise CampaignError(part, f"has no meaning in mode {campaign.mode} (no server runs"
                                + ("; a startup sweep's parameters are the engine's, in offline.params" if
                                   campaign.mode == "startup" else "") + "); remove it, or use mode serve")
    if campaign.link:
        raise CampaignError("link", f"has no meaning in mode {campaign.mode} (there are no bench parameters to "
                                    "link to)")
    _check_startup_mode(campaign)


def _check_startup_mode(campaign: Campaign) -> None:
    """`mode: startup` runs `vllm bench startup` (raysweep.serve.startup); that command in mode offline too."""
    from raysweep.bench.offline import offline_kind

    assert campaign.offline is not None
    kind = offline_kind(shlex.split(campaign.offline.cmd))
    if campaign.mode == "startup" and kind != "startup":
        raise CampaignError("offline.cmd", f"mode startup runs `vllm bench startup --model MODEL ...` (got `vllm "
                                           f"bench {kind}`); use mode offline for it")


def _check_endpoints(campaign: Campaign) -> None:
    """A server to start (`serve.cmd`) or servers that run already (`serve.url`); what needs a server of
    raysweep's own is refused with endpoints."""
    serve = campaign.serve
    if serve is None:
        return
    if serve.cmd is None and serve.url is None:
        raise CampaignError("serve.cmd", "is required: the server raysweep starts (e.g. `vllm serve MODEL`); or give "
                                         "`serve.url` instead, for servers that run already (e.g. http://HOST:8000)")
    if serve.url is None:
        return
    refused = (("serve.params", serve.params is not None, "an endpoint's parameters are its own; list several "
                "endpoints in serve.url to compare them"),
               ("serve.env", bool(serve.env), "no server process is started"),
               ("serve.gpus_per_replica", serve.gpus_per_replica is not None, "no GPUs are reserved"),
               ("tune", campaign.tune is not None, "its candidates are new servers, which an endpoint campaign "
                "cannot start; run `tune:` with serve.cmd"),
               ("placement.tail_replicas", bool(campaign.placement.tail_replicas), "it starts more servers"),
               ("transport.probe", campaign.transport.probe, "the fabric probe runs in a server's own GPUs"))
    for fld, bad, why in refused:
        if bad:
            raise CampaignError(fld, f"cannot be used with serve.url ({why}); remove it, or use serve.cmd")


def _check_tail_replicas(campaign: Campaign) -> None:
    """More servers of one configuration share its points: not SLA searches (a search's probes follow one
    another on one server), tuning candidates (stopped by rung) or offline runs."""
    if not campaign.placement.tail_replicas:
        return
    for part, why in (("sla", "an SLA search's probes follow one another on one server"),
                      ("tune", "tuning candidates are stopped early by rung, one server each"),
                      ("offline", "offline runs have no server to share points between")):
        if getattr(campaign, part) is not None:
            raise CampaignError("placement.tail_replicas", f"cannot be used with `{part}:` ({why}); set it to 0 "
                                                            "or remove it")


def _check_order(campaign: Campaign) -> None:
    """`order.instances` deals a point's first runs to the server starts: each start needs at least one, and
    only a plain sweep of server configurations has starts to deal them to."""
    n = campaign.order.instances
    if n <= 1:
        return
    for part, why in (("sla", "an SLA search's probes follow one another on one server"),
                      ("tune", "tuning candidates are stopped early by rung, one server each"),
                      ("offline", "offline runs start no server to measure on")):
        if getattr(campaign, part) is not None:
            raise CampaignError("order.instances", f"cannot be used with `{part}:` ({why}); set it to 1 or "
                                                   "remove it")
    if campaign.serve is not None and campaign.serve.url is not None:
        raise CampaignError("order.instances", "cannot be used with serve.url (no server is started); set it to 1")
    if campaign.placement.tail_replicas:
        raise CampaignError("order.instances", "cannot be used with placement.tail_replicas (both decide which "
                                               "server runs which runs); use one of them")
    precision = getattr(campaign.bench, "precision", None) if campaign.bench is not None else None
    first, where = (precision.min_runs, "bench.precision.min_runs") if precision is not None else (
        campaign.runs, "runs")
    if n > first:
        raise CampaignError("order.instances", f"is {n}, but a point has only {first} first run(s) ({where}) to deal "
                                               f"to its server starts; accepted: 1 to {first}, or raise {where}")


def _check_confirm(campaign: Campaign) -> None:
    """`confirm: true` re-measures the winner on fresh servers: only a plain sweep of servers raysweep starts
    has them (`enabled: auto` is off elsewhere, silently)."""
    if campaign.confirm.enabled is not True:
        return
    for part, bad in (("sla", campaign.sla is not None), ("tune", campaign.tune is not None),
                      ("offline", campaign.offline is not None),
                      ("bench.workload", getattr(campaign.bench, "workload", None) is not None),
                      ("serve.url", campaign.serve is not None and campaign.serve.url is not None)):
        if bad:
            raise CampaignError("confirm", f"cannot be used with `{part}` (it confirms the leader of a plain sweep "
                                           "on fresh servers of its own); set it to false or auto")


def _check_affinity(campaign: Campaign) -> None:
    """The server's and the clients' CPUs, when both are given, must not overlap (the validity record would
    mark every run "shared CPUs")."""
    from raysweep.procs import cpu_set, cpu_text

    if campaign.serve is None or campaign.bench is None:
        return
    both = (cpu_set(campaign.serve.cpu_affinity) or set()) & (cpu_set(campaign.bench.cpu_affinity) or set())
    if both:
        raise CampaignError("bench.cpu_affinity", f"shares CPU(s) {cpu_text(both)} with serve.cpu_affinity: every "
                                                  "run would be marked 'shared CPUs'; give each CPUs of its own")


def _check_design(campaign: Campaign) -> None:
    """`design:` decides the server starts and the runs of every point: not beside what decides them otherwise,
    and only where raysweep starts the servers of a plain sweep."""
    if campaign.design is None:
        return
    if campaign.bench is not None and campaign.bench.precision is not None:
        raise CampaignError("bench.precision", "cannot be used with design:, which replaces it (design.metric, "
                                               "design.rel_half_width and design.confidence read as it did; the "
                                               "starts and the runs per start instead of min_runs/max_runs); "
                                               "remove bench.precision")
    if campaign.runs != type(campaign).model_fields["runs"].default:
        raise CampaignError("runs", f"{campaign.runs} cannot be used with design:, which sets a point's runs (starts "
                                    "x runs per start); remove `runs` (or set design.runs_per_start)")
    if campaign.order.instances != 1:
        raise CampaignError("order.instances", "cannot be used with design:, which sets the server starts per "
                                               "configuration; remove it (or set design.starts)")
    for part, why in (("sla", "an SLA search's probes follow one another on one server"),
                      ("tune", "tuning candidates are stopped early by rung, one server each"),
                      ("offline", "offline runs start no server")):
        if getattr(campaign, part) is not None:
            raise CampaignError("design", f"cannot be used with `{part}:` ({why}); remove one of them")
    if getattr(campaign.bench, "workload", None) is not None:
        raise CampaignError("design", "cannot be used with bench.workload (its levels are searched on one server); "
                                      "remove one of them")
    if campaign.serve is not None and campaign.serve.url is not None:
        raise CampaignError("design", "cannot be used with serve.url (no server is started); remove it")
    if campaign.placement.tail_replicas:
        raise CampaignError("design", "cannot be used with placement.tail_replicas (both decide which server runs "
                                      "which runs); use one of them")


def _check_precision(campaign: Campaign) -> None:
    """`bench.precision` decides how many runs a point gets: not with `runs:`, an SLA search or tuning."""
    if campaign.bench is None or campaign.bench.precision is None:
        return
    if campaign.runs != type(campaign).model_fields["runs"].default:
        raise CampaignError("runs", f"{campaign.runs} cannot be used with bench.precision, which runs each point "
                                    "from min_runs to max_runs times; remove `runs` (or bench.precision)")
    for part, why in (("sla", "an SLA search decides its probes' runs itself"),
                      ("tune", "tuning candidates are judged by rung on a fixed number of runs")):
        if getattr(campaign, part) is not None:
            raise CampaignError("bench.precision", f"cannot be used with `{part}:` ({why}); remove one of them")


def _check_sla(campaign: Campaign, bench_combos: list[dict[str, Any]]) -> None:
    from raysweep.campaign.slo import parse_targets

    sla = campaign.sla
    assert sla is not None and campaign.bench is not None
    if campaign.bench.backend != "native":
        raise CampaignError("sla", "needs bench.backend: native (it judges the pooled requests of every run)")
    parse_targets(sla.targets)
    for i, combo in enumerate(bench_combos):
        if any(grid.normalize_key(k) == sla.variable for k in combo):
            raise CampaignError(f"bench.params[{i}].{sla.variable}", "is what the SLA search sets; remove it "
                                                                     "(or search the other variable)")
    if campaign.link and sla.variable in {grid.normalize_key(v) for v in campaign.link.values()}:
        raise CampaignError("link", f"links to {sla.variable}, which the SLA search sets")


def _check_native(argv: list[str], combos: list[dict[str, Any]], origins: Origins) -> None:
    """Every bench point must be load options the native client runs, with its data set on this machine. The
    command alone is judged only where no parameter completes it: `--duration` without `--max-concurrency` is
    fine when every point's parameters set it; a refusal every point shares names `bench.cmd`, any other the
    first point refused."""
    from raysweep.bench.options import parse_load_options

    try:
        parse_load_options(argv, "bench.cmd")
        bare = None
    except CampaignError as exc:
        if not any(combos):
            raise
        bare = exc
    refused: list[CampaignError] = []
    for i, combo in enumerate(combos):
        fld = f"bench.params[{i}]" if combo else "bench.cmd"
        try:
            opts = _reraise_at(partial(_load_options, argv, combo, fld), origins[i])
        except CampaignError as exc:
            if bare is None:
                raise
            refused.append(exc)
            continue
        path = (opts.dataset_path or "")
        if opts.dataset_name == "custom" and ".py:" in path:
            path = path.rsplit(":", 1)[0]
        if opts.dataset_name in ("sharegpt", "custom", "jsonl") and not Path(path).is_file():
            in_params = "dataset_path" in str(combo)
            _reraise_at(partial(_refuse, f"bench.params[{i}]" if in_params else "bench.cmd",
                                f"--dataset-path {opts.dataset_path!r} is not a file on this machine"),
                        origins[i] if in_params else None)
    if bare is not None and len(refused) == len(combos) and all(bare.message in e.message for e in refused):
        raise bare  # the command's own fault, whatever a point adds
    if refused:
        raise refused[0]


def _load_options(argv: list[str], combo: dict[str, Any], fld: str) -> Any:
    from raysweep.bench.options import parse_load_options

    return parse_load_options(grid.apply_to_cmd(argv, combo), fld)


def _check_percentiles(argv: list[str], combos: list[dict[str, Any]], origins: Origins) -> None:
    """`--metric-percentiles` (either backend) must be comma-separated numbers from 0 to 100."""
    points = [("bench.cmd", argv, None)] + [(f"bench.params[{i}]", grid.apply_to_cmd(argv, c), origins[i])
                                             for i, c in enumerate(combos) if c]
    for fld, cmd, origin in points:
        value = grid.find_flag_value(cmd, "--metric-percentiles", "--metric_percentiles")
        if value is None or (fld != "bench.cmd" and value == grid.find_flag_value(
                argv, "--metric-percentiles", "--metric_percentiles")):
            continue
        try:
            bad = [p for p in value.split(",") if p.strip() and not 0 <= float(p) <= 100]
        except ValueError:
            bad = [value]
        if bad or not value.strip():
            _reraise_at(partial(_refuse, fld, f"--metric-percentiles takes comma-separated percentiles from 0 to "
                                              f"100, got {value!r}"), origin)


def _check_links(links: dict[str, str], serve: list[dict[str, Any]], bench: list[dict[str, Any]]) -> None:
    serve_keys = {grid.normalize_key(k) for c in serve for k in c}
    bench_keys = {grid.normalize_key(k) for c in bench for k in c}
    for sk, bk in links.items():
        if grid.normalize_key(sk) not in serve_keys:
            raise CampaignError(f"link.{sk}", f"is not a serve parameter{_did_you_mean(sk, serve_keys)}; "
                                              f"serve parameters: {', '.join(sorted(serve_keys)) or '(none)'}")
        if grid.normalize_key(bk) not in bench_keys:
            raise CampaignError(f"link.{sk}", f"links to {bk!r}, which is not a bench parameter"
                                              f"{_did_you_mean(bk, bench_keys)}; bench parameters: "
                                              f"{', '.join(sorted(bench_keys)) or '(none)'}")
    if links and not any(grid.link_matches(s, b, links) for s in serve for b in bench):
        raise CampaignError("link", "no serve/bench pair has equal values for the linked parameters; nothing would run")
