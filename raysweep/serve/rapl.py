"""RAPL package energy counters of a CPU node (`/sys/class/powercap/intel-rapl:N`), for energy where no GPU is.

Each top-level zone `intel-rapl:N` (not its sub-zones `intel-rapl:N:M`, which are parts of it) is one CPU
package: its `name` ("package-0"), its `energy_uj` counter (microjoules, readable only by root on kernels
since 5.10) and `max_energy_range_uj`, where the counter wraps to zero. A package counter measures the whole
socket: every process on it, not only the server (the scope the fields say). `Rapl` reads them the way
`raysweep.serve.telemetry` reads NVML; `Rapl.why` says why there is nothing when nothing is readable.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["POWERCAP", "RAPL_ENV", "SCOPE", "Rapl"]

POWERCAP = "/sys/class/powercap"
RAPL_ENV = "RAYSWEEP_RAPL_ROOT"  # in a campaign's serve.env: another powercap tree (a fake one in tests)
SCOPE = "RAPL package counter (whole socket: every process on it, not only the server)"
_ZONE = re.compile(r"^intel-rapl:\d+$")


class Rapl:
    """The readable RAPL packages under `root` (tests point it at a fake tree)."""

    def __init__(self, root: str | os.PathLike[str] = POWERCAP) -> None:
        self.root = Path(root)
        self.zones: dict[str, Path] = {}
        self.wraps_mj: dict[str, float] = {}
        self.why = ""
        try:
            names = sorted(p for p in self.root.iterdir() if _ZONE.match(p.name))
        except OSError as exc:
            self.why = f"RAPL unavailable: {self.root} cannot be read ({type(exc).__name__})"
            return
        if not names:
            self.why = f"RAPL unavailable: no intel-rapl zone under {self.root}"
            return
        errors = []
        for zone in names:
            try:
                name = (zone / "name").read_text().strip() or zone.name
                int((zone / "energy_uj").read_text())
                self.wraps_mj[name] = int((zone / "max_energy_range_uj").read_text()) / 1000.0 + 0.001
            except (OSError, ValueError) as exc:
                errors.append(f"{zone.name}: {type(exc).__name__}")
                continue
            self.zones[name] = zone
        if not self.zones:
            self.why = f"RAPL unavailable: energy_uj not readable ({', '.join(errors)}; readable by root only)"

    def read_mj(self) -> dict[str, float | None]:
        """Each package's counter now, in mJ (None where a read fails)."""
        out: dict[str, float | None] = {}
        for name, zone in self.zones.items():
            try:
                out[name] = int((zone / "energy_uj").read_text()) / 1000.0
            except (OSError, ValueError):
                out[name] = None
        return out
