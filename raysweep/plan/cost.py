"""What a token costs, and what the campaign itself has cost: the campaign's `cost:` block applied.

Per point (per run, then aggregated like any rate): the hardware's price per hour (`gpu_hour` x the server's
GPUs, matched by GPU type or node type; `node_hour` x its nodes for a server without GPUs) over the tokens it
made per hour, plus, with `power_price_kwh`, the energy per token at that price (the measured energy where
the point has one, else `provisioned_w_per_gpu` x its GPUs):

    cost_per_m_output_tokens = (price_per_hour / 3600 / output_tokens_per_s + usd_per_j x j_per_output_token) x 1e6

and the same per total token (input + output). The rates are those of the energy window where it exists
(the steady-state window: docs/energy.md), else the point's whole load. `campaign_spend` sums the
GPU-hours every server of the campaign held, from its start (weights loading, warmup and all) to its stop
or now, failed starts included, and prices them.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from raysweep.campaign import CostSpec

if TYPE_CHECKING:
    from raysweep.ledger import ServerRow

__all__ = ["COST_METRICS", "J_PER_KWH", "campaign_spend", "estimate_line", "hourly_price", "point_cost_fields",
           "spend_line"]

J_PER_KWH = 3.6e6
COST_METRICS = ("cost_per_m_output_tokens", "cost_per_m_total_tokens")


def _match(cost: CostSpec, gpu_name: str, labels: Iterable[str]) -> tuple[float | None, str]:
    """The price per GPU-hour of a GPU by its name or its node's labels, and the key that matched."""
    prices = cost.gpu_hour
    if prices is None:
        return None, ""
    if not isinstance(prices, dict):
        return float(prices), "gpu_hour"
    name, values = gpu_name.lower(), {str(v) for v in labels}
    for key, price in prices.items():
        if key != "default" and (key.lower() in name or key in values):
            return float(price), f"gpu_hour[{key}]"
    if "default" in prices:
        return float(prices["default"]), "gpu_hour[default]"
    return None, ""


def hourly_price(cost: CostSpec, gpus: int, nodes: int, gpu_name: str = "",
                 labels: Iterable[str] = ()) -> tuple[float | None, str]:
    """A server's price per hour and where it came from ("" and None when the block prices nothing of it)."""
    if gpus > 0:
        price, key = _match(cost, gpu_name, labels)
        return (None, "") if price is None else (price * gpus, f"{gpus} GPU x {key} {price:g}")
    if cost.node_hour is not None:
        return cost.node_hour * max(1, nodes), f"{max(1, nodes)} node x node_hour {cost.node_hour:g}"
    return None, ""


def _rates(record: dict[str, Any]) -> tuple[float | None, float | None]:
    """Output and total tokens per second: over the energy window where there is one, else the whole load."""
    window = record.get("energy_window_s")
    out, tot = record.get("energy_output_tokens"), record.get("energy_total_tokens")
    if window and out:
        return out / window, (tot / window if tot else None)
    return record.get("output_throughput"), record.get("total_token_throughput")


def point_cost_fields(cost: CostSpec | None, record: dict[str, Any], labels: Iterable[str] = ()) -> dict[str, Any]:
    """The `cost_per_m_*` columns of one run (see the module docstring), with `cost_basis` saying how they
    were priced; only `cost_note` when the block does not price this server or it made no tokens."""
    if cost is None:
        return {}
    gpus, nodes = int(record.get("gpu_count") or 0), int(record.get("num_nodes") or 1)
    per_hour, basis = hourly_price(cost, gpus, nodes, str(record.get("provenance_gpu") or ""), labels)
    if per_hour is None:
        return {"cost_note": "cost: no price for this server (" + (f"{gpus} GPU(s) of "
                f"{record.get('provenance_gpu') or 'unknown type'}" if gpus else "no GPU and no node_hour") + ")"}
    out_rate, tot_rate = _rates(record)
    fields: dict[str, Any] = {"cost_currency": cost.currency, "cost_per_hour": per_hour}
    usd_per_j, power_basis = 0.0, ""
    j_out = j_tot = 0.0
    if cost.power_price_kwh is not None:
        usd_per_j = cost.power_price_kwh / J_PER_KWH
        if record.get("energy_j") is not None:
            j_out, j_tot = record.get("j_per_output_token") or 0.0, record.get("j_per_total_token") or 0.0
            power_basis = f" + measured energy x {cost.power_price_kwh:g}/kWh"
        elif cost.provisioned_w_per_gpu is not None and out_rate:
            watts = cost.provisioned_w_per_gpu * gpus
            j_out, j_tot = watts / out_rate, (watts / tot_rate if tot_rate else 0.0)
            power_basis = f" + provisioned {cost.provisioned_w_per_gpu:g} W/GPU x {cost.power_price_kwh:g}/kWh"
        else:
            power_basis = " (no energy measured and no provisioned_w_per_gpu: power not charged)"
    fields["cost_basis"] = basis + power_basis
    if not out_rate or not math.isfinite(out_rate):
        fields["cost_note"] = "cost: no output tokens"
        return fields
    fields["cost_per_m_output_tokens"] = (per_hour / 3600.0 / out_rate + usd_per_j * j_out) * 1e6
    if tot_rate:
        fields["cost_per_m_total_tokens"] = (per_hour / 3600.0 / tot_rate + usd_per_j * j_tot) * 1e6
    return fields


def _server_gpus(server: ServerRow, gpus_of: dict[str, int]) -> int:
    """A server's GPUs from the ledger (every node's `gpu_ids`), else its configuration's count."""
    counted = sum(len([g for g in str(r.get("gpu_ids") or "").split(",") if g.strip()]) for r in server.rank_list())
    return counted or int(gpus_of.get(server.serve_id, 0))


def campaign_spend(cost: CostSpec | None, servers: Iterable[Any], gpus_of: dict[str, int] | None = None,
                   now: float | None = None) -> dict[str, Any]:
    """The GPU-hours every server held (start to stop, or to `now` while it runs; failed starts too), and
    their price where the block gives one: {gpu_hours, node_hours, cost, currency, servers, unpriced}."""
    now = time.time() if now is None else now
    gpu_h = node_h = total = 0.0
    unpriced, count = 0, 0
    for s in servers:
        count += 1
        hours = max(0.0, (s.stopped_at or now) - s.started_at) / 3600.0
        gpus, nodes = _server_gpus(s, gpus_of or {}), max(1, len(s.rank_list()))
        gpu_h += gpus * hours
        node_h += nodes * hours
        if cost is None:
            continue
        prov = json.loads(s.provenance) if getattr(s, "provenance", None) else {}
        per_hour, _ = hourly_price(cost, gpus, nodes, str(prov.get("gpu") or ""))
        if per_hour is None:
            unpriced += 1
        else:
            total += per_hour * hours
    out: dict[str, Any] = {"servers": count, "gpu_hours": gpu_h, "node_hours": node_h}
    if cost is not None:
        out.update(cost=total, currency=cost.currency, unpriced=unpriced)
    return out


def spend_line(cost: CostSpec | None, servers: Iterable[Any], gpus_of: dict[str, int] | None = None,
               now: float | None = None) -> str:
    """`status`'s line: the GPU-hours the campaign's servers held so far, and their cost where priced."""
    s = campaign_spend(cost, servers, gpus_of, now)
    text = (f"spent: {s['gpu_hours']:.2f} GPU-hour(s), {s['node_hours']:.2f} node-hour(s) over {s['servers']} "
            "server start(s) (weights loading, warmups and failed starts included)")
    if cost is None:
        return text
    unpriced = f"; {s['unpriced']} server(s) not priced by cost:" if s["unpriced"] else ""
    return text + f": {s['cost']:.2f} {cost.currency}{unpriced}"


def estimate_line(cost: CostSpec | None, gpu_hours: float, node_hours: float | None = None) -> str:
    """The dry run's price of the GPU-hours it estimates: one price (or `default`) applies to all; prices
    by GPU or node type only once the servers' GPUs are known (`status`, the report). On a machine without
    GPUs (`node_hours` given) the servers bill node-hours at `cost.node_hour`."""
    if cost is None:
        return ""
    if node_hours is not None:
        if cost.node_hour is None:
            return ("Cost: not priced: the servers here have no GPUs and bill node-hours, and cost.node_hour gives "
                    "no price for them")
        return (f"Cost: about {node_hours * cost.node_hour:.2f} {cost.currency} ({node_hours:.2f} node-hour(s) x "
                f"{cost.node_hour:g})")
    price = cost.gpu_hour if not isinstance(cost.gpu_hour, dict) else cost.gpu_hour.get("default")
    if price is None:
        return ("Cost: priced by GPU or node type only (no default in cost.gpu_hour): known once the servers run "
                "(raysweep status, the report)")
    return f"Cost: about {gpu_hours * price:.2f} {cost.currency} ({gpu_hours:.2f} GPU-hour(s) x {price:g})"
