"""GPU telemetry during a point, through NVML (`nvidia-ml-py`), sampled on each node by the server's host actor.

`Sampler` runs in the `ServerHost` actor of every node of a server, on the GPUs Ray gave that actor (the
server's own): every `interval_s` it reads each GPU's utilisation, memory used, power draw, SM clock and
current clock-event (throttle) reasons, and keeps the samples (a bounded ring). `window(t0, t1)` returns
the samples of a point's time window; the driver pools those of every node and `summarise` turns them into
the `gpu_*` columns of the result. `throttled(reasons)` keeps the reasons that lower the clock against
the user's will (power cap, thermal, hardware slowdown, power brake); idle, application clocks and sync
boost are not throttling.

Without NVML (a CPU node, no driver, `nvidia-ml-py` missing) the sampler records why (`gpu_telemetry`
says `unavailable: ...`), never an error.

Which GPUs are the server's: Ray's GPU ids are CUDA's device numbers, and NVML numbers the devices in PCI bus
order, which CUDA follows only with `CUDA_DEVICE_ORDER=PCI_BUS_ID` (its default puts the fastest first: on a
node of mixed GPUs the two orders differ). So the sampler asks CUDA's driver (`libcuda`, through ctypes: no
context is made, no GPU memory taken) for the PCI bus id of each device this process sees (Ray's
CUDA_VISIBLE_DEVICES, which the server inherits) and opens each in NVML by that bus id; a GPU id that is a
UUID is opened by UUID. Without CUDA's driver it falls back on NVML's index only where the orders agree
(`CUDA_DEVICE_ORDER=PCI_BUS_ID`, or every GPU of the node the same model), and otherwise says why it reads
none rather than read another server's GPUs. Drivers before 535 lack the clock-event call: the older
throttle-reason call is used instead (the same bits).

Energy (`raysweep.maths.energy`): every sample also reads each GPU's total energy counter
(`nvmlDeviceGetTotalEnergyConsumption`, mJ; None where the board has none), kept with its power as the
device's energy readings; without NVML, a DCGM exporter's page or AMD SMI (`raysweep.serve.power_sources`), and
for a server without GPUs its node's readable RAPL package counters (`raysweep.serve.rapl`), are read instead.
`measure_idle` reads them for a while before the server's first load (its idle power); `energy_window(t0, t1)`
returns the readings around a window for `raysweep.maths.energy.window_energy`.

`FileNvml` is an NVML stand-in that replays GPUs described in a JSON file (named by `RAYSWEEP_FAKE_NVML` in
the environment, or in a campaign's `serve.env`): for tests and demos on machines without GPUs. A GPU with
`energy_mj` has an energy counter, worth that at the time `energy_at` and rising at its power since; a file
with `step_at` (a time) steps every GPU from `power_w` to its `load_power_w` then.
"""

from __future__ import annotations

import collections
import ctypes
import json
import logging
import math
import os
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from raysweep.serve.power_sources import AmdSmi, DcgmExporter
    from raysweep.serve.rapl import Rapl

__all__ = ["FAKE_ENV", "THROTTLE_REASONS", "THROTTLED_FRACTION", "FileNvml", "Sampler", "cuda_pci_bus_ids", "load_nvml",
           "same_bus", "summarise", "throttled"]

log = logging.getLogger(__name__)

THROTTLED_FRACTION = 0.05  # more throttled NVML samples than this: a point is marked `throttled` (run.validity)

FAKE_ENV = "RAYSWEEP_FAKE_NVML"
MAX_SAMPLES = 20_000       # per node: about 2.8 h at the default 0.5 s per sample for 1 GPU
# NVML's clock-event reason bits (nvmlClocksEventReason*): those that are throttling, with short names
THROTTLE_REASONS = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal",
                    0x80: "hw_power_brake"}
NVML_CLOCK_SM = 1


def throttled(reasons: int) -> list[str]:
    """The throttling reasons set in an NVML clock-event bitmask, by name."""
    return [name for bit, name in THROTTLE_REASONS.items() if reasons & bit]


class FileNvml:
    """An NVML stand-in reading `{"gpus": [{"util": 90, "mem_used_mib": 1000, "power_w": 300, "sm_mhz": 1980,
    "reasons": 4}, ...]}` from a file at every call (so a test can change it while sampling)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _gpu(self, handle: int) -> dict[str, Any]:
        with open(self.path) as f:
            return dict(json.load(f)["gpus"][handle])

    def nvmlInit(self) -> None:
        self._gpu(0)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return int(index)

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return type("Util", (), {"gpu": self._gpu(h).get("util", 0)})()

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return type("Mem", (), {"used": int(self._gpu(h).get("mem_used_mib", 0)) * 2**20})()

    def _load(self) -> dict[str, Any]:
        with open(self.path) as f:
            return dict(json.load(f))

    def _power_w(self, h: int, now: float) -> float:
        """A GPU's power: `power_w`, or `load_power_w` from the file's `step_at` (a time) on."""
        data = self._load()
        gpu = data["gpus"][h]
        step = data.get("step_at")
        return float(gpu.get("load_power_w", gpu.get("power_w", 0)) if step is not None and now >= step
                     else gpu.get("power_w", 0))

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return int(self._power_w(h, time.time()) * 1000)

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        return int(self._gpu(h).get("sm_mhz", 0))

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return int(self._gpu(h).get("reasons", 0))

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        """`energy_mj` at the time `energy_at`, rising at the GPU's power since (through `step_at`), as a
        64-bit counter that wraps."""
        data, now = self._load(), time.time()
        gpu = data["gpus"][h]
        if "energy_mj" not in gpu:
            raise NotImplementedError("no energy counter")  # as NVML_ERROR_NOT_SUPPORTED before Volta
        at = float(gpu.get("energy_at", now))
        step = max(at, float(data.get("step_at") or now))
        p0, p1 = float(gpu.get("power_w", 0)), float(gpu.get("load_power_w", gpu.get("power_w", 0)))
        joules = p0 * (min(now, step) - at) + p1 * max(0.0, now - step)
        return (int(gpu["energy_mj"]) + round(joules * 1000)) % 2 ** 64


def load_nvml() -> tuple[Any, str]:
    """NVML initialised (or the file stand-in when `RAYSWEEP_FAKE_NVML` names one), and its source; (None,
    why) when there is none."""
    fake = os.environ.get(FAKE_ENV)
    try:
        nvml: Any
        if fake:
            nvml = FileNvml(fake)
            source = "fake NVML"
        else:
            import pynvml  # nvidia-ml-py

            nvml, source = pynvml, "nvml"
        nvml.nvmlInit()
        return nvml, source
    except Exception as exc:
        return None, nvml_why(exc)


# what a reader needs to know of NVML's usual refusals, instead of the exception's class name
_NVML_WHY = {"NVMLError_LibraryNotFound": "no NVIDIA driver library (libnvidia-ml) on this node",
             "NVMLError_DriverNotLoaded": "the NVIDIA driver is not loaded on this node",
             "NVMLError_NoPermission": "no permission to read the GPUs (NVML)"}


def nvml_why(exc: BaseException) -> str:
    """`unavailable: ...` for an NVML that could not start: in words for its usual refusals, else the error."""
    said = _NVML_WHY.get(type(exc).__name__)
    return f"unavailable: {said}" if said else f"unavailable: {type(exc).__name__}: {exc}"[:200]


def cuda_pci_bus_ids() -> list[str] | None:
    """The PCI bus id (`0000:3B:00.0`) of every GPU this process sees through CUDA, in CUDA's order (that of
    CUDA_VISIBLE_DEVICES, under CUDA_DEVICE_ORDER), from CUDA's driver API; None without a CUDA driver."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    count = ctypes.c_int()
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return None
    out = []
    for i in range(count.value):
        dev, buf = ctypes.c_int(), ctypes.create_string_buffer(64)
        if cuda.cuDeviceGet(ctypes.byref(dev), i) != 0 or cuda.cuDeviceGetPCIBusId(buf, 64, dev) != 0:
            return None
        out.append(buf.value.decode())
    return out


def _bus_key(bus: str | bytes) -> tuple[int, ...] | None:
    """`00000000:3B:00.0` (NVML) and `0000:3b:00.0` (CUDA) as one key: (domain, bus, device, function)."""
    text = bus.decode(errors="replace") if isinstance(bus, bytes) else str(bus)
    parts = text.strip().replace(".", ":").split(":")
    try:
        nums = tuple(int(x, 16) for x in parts)
    except ValueError:
        return None
    return nums if len(nums) == 4 else ((0, *nums) if len(nums) == 3 else None)


def same_bus(a: str | bytes, b: str | bytes) -> bool:
    """Whether two PCI bus ids, written as NVML or as CUDA writes them, are one device."""
    return _bus_key(a) is not None and _bus_key(a) == _bus_key(b)


class _Unmapped(RuntimeError):
    """This server's GPUs cannot be told apart from the node's others in NVML."""


class Sampler:
    """Samples a node's GPUs in a thread (see the module docstring)."""

    def __init__(self, gpu_ids: list[str], interval_s: float = 0.5, nvml: Any = None, source: str = "",
                 rapl_root: str | None = None, clock: Callable[[], float] = time.time, dcgm_url: str | None = None,
                 amd: Any = False, cuda_bus_ids: Callable[[], list[str] | None] | None = None) -> None:
        """`cuda_bus_ids`: how to read the PCI bus ids of the GPUs this process sees (`cuda_pci_bus_ids`)."""
        self.interval_s = interval_s
        self.clock = clock
        self.nvml, self.source = (nvml, source or "nvml") if nvml is not None else load_nvml()
        self.samples: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_SAMPLES)
        # energy readings of every device (GPU or RAPL package): MAX_SAMPLES each
        self.energy: collections.deque[tuple[str, float, Any, Any]] = collections.deque(
            maxlen=MAX_SAMPLES * max(1, len(gpu_ids)))
        self.idle_w: dict[str, float | None] = {}
        self.handles: list[tuple[str, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reasons_call = "nvmlDeviceGetCurrentClocksEventReasons"  # the older call on drivers before 535
        if self.nvml is not None:
            try:
                self.handles = self._server_handles([str(g) for g in gpu_ids], cuda_bus_ids)
            except _Unmapped as exc:
                self.nvml, self.source = None, f"unavailable: {exc}"
            except Exception as exc:
                self.nvml, self.source = None, nvml_why(exc)
        if self.nvml is not None and not self.handles:
            self.nvml, self.source = None, "unavailable: no GPU assigned to this server"
        self.rapl: Rapl | None = None
        self.gpu_power: DcgmExporter | AmdSmi | None = None  # a DCGM exporter or AMD SMI, where NVML is absent
        self.energy_source, self.energy_why = ("NVML energy counter", "") if self.nvml is not None else ("", "")
        self.wraps: dict[str, float] = {}
        whys = [f"NVML {self.source}"]
        if self.nvml is None and gpu_ids:
            self._other_gpu_source([str(g) for g in gpu_ids], dcgm_url, amd, whys)
        if self.nvml is None and gpu_ids and rapl_root is not None:
            whys.append("RAPL not read: the server has GPUs, and a CPU socket's energy is not theirs")
        elif self.nvml is None and rapl_root is not None:
            from raysweep.serve.rapl import SCOPE, Rapl

            rapl = Rapl(rapl_root)
            if rapl.zones:
                self.rapl, self.energy_source, self.wraps = rapl, SCOPE, dict(rapl.wraps_mj)
            else:
                whys.append(rapl.why)
        if not self.energy_source:
            self.energy_why = "no energy reading: " + "; ".join(whys)

    def _other_gpu_source(self, gpus: list[str], dcgm_url: str | None, amd: Any, whys: list[str]) -> None:
        """A DCGM exporter (when a URL is given), else AMD SMI (`amd`: True, or a stand-in of the library)."""
        from raysweep.serve.power_sources import AmdSmi, DcgmExporter

        candidates: list[Any] = []
        if dcgm_url:
            candidates.append(lambda: DcgmExporter(dcgm_url, gpus))
        if amd:
            candidates.append(lambda: AmdSmi(gpus, None if amd is True else amd))
        for make in candidates:
            src = make()
            if not src.why:
                self.gpu_power, self.energy_source = src, src.source
                return
            whys.append(src.why)

    def _server_handles(self, gpu_ids: list[str],
                        cuda_bus_ids: Callable[[], list[str] | None] | None) -> list[tuple[str, Any]]:
        """The NVML handle of each of the server's GPUs (Ray's ids, CUDA's numbers or UUIDs): by UUID, else by
        the PCI bus id CUDA gives the device, else by NVML's index where NVML's order is CUDA's."""
        nvml = self.nvml
        if not gpu_ids:
            return []
        if all(not g.isdigit() for g in gpu_ids):  # UUIDs (GPU-..., MIG-...)
            return [(g, nvml.nvmlDeviceGetHandleByUUID(g)) for g in gpu_ids]
        if not hasattr(nvml, "nvmlDeviceGetHandleByPciBusId"):  # a stand-in indexed by position (FileNvml)
            return [(g, nvml.nvmlDeviceGetHandleByIndex(int(g))) for g in gpu_ids]
        buses = (cuda_bus_ids or cuda_pci_bus_ids)()
        if buses is not None and len(buses) == len(gpu_ids):  # this process sees exactly the server's GPUs
            handles = [(g, nvml.nvmlDeviceGetHandleByPciBusId(b)) for g, b in zip(gpu_ids, buses, strict=True)]
            log.info("GPU telemetry: Ray's GPUs %s are the devices at PCI %s", ",".join(gpu_ids), ", ".join(buses))
            return handles
        if os.environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
            names = {str(nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i)))
                     for i in range(int(nvml.nvmlDeviceGetCount()))}
            if len(names) > 1:
                raise _Unmapped(f"this node mixes GPU models ({', '.join(sorted(names))}), whose CUDA order is not "
                                "NVML's, and CUDA's driver could not say which are the server's; set "
                                "CUDA_DEVICE_ORDER=PCI_BUS_ID in the environment of `ray start`")
        return [(g, nvml.nvmlDeviceGetHandleByIndex(int(g))) for g in gpu_ids]

    def sample(self) -> list[dict[str, Any]]:
        """One reading of every GPU (a value NVML cannot give is None); its energy readings kept apart."""
        now, out = self.clock(), []
        for gpu, h in self.handles:
            row = {"t": now, "gpu": gpu, **self._readings(h)}
            # the counter's time is when it was read (the middle of that call), not the sample's start: the other
            # readings before it take time, more so on a loaded host, and a window's energy is counter over time
            before = self.clock()
            mj = self._read(lambda h=h: self.nvml.nvmlDeviceGetTotalEnergyConsumption(h))
            self.energy.append((gpu, (before + self.clock()) / 2, mj, row["power_w"]))
            out.append(row)
        if self.rapl is not None:
            before = self.clock()
            counters = self.rapl.read_mj()
            at = (before + self.clock()) / 2
            for name, mj in counters.items():
                self.energy.append((name, at, mj, None))
        if self.gpu_power is not None:
            try:
                before = self.clock()
                readings = self.gpu_power.read()
                at = (before + self.clock()) / 2
                for gpu, (mj, w) in readings.items():
                    self.energy.append((gpu, at, mj, w))
            except OSError as exc:  # the exporter did not answer this time: this reading is missing
                log.debug("%s: %s", self.energy_source, exc)
        return out

    def measure_idle(self, seconds: float) -> dict[str, float | None]:
        """Each device's idle power, read for `seconds` before the server's first load (`raysweep.maths.energy`)."""
        if self.nvml is None and self.rapl is None and self.gpu_power is None:
            return {}
        t0 = self.clock()
        self.samples.extend(self.sample())
        while self.clock() - t0 < seconds:
            time.sleep(min(self.interval_s, 0.1))
            self.samples.extend(self.sample())
        return self.idle_since(t0)

    def idle_since(self, t0: float) -> dict[str, float | None]:
        """Each device's idle power over its readings since t0 (kept as `idle_w`)."""
        from raysweep.maths.energy import NVML_WRAP_MJ, idle_power

        rows: dict[str, list[tuple[float, Any, Any]]] = {}
        for dev, t, mj, w in list(self.energy):
            if t >= t0:
                rows.setdefault(dev, []).append((t, mj, w))
        self.idle_w = {dev: idle_power(r, self.wraps.get(dev, NVML_WRAP_MJ)) for dev, r in rows.items()}
        return self.idle_w

    def energy_window(self, t0: float, t1: float) -> dict[str, Any]:
        """Every device's energy readings from the last before t0 to the first after t1, its idle power, the
        counters' wraps and the source (or why there is none)."""
        rows: dict[str, list[tuple[float, Any, Any]]] = {}
        for dev, t, mj, w in list(self.energy):
            rows.setdefault(dev, []).append((t, mj, w))
        devices = {}
        for dev, r in rows.items():
            before = [x for x in r if x[0] < t0][-1:]
            after = [x for x in r if x[0] > t1][:1]
            devices[dev] = before + [x for x in r if t0 <= x[0] <= t1] + after
        return {"source": self.energy_source, "why": self.energy_why, "devices": devices, "idle_w": self.idle_w,
                "wraps": {d: self.wraps[d] for d in devices if d in self.wraps}}

    def _readings(self, h: Any) -> dict[str, Any]:
        """One GPU's values; each lambda reads this handle `h` (a parameter, not a loop variable)."""
        nvml = self.nvml
        return {"util": self._read(lambda: nvml.nvmlDeviceGetUtilizationRates(h).gpu),
                "mem_mib": self._read(lambda: nvml.nvmlDeviceGetMemoryInfo(h).used / 2**20),
                "power_w": self._read(lambda: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0),
                "sm_mhz": self._read(lambda: nvml.nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM)),
                "reasons": self._read(lambda: self._reasons(h))}

    def _reasons(self, h: Any) -> int:
        """The clock-event (throttle) reasons: NVML's call since driver 535, else the older one of the same bits
        (an NVML binding newer than the driver has the new call, which then fails with FunctionNotFound)."""
        get = getattr(self.nvml, self._reasons_call, None)
        if get is not None:
            try:
                return int(get(h))
            except Exception as exc:
                if self._reasons_call == "nvmlDeviceGetCurrentClocksThrottleReasons" or \
                        type(exc).__name__ != "NVMLError_FunctionNotFound":
                    raise
        self._reasons_call = "nvmlDeviceGetCurrentClocksThrottleReasons"  # drivers before 535
        return int(self.nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h))

    @staticmethod
    def _read(fn: Callable[..., Any]) -> Any:
        try:
            return fn()
        except Exception:
            return None

    def start(self) -> Sampler:
        if (self.nvml is not None or self.rapl is not None or self.gpu_power is not None) and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="gpu-telemetry", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.extend(self.sample())
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()

    def window(self, t0: float, t1: float) -> dict[str, Any]:
        """The samples taken between t0 and t1, and where they come from."""
        return {"source": self.source, "samples": [s for s in list(self.samples) if t0 <= s["t"] <= t1]}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarise(windows: list[dict[str, Any]]) -> dict[str, Any]:
    """The `gpu_*` columns of a point from the windows of every node (see docs/multinode.md)."""
    sources = sorted({str(w.get("source")) for w in windows if w})
    samples = [s for w in windows if w for s in w.get("samples") or []]
    out: dict[str, Any] = {"gpu_telemetry": ", ".join(sources) or "off", "gpu_telemetry_samples": len(samples)}
    if not samples:
        return out

    def col(key: str) -> list[float]:
        return [float(s[key]) for s in samples if isinstance(s.get(key), (int, float)) and math.isfinite(s[key])]

    util, mem, power, sm = col("util"), col("mem_mib"), col("power_w"), col("sm_mhz")
    reasons = [int(s["reasons"]) for s in samples if isinstance(s.get("reasons"), int)]
    hot = [throttled(r) for r in reasons]
    names = sorted({n for h in hot for n in h})
    out.update(gpu_util_mean_pct=_mean(util), gpu_mem_used_max_mib=max(mem) if mem else None,
               gpu_power_mean_w=_mean(power), gpu_power_max_w=max(power) if power else None,
               gpu_sm_clock_mean_mhz=_mean(sm), gpu_sm_clock_min_mhz=min(sm) if sm else None,
               gpu_throttled_fraction=(sum(1 for h in hot if h) / len(hot)) if hot else None,
               gpu_throttle_reasons=",".join(names))
    return out

