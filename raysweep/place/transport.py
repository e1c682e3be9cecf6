"""How a server's GPUs talk: NCCL's `NCCL_DEBUG=INFO` log lines parsed and classified (pure logic).

`parse_nccl(lines)` reads a server's log (any NCCL version from 2.1x to 2.30: old PCI bus ids in the
brackets, lines with or without a connection index, `comm 0x... nRanks N` tails), after stripping ANSI
colour codes, Ray's `(Actor pid=..., ip=...)` prefixes and its `[repeated Nx across cluster]` suffixes.
It keeps every channel's transport (`P2P/CUMEM`, `P2P/IPC`, `SHM`, `NET/<plugin>` with or without
`GDRDMA`, CollNet), the `Using network IB|Socket` choice, the InfiniBand and socket devices, and the
`GDR 0|1` of the connected rings.

`classify(report)` turns that into a verdict: the intra-node links (`P2P`, `SHM`, `none`) and the
inter-node links, the slowest seen: `IB+GDR`, `IB`, `OFI+GDR`, `OFI` (libfabric, e.g. AWS EFA), `Socket`
or `none`, with the evidence lines. `link_table(lines_per_rank)` is the per-link table: one row per pair
of NCCL ranks that NCCL connected (the node of each rank, the class of the link, how many channels), and
one per pair of nodes. `meets(verdict, require)` is the gate of `transport.require: any | rdma | ib | gdr`,
which every cross-node link of the table must pass; `refusal` words it. `server_verdict(lines_per_rank)`
does all of it for the ranks of one server (one list of lines per node).
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ACCEPTED", "Link", "Report", "classify", "describe", "describe_links", "describe_probe_links",
           "independent_nodes", "link_class", "link_table", "link_text", "meets", "needs_cross_node", "parse_nccl",
           "recorded_lines", "refusal", "server_verdict"]

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
_HOST = re.compile(r"(?:^|\s)(?P<host>[^\s:\[\]]+):\d+:\d+ \[\d+\] NCCL INFO")
_RINGS = re.compile(r"NCCL INFO Connected all rings(?:, use ring PXN (?P<pxn>\d+) GDR (?P<gdr>\d+))?")
_VERSION = re.compile(r"NCCL version (?P<v>[0-9][0-9.]*\S*)")
_IB_DEV = re.compile(r"\[\d+\]\s*(?P<dev>[A-Za-z0-9_]+):\d+/(?P<link>IB|RoCE)")
_SOCK_DEV = re.compile(r"\[\d+\](?P<dev>[A-Za-z0-9_.-]+):(?P<addr>[0-9a-fA-F.:%]+)<\d+>")
RANK = {"none": 0, "Socket": 1, "NET": 1, "OFI": 2, "IB": 2, "OFI+GDR": 3, "IB+GDR": 3}
# the cross-node classes each `transport.require` accepts
ACCEPTED: dict[str, frozenset[str]] = {
    "rdma": frozenset({"IB", "IB+GDR", "OFI", "OFI+GDR"}), "ib": frozenset({"IB", "IB+GDR"}),
    "gdr": frozenset({"IB+GDR", "OFI+GDR"})}
_OFI_PLUGINS = ("libfabric", "ofi", "efa")


@dataclass(frozen=True)
class Link:
    channel: int
    src: int
    dst: int
    transport: str      # P2P, SHM, NET, COLLNET
    detail: str         # the part after "via", e.g. NET/IB/0/GDRDMA
    plugin: str = ""    # NET: IB, IBext_v8, Socket, AWS Libfabric, ...
    gdr: bool = False
    direction: str = ""  # send / receive (the local rank is dst on a receive line, src otherwise)
    host: str = ""       # the host NCCL named at the start of the line (`host:pid:tid [dev] NCCL INFO`)

    @property
    def local(self) -> int:
        """The rank that printed the line."""
        return self.dst if self.direction == "receive" else self.src


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
            h = _HOST.search(line)
            rep.links.append(dataclasses.replace(_link(m), host=h.group("host") if h else ""))
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
        return Link(chan, src, dst, "NET", via, plugin, bool(n and n.group("gdr")), m.group("dir") or "")
    kind = "P2P" if via.startswith("P2P/") else "SHM" if via.startswith(("SHM/", "direct shared memory")) else via
    return Link(chan, src, dst, kind, via, direction=m.group("dir") or "")


def _net_kind(link: Link) -> str:
    plugin = link.plugin.lower()
    if plugin.startswith("ib"):
        return "IB+GDR" if link.gdr else "IB"
    if plugin == "socket":
        return "Socket"
    if any(p in plugin for p in _OFI_PLUGINS):  # libfabric (AWS EFA and others): RDMA, not InfiniBand
        return "OFI+GDR" if link.gdr else "OFI"
    return "NET"  # a plugin not known to be RDMA (e.g. TCPX): accepted only by `any`


def link_class(link: Link) -> str:
    """The class of one channel's link: P2P, SHM, IB, IB+GDR, OFI, OFI+GDR, Socket, NET, CollNet."""
    if link.transport == "NET":
        return _net_kind(link)
    return "CollNet" if link.transport == "COLLNET" else link.transport


def classify(rep: Report) -> dict[str, object]:
    """The verdict: `intra` (P2P / SHM / none), `inter` (the slowest cross-node kind: IB+GDR, IB, Socket,
    none), the plugins seen, and the evidence lines."""
    nets = [lk for lk in rep.links if lk.transport == "NET"]
    kinds = {_net_kind(lk) for lk in nets}
    if 0 in rep.ring_gdr:  # the rings themselves were connected without GPUDirect
        kinds = {k.removesuffix("+GDR") for k in kinds}
    inter = min(kinds, key=RANK.__getitem__) if kinds else ("Socket" if rep.networks == {"Socket"} and rep.links
                                                            else "none")
    local = {lk.transport for lk in rep.links if lk.transport in ("P2P", "SHM")}
    intra = "P2P" if "P2P" in local else "SHM" if "SHM" in local else "none"
    return {"intra": intra, "inter": inter, "inter_kinds": sorted(kinds, key=RANK.__getitem__),
            "plugins": sorted({lk.plugin for lk in nets}), "networks": sorted(rep.networks),
            "ib_devices": list(dict.fromkeys(rep.ib_devices)), "versions": sorted(rep.versions),
            "channels": len(rep.links), "evidence": rep.evidence[:40]}


def _cross_kinds(verdict: dict[str, object]) -> set[str]:
    """Every cross-node class of a verdict: from its node-pair table, else its kinds, else its slowest."""
    pairs = [r for r in verdict.get("node_links") or [] if r["src_node"] != r["dst_node"]]  # type: ignore[attr-defined]
    if pairs:
        return {str(k) for r in pairs for k in r["kinds"]}
    return {str(k) for k in verdict.get("inter_kinds") or [verdict["inter"]]}  # type: ignore[attr-defined]


def meets(verdict: dict[str, object], require: str) -> bool:
    """Whether every cross-node link is of a class `transport.require` accepts (`any`, `rdma`, `ib`, `gdr`)."""
    if require == "any":
        return True
    kinds = _cross_kinds(verdict) - {"none"}
    return bool(kinds) and kinds <= ACCEPTED[require]


REQUIRED = {"rdma": "RDMA (IB or OFI)", "ib": "IB", "gdr": "GPUDirect RDMA (IB+GDR or OFI+GDR)"}


def _rank_nodes(per_node: list[list[Link]]) -> dict[int, int]:
    """The node (index into the logs) of every rank that printed a channel line. A line's node is that of
    the host it names (NCCL_DEBUG_FILE on a shared filesystem lets one node read another's lines): each log's
    most common host not taken by an earlier log is that log's node; a line without a host belongs to the log
    it came from."""
    index: dict[str, int] = {}
    for node, links in enumerate(per_node):
        hosts = Counter(lk.host for lk in links if lk.host and lk.host not in index)
        if hosts:  # the most common host not yet given to an earlier log
            index[hosts.most_common(1)[0][0]] = node
    node_of: dict[int, int] = {}
    for node, links in enumerate(per_node):
        for lk in links:
            if lk.host and lk.host not in index:
                index[lk.host] = len(per_node) + len({i for i in index.values() if i >= len(per_node)})
            node_of.setdefault(lk.local, index[lk.host] if lk.host else node)
    return node_of


def link_table(lines_per_rank: list[list[str]]) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """The links of one server, from the NCCL lines of each node (index = node rank): one row per pair of
    NCCL ranks (`src`, `dst`, `src_node`, `dst_node` (None when no line of that rank was seen), `kind`:
    the slowest class over its channels, `channels`, `detail`: the `via` texts), and one row per pair of
    nodes (`src_node`, `dst_node`, `kinds`, `rank_pairs`)."""
    per_node = [[lk for lk in parse_nccl(lines).links if lk.transport != "COLLNET"] for lines in lines_per_rank]
    node_of = _rank_nodes(per_node)
    pairs: dict[tuple[int, int], dict[str, object]] = {}
    for links in per_node:
        for lk in links:
            row = pairs.setdefault((lk.src, lk.dst), {"src": lk.src, "dst": lk.dst, "src_node": node_of.get(lk.src),
                                                       "dst_node": node_of.get(lk.dst), "kinds": set(), "detail": set(),
                                                       "channels": set()})
            row["kinds"].add(link_class(lk))  # type: ignore[attr-defined]
            row["detail"].add(lk.detail)  # type: ignore[attr-defined]
            row["channels"].add(lk.channel)  # type: ignore[attr-defined]
    rank_rows = []
    for _pair, row in sorted(pairs.items()):
        kinds = sorted(row.pop("kinds"), key=lambda k: RANK.get(k, 4))  # type: ignore[call-overload]
        rank_rows.append({**row, "kind": kinds[0], "channels": len(row["channels"]),  # type: ignore[arg-type]
                          "detail": ", ".join(sorted(row["detail"]))})  # type: ignore[call-overload]
    nodes: dict[tuple[object, object], dict[str, object]] = {}
    for r in rank_rows:
        n = nodes.setdefault((r["src_node"], r["dst_node"]), {"src_node": r["src_node"], "dst_node": r["dst_node"],
                                                              "kinds": set(), "rank_pairs": 0})
        n["kinds"].add(r["kind"])  # type: ignore[attr-defined]
        n["rank_pairs"] = int(n["rank_pairs"]) + 1  # type: ignore[call-overload]
    node_rows = [{**n, "kinds": sorted(n["kinds"], key=lambda k: RANK.get(k, 4))}  # type: ignore[call-overload]
                 for _, n in sorted(nodes.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1])))]
    return rank_rows, node_rows


_EXPERT_PARALLEL = ("--enable-expert-parallel", "--enable_expert_parallel", "-ep")


def needs_cross_node(mode: str, nnodes: int, argv: list[str]) -> bool:
    """Whether a server laid out this way has NCCL links between its nodes at all: a replica across nodes
    (mode `nnodes`: pipeline stages, or tensor/context-parallel groups, on several nodes) does; whole
    data-parallel replicas per node (mode `dp`) do not, unless the model's experts are spread over the
    data-parallel ranks (`--enable-expert-parallel`): vLLM runs the data-parallel ranks of a dense model as
    independent engines (`vllm/v1/engine/core.py`, `reconfigure_for_independent_dp_rank`). A mixture-of-experts
    model without expert parallelism still all-gathers across its data-parallel ranks; its links are judged
    when NCCL prints them."""
    if nnodes < 2:
        return False
    if mode != "dp":
        return True
    on = False
    for tok in argv:  # the last word wins, as in vLLM's parser
        name, _, value = tok.partition("=")
        if name in _EXPERT_PARALLEL:
            on = value.lower() not in ("false", "0") if value else True
        elif name in ("--no-enable-expert-parallel", "--no-enable_expert_parallel"):
            on = False
    return on


def server_verdict(lines_per_rank: list[list[str]], cross_node: bool | None = None) -> dict[str, object]:
    """The verdict of one server from the NCCL lines of each of its ranks (one rank per node), with its
    per-link tables (`links`: rank pairs, `node_links`: node pairs). `cross_node` (`needs_cross_node`):
    whether its layout links its nodes through NCCL at all; False (data-parallel replicas, one set per node)
    and no cross-node link seen is no refusal. None: as for a replica across nodes."""
    rep = parse_nccl(line for lines in lines_per_rank for line in lines)
    verdict = classify(rep)
    verdict["nnodes"] = len(lines_per_rank)
    verdict["cross_node"] = len(lines_per_rank) > 1 if cross_node is None else bool(cross_node)
    verdict["ranks_with_nccl"] = sum(1 for lines in lines_per_rank if lines)
    verdict["links"], verdict["node_links"] = link_table(lines_per_rank)
    pairs: list[dict[str, Any]] = verdict["node_links"]  # type: ignore[assignment]
    cross = [str(k) for r in pairs if r["src_node"] != r["dst_node"] and None not in (r["src_node"], r["dst_node"])
             for k in r["kinds"]]
    if 0 in rep.ring_gdr:  # the rings themselves were connected without GPUDirect
        cross = [k.removesuffix("+GDR") for k in cross]
    if cross:  # the slowest cross-node link as the node-pair table saw it
        verdict["inter"] = min(cross, key=lambda k: RANK.get(k, 0))
        verdict["inter_kinds"] = sorted(set(cross), key=lambda k: RANK.get(k, 0))
    return verdict


def describe_links(verdict: dict[str, object], node_names: list[str] | None = None) -> list[str]:
    """One line per pair of nodes: `node 0 (10.0.0.1) -> node 1 (10.0.0.2): IB+GDR (4 rank pairs)`."""
    def name(i: object) -> str:
        if i is None:
            return "node ?"
        known = node_names and int(i) < len(node_names)  # type: ignore[call-overload]
        return f"node {i}" + (f" ({node_names[int(i)]})" if known else "")  # type: ignore[call-overload,index]
    return [f"{name(r['src_node'])} -> {name(r['dst_node'])}: {', '.join(r['kinds'])} ({r['rank_pairs']} rank pair"
            f"{'s' if r['rank_pairs'] != 1 else ''})" for r in verdict.get("node_links") or []]  # type: ignore[attr-defined]


def _nnodes(verdict: dict[str, object]) -> int:
    """The server's node count as the verdict records it (1 when absent)."""
    n = verdict.get("nnodes", 1)
    return int(n or 1) if isinstance(n, (int, float, str)) else 1


def describe(verdict: dict[str, object]) -> str:
    """One line for tables: `inter-node IB+GDR (IB), intra-node P2P, NCCL 2.21.5`."""
    parts = []
    if _nnodes(verdict) > 1 and independent_nodes(verdict):
        parts.append("no NCCL link between nodes (data-parallel replicas, each within its node)")
    elif _nnodes(verdict) > 1:
        plugins = ", ".join(str(p) for p in verdict.get("plugins") or [])  # type: ignore[attr-defined]
        parts.append(f"inter-node {verdict['inter']}" + (f" ({plugins})" if plugins else ""))
    parts.append(f"intra-node {verdict['intra']}")
    versions = verdict.get("versions") or []
    if versions:
        parts.append("NCCL " + ", ".join(str(v) for v in versions))  # type: ignore[attr-defined]
    if not verdict.get("channels"):
        parts.append("no NCCL channel seen")
    return ", ".join(parts)


def independent_nodes(verdict: dict[str, object]) -> bool:
    """A multi-node server whose layout needs no NCCL link between its nodes (`cross_node` False: whole
    data-parallel replicas per node) and where none was seen: nothing crosses the fabric to judge."""
    return verdict.get("cross_node") is False and verdict.get("inter") == "none"


def refusal(verdict: dict[str, object], require: str) -> str | None:
    """Why a multi-node server fails `transport.require`, with the evidence; None when it passes (a server
    on one node always passes: the requirement is about links between nodes)."""
    if _nnodes(verdict) < 2 or meets(verdict, require) or independent_nodes(verdict):
        return None
    evidence = [str(e) for e in verdict.get("evidence") or []][:8]  # type: ignore[attr-defined]
    if verdict["inter"] == "none":
        why = (f"no cross-node NCCL link was seen in the logs of its {verdict['nnodes']} ranks "
               f"({verdict.get('ranks_with_nccl', 0)} printed NCCL lines), so {REQUIRED[require]} cannot be confirmed")
    else:
        bad = sorted(_cross_kinds(verdict) - ACCEPTED[require] - {"none"}) or [str(verdict["inter"])]
        why = f"its cross-node links include {', '.join(bad)}, not the {REQUIRED[require]} required"
        if verdict["inter"] == "Socket":
            why += " (NCCL fell back to TCP sockets)"
    links = describe_links(verdict)
    return (f"transport.require {require}: {why}" + ("; links:\n" + "\n".join(links) if links else "")
            + ("; evidence:\n" + "\n".join(evidence) if evidence else ""))


def recorded_lines(servers: list[Any]) -> list[str]:
    """What the latest server of each configuration got (ledger `ServerRow`s): its links per node pair and its
    fabric probe, for the dry run of a campaign being resumed."""
    latest = {s.serve_id: s for s in servers if s.transport or s.fabric}
    out = []
    for serve_id, s in latest.items():
        v = s.transport_verdict() or {}
        names = [str(r.get("node_ip") or "?") for r in s.rank_list()]
        out.append(f"  {serve_id} (server {s.server_id}): " + (describe(v) if v else "no transport verdict"))
        out += [f"    {line}" for line in describe_links(v, names)]
        probe = s.fabric_record()
        if probe:
            out.append("    fabric probe: " + (f"{probe['busbw_gbps']:.2f} GB/s bus bandwidth ({probe.get('backend')})"
                                               if probe.get("busbw_gbps") is not None
                                               else f"failed: {probe.get('error')}"))
    return out


# ---------------------------------------------------------------------------------------------------
# The links the fabric probe measured (raysweep.fabric), as text
# ---------------------------------------------------------------------------------------------------

def link_text(link: dict[str, Any]) -> str:
    """`host-2 10.0.0.2 (eth1, MTU 1500) <-> host-3 10.0.0.3 (eth1, MTU 1500)`."""
    def end(e: dict[str, Any]) -> str:
        return f"{e.get('hostname') or str(e.get('node_id'))[:8]} {e.get('ip')} ({e.get('iface')}, MTU {e.get('mtu')})"
    return f"{end(link['a'])} <-> {end(link['b'])}"


def describe_probe_links(probe: dict[str, Any] | None) -> list[str]:
    """One line per node pair the probe measured: both ends (host, address, interface, MTU) and its bandwidth."""
    out = []
    for lk in (probe or {}).get("links") or []:
        bw = lk.get("busbw_gbps")
        got = f"{bw:.3g} GB/s bus bandwidth" if bw is not None else f"not measured ({lk.get('error')})"
        out.append(f"{link_text(lk)}: {got} ({probe.get('backend') if probe else ''})")
    return out
