"""A lab cluster: N real hosts on one machine, each its own network, UTS, IPC and mount namespaces, on a
private bridge, with a Ray node in each (the head in the first). `raysweep lab up|status|down|exec` wraps it.

Each host is an anchor process (`ip netns exec NS unshare --uts --ipc sleep infinity`) that holds its
namespaces: its own hostname, its own System V IPC, its own `/dev/shm` (a tmpfs mounted in its own mount
namespace) and its own `/etc/hosts` (`/etc/netns/NS/hosts`: the other hosts by name and, as Debian writes it,
its own name on 127.0.1.1, the trap real clusters set for gloo). Every process of a host is started with
`nsenter` into the anchor's namespaces, so the only path between hosts is the bridge: TCP over a veth pair
each, addresses in a subnet that the machine routes nowhere else (checked with `ip route get` and the route
tables before anything is made). No host has a default route: no packet of the lab leaves the machine.

A state file (`/run/raysweep-lab/NAME.json`, written whole) names what the lab made. `down` stops every
process of every host found by its network namespace (`ip netns pids`; Ray's agents carry no mark of their
node in their command line), SIGTERM then SIGKILL, then deletes the namespaces, the veths and the bridge;
it also finds what a lab of that name left without a state file (its names share the prefix `rs<NAME>`),
and `down_stale` clears every lab made by a process (a test session, a
benchmark) that is gone. `up` clears a dead lab of its name first, and refuses one that is up.

Partitions and link shaping for tests and benchmarks: `cut` (link down, or a `prohibit` route), `heal`,
`cap` (a `tbf` qdisc), `restart_ray` (the host's Ray started again, as an operator would after a heal).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_SUBNET", "LabError", "LabSpec", "cap", "check_root", "check_subnet", "cut", "down",
           "down_stale", "exec_argv", "heal", "load_state", "nodes_alive", "restart_ray", "status", "up",
           "wait_nodes"]

log = logging.getLogger(__name__)

STATE_DIR = Path(os.environ.get("RAYSWEEP_LAB_STATE_DIR", "/run/raysweep-lab"))
DEFAULT_SUBNET = "10.77.0.0/24"
PREFIX = "rs"            # every name the lab makes starts with rs<NAME>
RAY_PORT = 6379
DASHBOARD_PORT = 8265
START_ATTEMPTS = 3
# Variables that must not reach a lab host: the loopback-only settings of this machine's tests (lab hosts
# talk over their own addresses; RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 makes `ray start --address` refuse).
HOST_ENV_DROP = ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "VLLM_HOST_IP", "RAY_ADDRESS", "GLOO_SOCKET_IFNAME",
                 "NCCL_SOCKET_IFNAME")
# Failure detection of the lab's GCS: a node cut off was declared dead in 14.4 to 15.1 s (benchmarks/RESULTS.md),
# yet a raylet starved of CPU by a vLLM server on a 2-core machine is not taken for dead.
FAST_HEALTH = {"RAY_health_check_initial_delay_ms": "0", "RAY_health_check_period_ms": "1000",
               "RAY_health_check_timeout_ms": "2000", "RAY_health_check_failure_threshold": "5"}


class LabError(Exception):
    """A lab cannot be made or found as asked; `code` is the exit code (2: bad input, nothing created)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class LabSpec:
    """What `up` makes. Per-host lists are indexed by host (the head first); shorter lists repeat their last value."""

    name: str = "lab"
    hosts: int = 3
    subnet: str = DEFAULT_SUBNET
    gpus: list[int] = field(default_factory=lambda: [0, 1, 1])
    cpus: list[int] = field(default_factory=lambda: [2, 1, 1])
    object_store_mb: int = 128
    shm_mb: int = 2048
    fast_health: bool = True
    pin: bool | None = None      # None: pin each host to its own cores when every host gets two at least
    dashboard: bool = True
    env: dict[str, str] = field(default_factory=dict)   # extra variables for every host's Ray
    persistent: bool = False     # made by `raysweep lab up`: up until `down`, whoever made it (no owner)
    ray: bool = True             # start Ray on every host (a lab for a scheduler that starts Ray itself: False)

    def per_host(self, values: list[int], i: int) -> int:
        return values[min(i, len(values) - 1)] if values else 0


# ---------------------------------------------------------------------------------------------------
# Commands and names
# ---------------------------------------------------------------------------------------------------

def _run(argv: list[str], check: bool = True, timeout: float = 60.0, **kw: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if check and proc.returncode:
        raise LabError(f"`{' '.join(argv)}` failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def _ip_json(*args: str) -> list[dict[str, Any]]:
    out = _run(["ip", "-j", *args], check=False).stdout.strip()
    try:
        data = json.loads(out) if out else []
    except ValueError:
        return []
    return data if isinstance(data, list) else [data]


def prefix(name: str) -> str:
    return f"{PREFIX}{name}"


def bridge_name(name: str) -> str:
    return f"{prefix(name)}-br"


def host_names(name: str, i: int) -> dict[str, str]:
    """Host i's (1-based) namespace and hostname, its veth's end on the bridge and its end inside the host.
    Interface names differ per host (a rank given another host's interface name fails, as it would)."""
    p = prefix(name)
    return {"netns": f"{p}-{i}", "hostname": f"{p}-{i}", "veth": f"{p}-v{i}", "dev": f"{p}-e{i}"}


def check_name(name: str) -> None:
    if not (name.isalnum() and name.islower() or name.isdigit()) or not 1 <= len(name) <= 6:
        raise LabError(f"--name: {name!r} is not accepted: 1 to 6 lower-case letters or digits "
                       "(interface names are at most 15 characters)", 2)


# ---------------------------------------------------------------------------------------------------
# Safety
# ---------------------------------------------------------------------------------------------------

def check_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (network namespaces, veth pairs, a bridge): run it as root, e.g. "
                       "`sudo raysweep lab up`; nothing was created", 2)
    missing = [t for t in ("ip", "unshare", "nsenter", "tc") if shutil.which(t) is None]
    if missing:
        raise LabError(f"the lab needs {', '.join(missing)} (iproute2, util-linux); nothing was created", 2)


def _network(subnet: str, hosts: int) -> ipaddress.IPv4Network:
    try:
        net = ipaddress.IPv4Network(subnet, strict=True)
    except ValueError as exc:
        raise LabError(f"--subnet: {subnet!r} is not an IPv4 network ({exc}); e.g. {DEFAULT_SUBNET}", 2) from None
    if not net.is_private:
        raise LabError(f"--subnet: {subnet} is not a private network (RFC 1918); e.g. {DEFAULT_SUBNET}", 2)
    if net.num_addresses - 2 < hosts + 1:
        raise LabError(f"--subnet: {subnet} has no room for the bridge and {hosts} hosts", 2)
    return net


def check_subnet(subnet: str, hosts: int = 3, ours: str | None = None) -> ipaddress.IPv4Network:
    """Refuse (exit 2) a subnet that this machine already routes or addresses anywhere (a route in any table
    overlapping it, an address in it, or `ip route get` of its addresses sent to a device by anything but
    the default route). `ours`: the lab's own bridge, whose routes do not count."""
    net = _network(subnet, hosts)
    for r in _ip_json("-4", "route", "show", "table", "all"):
        dst = r.get("dst", "")
        if dst in ("default", "") or r.get("dev") == ours or r.get("type") in ("broadcast", "local") \
                and r.get("dev") == ours:
            continue
        with contextlib.suppress(ValueError):
            if ipaddress.IPv4Network(dst, strict=False).overlaps(net):
                raise LabError(f"--subnet: {subnet} is routed elsewhere on this machine ({dst} dev "
                               f"{r.get('dev')}, table {r.get('table', 'main')}); choose another with --subnet", 2)
    for link in _ip_json("-4", "addr", "show"):
        for a in link.get("addr_info", []):
            if link.get("ifname") != ours and ipaddress.IPv4Address(a["local"]) in net:
                raise LabError(f"--subnet: {a['local']} of {subnet} is already an address of {link.get('ifname')}; "
                               "choose another with --subnet", 2)
    defaults = {(r.get("gateway"), r.get("dev")) for r in _ip_json("-4", "route", "show", "default")}
    for addr in (net.network_address + 1, net.broadcast_address - 1):
        for got in _ip_json("-4", "route", "get", str(addr)):
            if got.get("dev") == ours or got.get("type") == "unreachable":
                continue
            if (got.get("gateway"), got.get("dev")) not in defaults:
                raise LabError(f"--subnet: `ip route get {addr}` goes to {got.get('dev')} "
                               f"{('via ' + got['gateway']) if got.get('gateway') else 'directly'}, not by the default "
                               "route: the subnet is in use here; choose another with --subnet", 2)
    return net


# ---------------------------------------------------------------------------------------------------
# State
# ---------------------------------------------------------------------------------------------------

def state_path(name: str) -> Path:
    return STATE_DIR / f"{name}.json"


def load_state(name: str) -> dict[str, Any] | None:
    try:
        return dict(json.loads(state_path(name).read_text()))
    except (OSError, ValueError):
        return None


def _save_state(state: dict[str, Any]) -> None:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    path = state_path(state["name"])
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, path)


def _owner_alive(state: dict[str, Any]) -> bool:
    import psutil

    pid, created = state.get("owner_pid"), state.get("owner_create_time")
    try:
        return bool(pid) and abs(psutil.Process(int(pid)).create_time() - float(created)) < 0.01  # type: ignore[arg-type]
    except (psutil.Error, TypeError, ValueError):
        return False


# ---------------------------------------------------------------------------------------------------
# Up
# ---------------------------------------------------------------------------------------------------

def exec_argv(state: dict[str, Any], host: int, argv: list[str], cwd: str | None = None) -> list[str]:
    """The command line that runs `argv` inside lab host `host` (1-based): its network, mount (its /etc/hosts
    and /dev/shm), UTS and IPC namespaces, on its cores when the lab pins, in `cwd` (default: this one's).

    The directory is entered by its name inside the host's mount namespace (`env --chdir`), not by nsenter's
    `--wd`, which opens it before entering: a working directory held through a mount of another namespace makes
    a relative and an absolute name of one directory two mounts, and a rename between them fails (EXDEV)."""
    h = state["hosts"][host - 1]
    pin = ["taskset", "-c", h["cpus_pinned"]] if h.get("cpus_pinned") else []
    return ["nsenter", "-t", str(h["anchor_pid"]), "-n", "-m", "-u", "-i", "--",
            "env", f"--chdir={os.path.abspath(cwd or os.getcwd())}", *pin, *argv]


def host_env(state: dict[str, Any], host: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a process of host `host`: this one less the loopback-only settings, its own TMPDIR."""
    h = state["hosts"][host - 1]
    env = {k: v for k, v in (base if base is not None else os.environ).items() if k not in HOST_ENV_DROP}
    env.update({"TMPDIR": h["tmp"], "RAY_USAGE_STATS_ENABLED": "0"})
    env.setdefault("RAY_AUTH_MODE", "disabled")
    env.update(state.get("env") or {})
    return env


def _ray_bin() -> str:
    here = Path(sys.executable).parent / "ray"
    return str(here) if here.exists() else (shutil.which("ray") or "ray")


def _pinning(spec: LabSpec) -> list[str | None]:
    cores = sorted(os.sched_getaffinity(0))
    per = len(cores) // spec.hosts
    pin = spec.pin if spec.pin is not None else per >= 2
    if not pin or per < 1:
        return [None] * spec.hosts
    return [",".join(str(c) for c in cores[i * per:(i + 1) * per]) for i in range(spec.hosts)]


def up(spec: LabSpec) -> dict[str, Any]:
    """Make the lab and start Ray on every host; returns its state (also written to the state file)."""
    check_name(spec.name)
    if not 2 <= spec.hosts <= 16:
        raise LabError(f"--hosts: {spec.hosts} is not accepted: 2 to 16", 2)
    _network(spec.subnet, spec.hosts)
    check_root()
    old = load_state(spec.name)
    if old is not None and (_owner_alive(old) or old.get("owner_pid") is None and status(spec.name)["up"]):
        raise LabError(f"lab {spec.name!r} is up already ({old.get('address')}); `raysweep lab down --name "
                       f"{spec.name}` first, or choose another --name and --subnet", 2)
    down(spec.name, quiet=True)          # what a dead lab of this name left
    net = check_subnet(spec.subnet, spec.hosts)
    import psutil

    t0 = time.monotonic()
    me = psutil.Process()
    addrs = list(net.hosts())
    br = bridge_name(spec.name)
    pins = _pinning(spec)
    root = Path(f"/tmp/{prefix(spec.name)}")
    state: dict[str, Any] = {
        "name": spec.name, "subnet": str(net), "bridge": br, "bridge_ip": str(addrs[0]), "prefixlen": net.prefixlen,
        "owner_pid": None if spec.persistent else me.pid, "owner_create_time": me.create_time(), "root": str(root),
        "hosts": [],
        "env": dict(spec.env), "pinned": any(pins), "created_at": time.time()}
    for i in range(1, spec.hosts + 1):
        state["hosts"].append({**host_names(spec.name, i), "index": i, "ip": str(addrs[i]),
                               "gpus": spec.per_host(spec.gpus, i - 1), "cpus": spec.per_host(spec.cpus, i - 1),
                               "tmp": str(root / str(i)), "cpus_pinned": pins[i - 1], "anchor_pid": None})
    _save_state(state)                   # from here on, `down` finds everything by the state and the names
    try:
        _make_network(state)
        for h in state["hosts"]:
            _make_host(state, h, spec.shm_mb)
        _save_state(state)
        if spec.ray:
            _start_rays(state, spec)
            state["address"] = f"{state['hosts'][0]['ip']}:{RAY_PORT}"
            state["dashboard"] = f"http://{state['hosts'][0]['ip']}:{DASHBOARD_PORT}" if spec.dashboard else None
            wait_nodes(state, spec.hosts, 120)
        else:
            state.update(spec=asdict(spec), address=None, dashboard=None)
        state["up_s"] = round(time.monotonic() - t0, 2)
        _save_state(state)
        return state
    except BaseException:
        down(spec.name, quiet=True)
        raise


def _make_network(state: dict[str, Any]) -> None:
    br = state["bridge"]
    _run(["ip", "link", "add", br, "type", "bridge"])
    _run(["ip", "addr", "add", f"{state['bridge_ip']}/{state['prefixlen']}", "dev", br])
    _run(["ip", "link", "set", br, "up"])
    for h in state["hosts"]:
        ns, veth, dev = h["netns"], h["veth"], h["dev"]
        _run(["ip", "netns", "add", ns])
        _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", dev])
        _run(["ip", "link", "set", dev, "netns", ns])
        _run(["ip", "link", "set", veth, "master", br])
        _run(["ip", "link", "set", veth, "up"])
        _run(["ip", "-n", ns, "addr", "add", f"{h['ip']}/{state['prefixlen']}", "dev", dev])
        _run(["ip", "-n", ns, "link", "set", dev, "up"])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])


def _hosts_file(state: dict[str, Any], me: dict[str, Any]) -> str:
    lines = ["127.0.0.1\tlocalhost", f"127.0.1.1\t{me['hostname']}",  # as Debian writes a host's own name
             "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{h['ip']}\t{h['hostname']}" for h in state["hosts"] if h is not me]
    return "\n".join(lines) + "\n"


def _make_host(state: dict[str, Any], h: dict[str, Any], shm_mb: int) -> None:
    """The host's /etc/hosts, temp dir and anchor process (its UTS, IPC and mount namespaces, its /dev/shm)."""
    etc = Path("/etc/netns") / h["netns"]
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "hosts").write_text(_hosts_file(state, h))
    (etc / "hostname").write_text(h["hostname"] + "\n")
    shutil.rmtree(h["tmp"], ignore_errors=True)
    Path(h["tmp"]).mkdir(parents=True)
    script = (f"hostname {h['hostname']} && mount -t tmpfs -o size={shm_mb}m,mode=1777 rs-shm /dev/shm "
              "&& touch /dev/shm/.rs-ready && exec sleep infinity")
    errors = Path(h["tmp"]) / "anchor.err"
    with open(errors, "wb") as err:
        anchor = subprocess.Popen(["ip", "netns", "exec", h["netns"], "unshare", "--uts", "--ipc", "sh", "-c",
                                   script], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                  start_new_session=True)
    h["anchor_pid"] = anchor.pid
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if anchor.poll() is not None:
            raise LabError(f"host {h['hostname']}: its namespaces could not be made: {errors.read_text()}")
        probe = _run(["nsenter", "-t", str(anchor.pid), "-m", "-u", "--", "sh", "-c",
                      "test -e /dev/shm/.rs-ready && hostname"], check=False)
        if probe.returncode == 0 and probe.stdout.strip() == h["hostname"]:
            return
        time.sleep(0.05)
    raise LabError(f"host {h['hostname']}: its anchor did not come up in 20 s")


def _ray_argv(state: dict[str, Any], h: dict[str, Any], spec: LabSpec) -> list[str]:
    head = state["hosts"][0]
    argv = [_ray_bin(), "start", f"--node-ip-address={h['ip']}", f"--num-cpus={h['cpus']}",
            f"--num-gpus={h['gpus']}", f"--temp-dir={h['tmp']}/ray",
            f"--object-store-memory={spec.object_store_mb * 2**20}", "--disable-usage-stats"]
    if h is head:
        argv += ["--head", f"--port={RAY_PORT}", f"--include-dashboard={'true' if spec.dashboard else 'false'}"]
        if spec.dashboard:
            argv += [f"--dashboard-host={h['ip']}", f"--dashboard-port={DASHBOARD_PORT}"]
    else:
        argv += [f"--address={head['ip']}:{RAY_PORT}"]
    return argv


def _start_ray(state: dict[str, Any], host: int, spec: LabSpec) -> None:
    h = state["hosts"][host - 1]
    env = host_env(state, host)
    if spec.fast_health:
        env.update(FAST_HEALTH)
    for attempt in range(1, START_ATTEMPTS + 1):
        out = _run(exec_argv(state, host, _ray_argv(state, h, spec)), check=False, timeout=180, env=env,
                   stdin=subprocess.DEVNULL)
        if not out.returncode:
            return
        # `ray start` gives a raylet 30 s to register with the GCS; a machine under heavy load can take longer
        log.warning("host %s: `ray start` failed (attempt %d of %d): %s", h["hostname"], attempt, START_ATTEMPTS,
                    (out.stderr.strip().splitlines() or [""])[-1])
        _clear_host(h)
    raise LabError(f"host {h['hostname']}: `ray start` failed {START_ATTEMPTS} times ({out.returncode}):\n"
                   f"{out.stderr[-3000:]}")


def _clear_host(h: dict[str, Any]) -> int:
    """Stop every process of a host but its anchor, and remove its Ray temp dir; how many were stopped."""
    pids = [p for p in _ns_pids(h["netns"]) if p != h["anchor_pid"]]
    _stop_pids(pids, 5.0)
    shutil.rmtree(Path(h["tmp"]) / "ray", ignore_errors=True)
    return len(pids)


def _start_rays(state: dict[str, Any], spec: LabSpec) -> None:
    """The head first, then each worker (one at a time: at once, they overload a small machine's GCS)."""
    state["spec"] = asdict(spec)
    for i in range(1, spec.hosts + 1):
        _start_ray(state, i, spec)


# ---------------------------------------------------------------------------------------------------
# Looking at it
# ---------------------------------------------------------------------------------------------------

def nodes_alive(state: dict[str, Any], timeout: float = 5.0) -> dict[str, str] | None:
    """Ray's view of the lab: node IP -> ALIVE or DEAD, read from the head's state API over the bridge
    (None when the dashboard does not answer)."""
    if not state.get("dashboard"):
        return None
    try:
        with urllib.request.urlopen(f"{state['dashboard']}/api/v0/nodes?limit=1000", timeout=timeout) as resp:
            data = json.loads(resp.read())
    except (OSError, ValueError):
        return None
    rows = data.get("data", {}).get("result", {}).get("result", [])
    seen: dict[str, str] = {}
    for r in sorted(rows, key=lambda r: r.get("state") == "ALIVE"):  # a host's live node wins over its dead ones
        seen[str(r.get("node_ip"))] = str(r.get("state"))
    return seen


def wait_nodes(state: dict[str, Any], n: int, timeout_s: float) -> None:
    ips = [h["ip"] for h in state["hosts"]][:n]
    deadline = time.monotonic() + timeout_s
    seen: dict[str, str] | None = None
    while time.monotonic() < deadline:
        seen = nodes_alive(state)
        if seen is not None and all(seen.get(ip) == "ALIVE" for ip in ips):
            return
        if not state.get("dashboard"):
            return
        time.sleep(0.5)
    raise LabError(f"the lab's Ray nodes did not all come up in {timeout_s:.0f} s (seen: {seen})")


def _ns_pids(netns: str) -> list[int]:
    out = _run(["ip", "netns", "pids", netns], check=False).stdout.split()
    return [int(p) for p in out if p.isdigit()]


def _netns_list() -> list[str]:
    return [r["name"] for r in _ip_json("netns", "list") if "name" in r]


def status(name: str) -> dict[str, Any]:
    """The lab as it is now: per host its namespace, anchor, processes, Ray node state; what is left of it."""
    state = load_state(name)
    nss = set(_netns_list())
    links = {r.get("ifname") for r in _ip_json("link", "show")}
    out: dict[str, Any] = {"name": name, "state_file": str(state_path(name)), "up": False, "hosts": []}
    if state is None:
        out["leftovers"] = _leftovers(name, nss, links)
        return out
    nodes = nodes_alive(state) or {}
    for h in state["hosts"]:
        out["hosts"].append({"hostname": h["hostname"], "ip": h["ip"], "dev": h["dev"], "gpus": h["gpus"],
                             "cpus": h["cpus"], "cpus_pinned": h.get("cpus_pinned"),
                             "netns": h["netns"] in nss, "processes": len(_ns_pids(h["netns"]))
                             if h["netns"] in nss else 0, "ray": nodes.get(h["ip"], "unknown")})
    out.update(up=all(h["ray"] == "ALIVE" for h in out["hosts"]), address=state.get("address"),
               dashboard=state.get("dashboard"), subnet=state["subnet"], bridge=state["bridge"],
               bridge_present=state["bridge"] in links, owner_alive=_owner_alive(state), up_s=state.get("up_s"))
    return out


def _leftovers(name: str, nss: set[str], links: set[Any]) -> dict[str, list[str]]:
    p = prefix(name) + "-"
    return {"netns": sorted(n for n in nss if n.startswith(p)),
            "links": sorted(str(x) for x in links if isinstance(x, str) and x.startswith(p))}


# ---------------------------------------------------------------------------------------------------
# Down
# ---------------------------------------------------------------------------------------------------

def _stop_pids(pids: list[int], grace_s: float) -> list[int]:
    """SIGTERM each, SIGKILL what is left after `grace_s`; the pids still alive after that."""
    import psutil

    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(pid))
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    _, alive = psutil.wait_procs(alive, timeout=5)
    return [p.pid for p in alive]


def down(name: str, quiet: bool = False, grace_s: float = 5.0) -> dict[str, Any]:
    """Stop every process of the lab's hosts by PID and delete its namespaces, veths and bridge (what the state
    file names and whatever else carries the lab's prefix). Returns what was removed and what is left."""
    check_name(name)
    check_root()
    t0 = time.monotonic()
    state = load_state(name) or {}
    nss = set(_netns_list())
    links = {r.get("ifname") for r in _ip_json("link", "show")}
    left = _leftovers(name, nss, links)
    ns_all = sorted(set(left["netns"]) | {h["netns"] for h in state.get("hosts", []) if h["netns"] in nss})
    pids: set[int] = set()
    for ns in ns_all:
        pids.update(_ns_pids(ns))
    for h in state.get("hosts", []):   # an anchor whose namespace is already gone
        if h.get("anchor_pid"):
            pids.add(int(h["anchor_pid"]))
    pids.discard(os.getpid())
    alive = _stop_pids(sorted(pids), grace_s) if pids else []
    for _ in range(3):   # what a dying process forked while the first were stopped (a job script's subshell)
        more = {p for ns in ns_all for p in _ns_pids(ns)} - pids - {os.getpid()}
        if not more:
            break
        pids |= more
        alive += _stop_pids(sorted(more), grace_s)
    for ns in ns_all:
        _run(["ip", "netns", "del", ns], check=False)
        shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
    links = {r.get("ifname") for r in _ip_json("link", "show")}
    br = bridge_name(name)
    for link in sorted(x for x in _leftovers(name, set(), links)["links"] if x != br):
        _run(["ip", "link", "del", link], check=False)
    if br in links:
        _run(["ip", "link", "del", br], check=False)
    if state.get("root"):
        shutil.rmtree(state["root"], ignore_errors=True)
    state_path(name).unlink(missing_ok=True)
    after = _leftovers(name, set(_netns_list()), {r.get("ifname") for r in _ip_json("link", "show")})
    result = {"name": name, "processes_stopped": len(pids) - len(alive), "processes_left": alive,
              "netns_removed": ns_all, "left": after, "down_s": round(time.monotonic() - t0, 2)}
    if not quiet:
        log.info("lab %s down: %s", name, result)
    return result


def down_stale() -> list[dict[str, Any]]:
    """`down` every lab whose state file names an owner process that is gone (a test session or script killed
    before it could clear its lab)."""
    done = []
    for path in sorted(STATE_DIR.glob("*.json")) if STATE_DIR.is_dir() else []:
        state = load_state(path.stem)
        if state is not None and state.get("owner_pid") is not None and not _owner_alive(state):
            done.append(down(path.stem, quiet=True))
    return done


# ---------------------------------------------------------------------------------------------------
# Faults and link shaping
# ---------------------------------------------------------------------------------------------------

def _host(state: dict[str, Any], host: int) -> dict[str, Any]:
    return dict(state["hosts"][host - 1])


def cut(state: dict[str, Any], host: int, how: str = "link") -> None:
    """Cut host `host` off the others: `link` (its interface down) or `prohibit` (a prohibit route to the
    subnet in it: connects fail with EACCES, the link stays up)."""
    h = _host(state, host)
    if how == "link":
        _run(["ip", "-n", h["netns"], "link", "set", h["dev"], "down"])
    else:
        _run(["ip", "-n", h["netns"], "route", "add", "prohibit", state["subnet"], "metric", "1"])


def heal(state: dict[str, Any], host: int) -> None:
    """Undo `cut` (both kinds)."""
    h = _host(state, host)
    _run(["ip", "-n", h["netns"], "link", "set", h["dev"], "up"], check=False)
    _run(["ip", "-n", h["netns"], "route", "del", "prohibit", state["subnet"], "metric", "1"], check=False)


def cap(state: dict[str, Any], host: int, rate: str | None) -> None:
    """Cap what host `host` sends with a `tbf` qdisc (`rate` like "100mbit"; None removes the cap)."""
    h = _host(state, host)
    _run(["tc", "-n", h["netns"], "qdisc", "del", "dev", h["dev"], "root"], check=False)
    _run(["tc", "-n", h["netns"], "qdisc", "del", "dev", h["dev"], "root"], check=False)
    if rate:
        _run(["tc", "-n", h["netns"], "qdisc", "add", "dev", h["dev"], "root", "tbf", "rate", rate,
              "burst", "64kbit", "latency", "100ms"])


def restart_ray(state: dict[str, Any], host: int) -> None:
    """Stop what runs on a worker host (by PID, its anchor kept) and start its Ray again, joining the head."""
    if host == 1:
        raise LabError("restart_ray: host 1 is the head; restart a worker host")
    h = _host(state, host)
    _clear_host(h)
    spec = LabSpec(**{k: v for k, v in (state.get("spec") or {}).items() if k in LabSpec.__dataclass_fields__})
    _start_ray(state, host, spec)
