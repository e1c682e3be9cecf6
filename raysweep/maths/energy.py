"""Energy over a point's window, from cumulative energy counters or, where a device has none, power samples.

A device (one GPU through NVML, or one RAPL package of a CPU node) is read by the telemetry sampler every
`interval_s`: each reading is `(t, counter_mj, power_w)`, either value None where the device cannot give it.
`device_energy` turns the readings of one device into the joules it used between t0 and t1:

- **counter** (NVML `nvmlDeviceGetTotalEnergyConsumption`, mJ since the driver loaded; RAPL `energy_uj`):
  the counter is unwrapped (a reading below the one before it is a wrap of `wrap_mj`: NVML's is a 64-bit
  count, RAPL's wraps at `max_energy_range_uj`), then read at t0 and t1 by linear interpolation between the
  readings around each instant (constant power between two readings). The energy is exact to within what a
  tick of the counter holds: NVML updates it about every 100 ms on many boards. So a window in which the
  counter did not tick at all, or shorter than `MIN_COUNTER_WINDOW_S`, is not measured by the counter: it
  falls back to power x time (the mean of the power samples inside it, or the nearest one, times its length).
- **power samples** (a GPU without the counter, AMD SMI, a DCGM exporter's power gauge): the trapezoid
  integral of the samples over the window, held flat from the first and last sample to its edges; `coverage`
  says which share of the window lies between two samples (an instantaneous power reading is one moment,
  and `nvidia-smi`-style sampling is known to see only a fraction of the runtime: docs/energy.md).

`window_energy` pools the devices of a server (every node) and subtracts the idle power measured on the same
devices before the server's first load (`idle_w`, per device) to give the net energy; `energy_fields` is the
point's `energy_*` columns, per token too. Nothing here reads hardware: see `raysweep.serve.telemetry` (NVML) and
`raysweep.serve.rapl` (RAPL), and docs/energy.md for the method and its pitfalls.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ENERGY_METRICS", "MIN_COUNTER_WINDOW_S", "NVML_WRAP_MJ", "DeviceEnergy", "device_energy",
           "energy_fields", "idle_power", "unwrap", "window_energy"]

NVML_WRAP_MJ = 2 ** 64            # nvmlDeviceGetTotalEnergyConsumption: an unsigned long long of mJ
MIN_COUNTER_WINDOW_S = 1.0        # shorter windows are measured as power x time (a tick can be 100 ms)
# per-run metrics that aggregate across runs like the throughputs (mean and t-interval per point)
ENERGY_METRICS = ("energy_j", "energy_net_j", "power_mean_w", "power_net_mean_w", "j_per_output_token",
                  "j_per_total_token", "output_tokens_per_j", "net_j_per_output_token", "net_j_per_total_token",
                  "net_output_tokens_per_j")

Reading = tuple[float, float | None, float | None]  # (t, counter mJ or None, power W or None)


@dataclass(frozen=True)
class DeviceEnergy:
    """One device's energy over a window: joules, how they were measured ("counter", "power x time" or
    "power samples"), and for sampled power the share of the window between two samples."""

    joules: float
    method: str
    coverage: float = 1.0
    why: str = ""


def unwrap(counter: Sequence[float], wrap_mj: float) -> list[float]:
    """A cumulative counter as the energy since its first reading, monotone: each drop is taken as one wrap
    of `wrap_mj`. The differences are taken in the counter's own type (exact for NVML's integers near 2**64,
    where a float would lose joules), then made floats."""
    out: list[float] = []
    total: float = 0
    for prev, v in zip([None, *counter], counter):
        if prev is not None:
            total += v - prev if v >= prev else v + wrap_mj - prev
        out.append(float(total))
    return out


def _at(times: Sequence[float], values: Sequence[float], t: float) -> float | None:
    """The value at t, linearly between the readings around it; None outside the readings."""
    if not times or t < times[0] or t > times[-1]:
        return None
    for i in range(1, len(times)):
        if times[i] >= t:
            t0, t1 = times[i - 1], times[i]
            if t1 == t0:
                return values[i]
            return values[i - 1] + (values[i] - values[i - 1]) * (t - t0) / (t1 - t0)
    return values[-1]


def _power_times_time(readings: Sequence[Reading], t0: float, t1: float) -> float | None:
    """The mean of the power samples inside [t0, t1] (the nearest one when none is) times its length."""
    power = [(t, p) for t, _, p in readings if p is not None and math.isfinite(p)]
    if not power:
        return None
    inside = [p for t, p in power if t0 <= t <= t1]
    mean = sum(inside) / len(inside) if inside else min(power, key=lambda tp: abs(tp[0] - (t0 + t1) / 2))[1]
    return mean * (t1 - t0)


def _sampled(readings: Sequence[Reading], t0: float, t1: float) -> DeviceEnergy | None:
    """The trapezoid integral of the power samples over [t0, t1], held flat beyond the first and last."""
    pts = sorted((t, p) for t, _, p in readings if p is not None and math.isfinite(p))
    if not pts or t1 <= t0:
        return None
    times, power = [t for t, _ in pts], [p for _, p in pts]
    inside = [(t, p) for t, p in pts if t0 < t < t1]
    edge0 = _at(times, power, t0)
    edge1 = _at(times, power, t1)
    seq = ([(t0, edge0 if edge0 is not None else (inside[0][1] if inside else power[-1 if t0 > times[-1] else 0]))]
           + inside + [(t1, edge1 if edge1 is not None else (inside[-1][1] if inside else power[0 if t1 < times[0]
                                                                                               else -1]))])
    joules = sum((b[0] - a[0]) * (a[1] + b[1]) / 2.0 for a, b in zip(seq, seq[1:]))
    covered = max(0.0, min(t1, times[-1]) - max(t0, times[0]))
    return DeviceEnergy(joules, "power samples", covered / (t1 - t0))


def device_energy(readings: Sequence[Reading], t0: float, t1: float, wrap_mj: float = NVML_WRAP_MJ,
                  min_window_s: float = MIN_COUNTER_WINDOW_S) -> DeviceEnergy | None:
    """One device's joules between t0 and t1 from its readings (see the module docstring); None when
    nothing was read."""
    if t1 <= t0:
        return None
    rows = sorted(readings, key=lambda r: r[0])
    counted = [(t, c) for t, c, _ in rows if c is not None and math.isfinite(c)]
    if counted:
        times = [t for t, _ in counted]
        values = unwrap([c for _, c in counted], wrap_mj)
        e0, e1 = _at(times, values, t0), _at(times, values, t1)
        if e0 is None or e1 is None:
            why = "the counter was not read on both sides of the window"
        else:
            around = [v for t, v in zip(times, values) if t0 <= t <= t1] or []
            ticked = max([e1, *around]) > min([e0, *around])
            if t1 - t0 < min_window_s:
                why = f"window of {t1 - t0:.2f} s is under {min_window_s:g} s, too short for the counter"
            elif not ticked:
                why = "the counter did not tick within the window"
            else:
                return DeviceEnergy((e1 - e0) / 1000.0, "counter")
        fallback = _power_times_time(rows, t0, t1)
        if fallback is not None:
            return DeviceEnergy(fallback, "power x time", why=why)
    return _sampled(rows, t0, t1)


def idle_power(readings: Sequence[Reading], wrap_mj: float = NVML_WRAP_MJ) -> float | None:
    """A device's mean idle power over its readings (before the server's first load): the counter's rise
    over their span where it ticked, else the mean of the power samples."""
    if len(readings) >= 2:
        rows = sorted(readings, key=lambda r: r[0])
        e = device_energy(rows, rows[0][0], rows[-1][0], wrap_mj, min_window_s=0.0)
        if e is not None and e.method == "counter":
            return e.joules / (rows[-1][0] - rows[0][0])
    power = [p for _, _, p in readings if p is not None and math.isfinite(p)]
    return sum(power) / len(power) if power else None


def window_energy(devices: dict[str, Sequence[Reading]], idle_w: dict[str, float | None], t0: float, t1: float,
                  wraps: dict[str, float] | None = None) -> dict[str, Any]:
    """The energy of a server's devices between t0 and t1: gross, net of idle (only when every device's idle
    power is known), the method (several joined when the devices differ), and the least coverage."""
    per: dict[str, DeviceEnergy] = {}
    for dev, rows in devices.items():
        e = device_energy(rows, t0, t1, (wraps or {}).get(dev, NVML_WRAP_MJ))
        if e is not None:
            per[dev] = e
    if not per or len(per) < len(devices):
        missing = sorted(set(devices) - set(per))
        return {"energy_note": f"no energy reading of {', '.join(missing) or 'any device'} over the window"}
    gross = sum(e.joules for e in per.values())
    methods = sorted({e.method for e in per.values()})
    whys = sorted({f"{d}: {e.why}" for d, e in per.items() if e.why})
    idle = [idle_w.get(d) for d in per]
    net = None if any(i is None for i in idle) else gross - sum(float(i) for i in idle if i is not None) * (t1 - t0)
    out: dict[str, Any] = {"energy_method": ", ".join(methods), "energy_devices": len(per),
                           "energy_window_s": t1 - t0, "energy_j": gross, "power_mean_w": gross / (t1 - t0),
                           "energy_net_j": net, "power_net_mean_w": None if net is None else net / (t1 - t0),
                           "idle_power_w": None if net is None else sum(float(i) for i in idle if i is not None)}
    if whys:
        out["energy_fallback"] = "; ".join(whys)
    if "power samples" in methods:
        out["energy_sample_coverage"] = min(e.coverage for e in per.values())
    return out


def energy_fields(energy: dict[str, Any], output_tokens: float | None, total_tokens: float | None) -> dict[str, Any]:
    """The per-token columns of an energy window: J per output and per total token, output tokens per J,
    gross and net of idle (absent where the energy or the tokens are)."""
    out = dict(energy)
    gross, net = energy.get("energy_j"), energy.get("energy_net_j")
    for prefix, joules in (("", gross), ("net_", net)):
        if joules is None:
            continue
        if output_tokens:
            out[f"{prefix}j_per_output_token"] = joules / output_tokens
            out[f"{prefix}output_tokens_per_j"] = output_tokens / joules if joules > 0 else None
        if total_tokens:
            out[f"{prefix}j_per_total_token"] = joules / total_tokens
    out.update(energy_output_tokens=output_tokens, energy_total_tokens=total_tokens)
    return out
