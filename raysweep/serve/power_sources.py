"""Energy and power of GPUs that NVML does not read here: a DCGM exporter's metrics page, and AMD GPUs
through AMD SMI (`amdsmi`). Each source gives, per GPU index, `(counter_mj, power_w)` (either None where
it has none), which the telemetry sampler keeps as energy readings (`raysweep.maths.energy`).

- **DCGM exporter** (`transport.dcgm_url`, e.g. `http://{node_ip}:9400/metrics`, `{node_ip}` filled in per
  node): `DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION` (mJ since boot, a counter) and `DCGM_FI_DEV_POWER_USAGE`
  (W, a sample), by the `gpu` label. Its values are as fresh as the exporter's own collection interval
  (often 30 s by default: set `-c` to 1000 ms or less), which bounds what a window can resolve.
- **AMD SMI**: `amdsmi_get_energy_count` (an accumulator times its resolution, in uJ) and
  `amdsmi_get_power_info`'s socket power (W).
"""

from __future__ import annotations

import re
import urllib.request
from typing import Any

__all__ = ["AmdSmi", "DcgmExporter", "parse_dcgm"]

ENERGY_METRIC = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
POWER_METRIC = "DCGM_FI_DEV_POWER_USAGE"
_LINE = re.compile(r"^(\w+)\{([^}]*)\}\s+(\S+)")
_GPU = re.compile(r'(?:^|,)\s*gpu="([^"]*)"')


def parse_dcgm(text: str) -> dict[str, tuple[float | None, float | None]]:
    """Per GPU index (the `gpu` label), its energy counter (mJ) and power (W) from a Prometheus text page."""
    out: dict[str, list[float | None]] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m or m.group(1) not in (ENERGY_METRIC, POWER_METRIC):
            continue
        gpu = _GPU.search(m.group(2))
        if gpu is None:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        row = out.setdefault(gpu.group(1), [None, None])
        row[0 if m.group(1) == ENERGY_METRIC else 1] = value
    return {g: (r[0], r[1]) for g, r in out.items()}


class DcgmExporter:
    """A DCGM exporter's page, read at every sample (`read`: the server's GPUs only)."""

    source = "DCGM exporter"

    def __init__(self, url: str, gpus: list[str], timeout_s: float = 2.0) -> None:
        self.url, self.gpus, self.timeout_s = url, [str(g) for g in gpus], timeout_s
        self.why = ""
        try:
            seen = self.read()
        except OSError as exc:
            self.why = f"DCGM exporter {url} unreadable: {type(exc).__name__}: {exc}"[:200]
            return
        if not any(v != (None, None) for v in seen.values()):
            self.why = f"DCGM exporter {url} has neither {ENERGY_METRIC} nor {POWER_METRIC} for GPUs {self.gpus}"

    def read(self) -> dict[str, tuple[float | None, float | None]]:
        with urllib.request.urlopen(self.url, timeout=self.timeout_s) as resp:
            page = parse_dcgm(resp.read().decode("utf-8", "replace"))
        return {g: page.get(g, (None, None)) for g in self.gpus}


class AmdSmi:
    """AMD GPUs through `amdsmi` (ROCm's Python binding): the server's GPUs by index."""

    source = "AMD SMI"

    def __init__(self, gpus: list[str], lib: Any = None) -> None:
        self.why = ""
        self.handles: dict[str, Any] = {}
        try:
            if lib is None:
                import amdsmi as lib  # type: ignore[no-redef]
            lib.amdsmi_init()
            every = lib.amdsmi_get_processor_handles()
            self.handles = {str(g): every[int(g)] for g in gpus}
        except Exception as exc:
            self.why = f"AMD SMI unavailable: {type(exc).__name__}: {exc}"[:200]
        self.lib = lib

    def read(self) -> dict[str, tuple[float | None, float | None]]:
        return {g: (self._energy_mj(h), self._power_w(h)) for g, h in self.handles.items()}

    def _energy_mj(self, h: Any) -> float | None:
        try:
            e = self.lib.amdsmi_get_energy_count(h)
            return float(e["energy_accumulator"]) * float(e["counter_resolution"]) / 1000.0
        except Exception:
            return None

    def _power_w(self, h: Any) -> float | None:
        try:
            p = self.lib.amdsmi_get_power_info(h)
            value = p.get("average_socket_power", p.get("current_socket_power"))
            return float(value) if value not in (None, "N/A") else None
        except Exception:
            return None
