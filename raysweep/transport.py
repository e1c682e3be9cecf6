"""How a server's GPUs talk: NCCL's `NCCL_DEBUG=INFO` log lines parsed and classified (pure logic).

`parse_nccl(lines)` reads a server's log (any NCCL version from 2.1x to 2.30: old PCI bus ids in the
brackets, lines with or without a connection index, `comm 0x... nRanks N` tails), after stripping ANSI
colour codes, Ray's `(Actor pid=..., ip=...)` prefixes and its `[repeated Nx across cluster]` suffixes.
It keeps every channel's transport (`P2P/CUMEM`, `P2P/IPC`, `SHM`, `NET/<plugin>` with or without
`GDRDMA`, CollNet), the `Using network IB|Socket` choice, the InfiniBand and socket devices, and the
`GDR 0|1` of the connected rings.

`classify(report)` turns that into a verdict: the intra-node links (`P2P`, `SHM`, `none`) and the
inter-node links, the slowest seen: `IB+GDR`, `IB`, `Socket` or `none`, with the evidence lines.
`meets(verdict, require)` is the gate of `transport.require: ib | gdr | any`; `refusal` words it.
`server_verdict(lines_per_rank)` does all of it for the ranks of one server.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["Link", "Report", "classify", "describe", "meets", "parse_nccl", "refusal", "server_verdict"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m|ESC\[[0-9;]*m")
_RAY_PREFIX = re.compile(r"^(?:\((?:[^()]|\([^()]*\))*\)\s*)+")
_REPEATED = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")
_CHANNEL = re.compile(
    r"NCCL INFO (?:Channel|Ring) (?P<chan>\d+)(?:/(?P<conn>\d+))? : (?P<src>\d+)(?:\[[0-9a-fx]+\])? (?:->|<-) "
    r"(?P<dst>\d+)(?:\[[0-9a-fx]+\])?(?: \[(?P<dir>send|receive)\])? via (?P<via>.+?)"
    r"(?: comm 0x[0-9a-f]+ nRanks \d+)?\s*$")
_NET = re.compile(r"^NET/(?P<plugin>.+?)/(?P<dev>\d+)(?:\(\d+\))?(?P<gdr>/GDRDMA(?:\(PCI\))?)?(?P<shared>/Shared)?$")
_COLLNET = re.compile(r"NCCL INFO CollNet \d+/\d+ : \d+ \[(?:send|receive)\] via (?P<via>COLLNET/\S+)")
_USING_NETWORK = re.compile(r"NCCL INFO Using network (?P<name>.+?)\s*$")
_NET_USING = re.compile(r"NCCL INFO NET/(?P<net>IB|Socket) : Using(?P<devs>.*?)(?:; OOB .*)?$")
_NO_IB = re.compile(r"NCCL INFO NET/IB : No device found")
_RINGS = re.compile(r"NCCL INFO Connected all rings(?:, use ring PXN (?P<pxn>\d+) GDR (?P<gdr>\d+))?")
_VERSION = re.compile(r"NCCL version (?P<v>[0-9][0-9.]*\S*)")
_IB_DEV = re.compile(r"\[\d+\]\s*(?P<dev>[A-Za-z0-9_]+):\d+/(?P<link>IB|RoCE)")
_SOCK_DEV = re.compile(r"\[\d+\](?P<dev>[A-Za-z0-9_.-]+):(?P<addr>[0-9a-fA-F.:%]+)<\d+>")
RANK = {"none": 0, "Socket": 1, "IB": 2, "IB+GDR": 3}


@dataclass(frozen=True)
class Link:
    channel: int
    src: int
    dst: int
    transport: str      # P2P, SHM, NET, COLLNET
    detail: str         # the part after "via", e.g. NET/IB/0/GDRDMA
    plugin: str = ""    # NET: IB, IBext_v8, Socket, AWS Libfabric, ...
    gdr: bool = False


@dataclass
class Report:
    links: list[Link] = field(default_factory=list)
    networks: set[str] = field(default_factory=set)
    ib_devices: list[str] = field(default_factory=list)
    socket_devices: list[str] = field(default_factory=list)
    no_ib_device: bool = False
    ring_gdr: set[int] = field(default_factory=set)
    versions: set[str] = field(default_factory=set)
    evidence: list[str] = field(default_factory=list)


def _clean(line: str) -> str:
    line = _ANSI.sub("", line).strip()
    line = _RAY_PREFIX.sub("", line)
    return _REPEATED.sub("", line)


def parse_nccl(lines: Iterable[str]) -> Report:
    """Everything NCCL said about its transports in these log lines."""
    rep = Report()
    for raw in lines:
        if "NCCL" not in raw:
            continue
        line = _clean(raw)
        kept = True
        if m := _CHANNEL.search(line):
            rep.links.append(_link(m))
        elif m := _COLLNET.search(line):
            rep.links.append(Link(0, 0, 0, "COLLNET", m.group("via")))
        elif m := _USING_NETWORK.search(line):
            rep.networks.add(m.group("name"))
        elif m := _NET_USING.search(line):
            devs = m.group("devs")
            if m.group("net") == "IB":
                rep.ib_devices += [f"{d.group('dev')}/{d.group('link')}" for d in _IB_DEV.finditer(devs)]
            else:
                rep.socket_devices += [f"{d.group('dev')}:{d.group('addr')}" for d in _SOCK_DEV.finditer(devs)]
        elif _NO_IB.search(line):
            rep.no_ib_device = True
        elif m := _RINGS.search(line):
            if m.group("gdr") is not None:
                rep.ring_gdr.add(int(m.group("gdr")))
        elif m := _VERSION.search(line):
            rep.versions.add(m.group("v"))
        else:
            kept = False
        if kept and len(rep.evidence) < 200:
            rep.evidence.append(line)
    return rep


def _link(m: re.Match[str]) -> Link:
    via = m.group("via").strip()
    chan, src, dst = int(m.group("chan")), int(m.group("src")), int(m.group("dst"))
    if via.startswith("NET/"):
        n = _NET.match(via)
        plugin = n.group("plugin") if n else via.split("/")[1]
        return Link(chan, src, dst, "NET", via, plugin, bool(n and n.group("gdr")))
    kind = "P2P" if via.startswith("P2P/") else "SHM" if via.startswith(("SHM/", "direct shared memory")) else via
    return Link(chan, src, dst, kind, via)


def _net_kind(link: Link) -> str:
    if link.plugin.startswith("IB"):
        return "IB+GDR" if link.gdr else "IB"
    if link.plugin == "Socket":
        return "Socket"
    return "IB+GDR" if link.gdr else "IB"  # other RDMA plugins (e.g. AWS Libfabric): RDMA, GDR as they say


def classify(rep: Report) -> dict[str, object]:
    """The verdict: `intra` (P2P / SHM / none), `inter` (the slowest cross-node kind: IB+GDR, IB, Socket,
    none), the plugins seen, and the evidence lines."""
    nets = [lk for lk in rep.links if lk.transport == "NET"]
    kinds = {_net_kind(lk) for lk in nets}
    if "IB+GDR" in kinds and 0 in rep.ring_gdr:  # the rings themselves were connected without GPUDirect
        kinds = (kinds - {"IB+GDR"}) | {"IB"}
    inter = min(kinds, key=RANK.__getitem__) if kinds else ("Socket" if rep.networks == {"Socket"} and rep.links
                                                            else "none")
    local = {lk.transport for lk in rep.links if lk.transport in ("P2P", "SHM")}
    intra = "P2P" if "P2P" in local else "SHM" if "SHM" in local else "none"
    return {"intra": intra, "inter": inter, "plugins": sorted({lk.plugin for lk in nets}),
            "networks": sorted(rep.networks), "ib_devices": list(dict.fromkeys(rep.ib_devices)), "versions": sorted(rep.versions),
            "channels": len(rep.links), "evidence": rep.evidence[:40]}


def meets(verdict: dict[str, object], require: str) -> bool:
    """Whether the cross-node links are at least what `transport.require` asks (`any`, `ib`, `gdr`)."""
    if require == "any":
        return True
    need = {"ib": RANK["IB"], "gdr": RANK["IB+GDR"]}[require]
    return RANK.get(str(verdict["inter"]), 0) >= need


REQUIRED = {"ib": "IB", "gdr": "IB+GDR"}


def server_verdict(lines_per_rank: list[list[str]]) -> dict[str, object]:
    """The verdict of one server from the NCCL lines of each of its ranks (one rank per node)."""
    verdict = classify(parse_nccl(line for lines in lines_per_rank for line in lines))
    verdict["nnodes"] = len(lines_per_rank)
    verdict["ranks_with_nccl"] = sum(1 for lines in lines_per_rank if lines)
    return verdict


def describe(verdict: dict[str, object]) -> str:
    """One line for tables: `inter-node IB+GDR (IB), intra-node P2P, NCCL 2.21.5`."""
    parts = []
    if int(verdict.get("nnodes", 1) or 1) > 1:
        plugins = ", ".join(str(p) for p in verdict.get("plugins") or [])  # type: ignore[attr-defined]
        parts.append(f"inter-node {verdict['inter']}" + (f" ({plugins})" if plugins else ""))
    parts.append(f"intra-node {verdict['intra']}")
    versions = verdict.get("versions") or []
    if versions:
        parts.append("NCCL " + ", ".join(str(v) for v in versions))  # type: ignore[attr-defined]
    if not verdict.get("channels"):
        parts.append("no NCCL channel seen")
    return ", ".join(parts)


def refusal(verdict: dict[str, object], require: str) -> str | None:
    """Why a multi-node server fails `transport.require`, with the evidence; None when it passes (a server
    on one node always passes: the requirement is about links between nodes)."""
    if int(verdict.get("nnodes", 1) or 1) < 2 or meets(verdict, require):
        return None
    evidence = [str(e) for e in verdict.get("evidence") or []][:8]  # type: ignore[attr-defined]
    if verdict["inter"] == "none":
        why = (f"no cross-node NCCL link was seen in the logs of its {verdict['nnodes']} ranks "
               f"({verdict.get('ranks_with_nccl', 0)} printed NCCL lines), so {REQUIRED[require]} cannot be confirmed")
    else:
        why = f"its cross-node links are {verdict['inter']}, slower than the {REQUIRED[require]} required"
        if verdict["inter"] == "Socket":
            why += " (NCCL fell back to TCP sockets)"
    return f"transport.require {require}: {why}" + ("; evidence:\n" + "\n".join(evidence) if evidence else "")
