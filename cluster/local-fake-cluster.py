#!/usr/bin/env python3
"""A fake multi-node Ray cluster on one machine, with simulated GPUs, for trying raysweep without a cluster.

It starts a head node without GPUs and N nodes with G simulated GPUs each (Ray only counts them: nothing
runs on a GPU), all on 127.0.0.1. Every node carries the labels a real cluster would have: `node-name`
(w0, w1, ...), `gpu-type`, `rack`, and Ray's own `ray.io/accelerator-type`, so campaigns with `placement`
rules can be tried as they are. It prints the address, writes it to `--address-file` once every node is
up, and runs until Ctrl-C or SIGTERM, then stops every Ray process it started and deletes its temp dir.

    .venv/bin/python cluster/local-fake-cluster.py --nodes 2 --gpus-per-node 4
    # in another shell, with the address it printed:
    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_AUTH_MODE=disabled \\
        .venv/bin/raysweep run configs/demo-cpu.yaml --address 127.0.0.1:PORT

Each node costs about 140 MiB of memory and one second to start. With vLLM's CPU build, servers really run
(the simulated GPUs only decide where); with a GPU build, they need real GPUs.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import sys
import threading
import time

from raysweep.record.files import write_text_atomic  # whole or not at all: temp file, then os.replace

# AF_UNIX socket paths are limited to 107 bytes; Ray puts `session_<date>_<pid>/sockets/plasma_store` under
# the temp dir, so the temp dir itself must stay short.
MAX_TEMP_DIR_LEN = 40
# Ray node labels follow Kubernetes label values: alphanumeric at both ends, `-_.` inside, 63 chars at most.
LABEL_VALUE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?")
# Ray and the servers it starts stay on loopback; see the README of raysweep (tests and demo do the same).
# Workers (and the servers they start) at niceness 0, not Ray's 15.
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0", "VLLM_HOST_IP": "127.0.0.1",
           "RAY_worker_niceness": "0"}


def _int_in(low: int, high: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is out of range: give {low} to {high}")
        return value
    return parse


def _label_value(text: str) -> str:
    if not LABEL_VALUE.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a valid Ray label value: 1 to 63 letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit")
    return text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="local-fake-cluster.py",
        description="Start a fake multi-node Ray cluster with simulated GPUs on this machine, for trying "
                    "raysweep. Runs until Ctrl-C or SIGTERM, then stops everything it started.")
    parser.add_argument("--nodes", type=_int_in(1, 64), default=2, help="GPU nodes besides the head (default 2)")
    parser.add_argument("--gpus-per-node", type=_int_in(0, 64), default=4,
                        help="simulated GPUs per node (default 4; 0 for CPU-only nodes)")
    parser.add_argument("--cpus-per-node", type=_int_in(1, 1024), default=2,
                        help="logical CPUs each node offers to Ray (default 2)")
    parser.add_argument("--head-cpus", type=_int_in(0, 1024), default=2,
                        help="logical CPUs of the head node, which has no GPU (default 2; raysweep's "
                             "load-generating client actors need CPUs somewhere)")
    parser.add_argument("--gpu-type", type=_label_value, default="H100",
                        help="value of the `gpu-type` and `ray.io/accelerator-type` labels of the GPU nodes "
                             "(default H100)")
    parser.add_argument("--racks", type=_int_in(1, 64), default=1,
                        help="spread the nodes over this many `rack` labels, r0, r1, ... (default 1)")
    parser.add_argument("--object-store-mb", type=_int_in(80, 1 << 20), default=150,
                        help="object store per node in MiB (default 150)")
    parser.add_argument("--address-file", metavar="PATH",
                        help="write the cluster address (HOST:PORT) to PATH once every node is up; the file "
                             "is removed again at shutdown")
    parser.add_argument("--temp-dir", metavar="DIR",
                        help=f"Ray's temp dir, created here and deleted at shutdown; at most {MAX_TEMP_DIR_LEN} "
                             "characters (default /tmp/rs-fake-PID)")
    parser.add_argument("--dashboard", action="store_true",
                        help="start Ray's dashboard on 127.0.0.1 (off by default: it costs about 300 MiB)")
    parser.add_argument("--dashboard-port", type=_int_in(1024, 65535), default=8265,
                        help="port of the dashboard with --dashboard (default 8265)")
    args = parser.parse_args(argv)

    args.temp_dir = os.path.abspath(args.temp_dir or f"/tmp/rs-fake-{os.getpid()}")
    if len(args.temp_dir) > MAX_TEMP_DIR_LEN:
        parser.error(f"--temp-dir: {args.temp_dir!r} is {len(args.temp_dir)} characters long; give at most "
                     f"{MAX_TEMP_DIR_LEN} (Ray's socket paths under it are limited to 107 bytes), e.g. /tmp/rs-fake")
    if os.path.exists(args.temp_dir) and (not os.path.isdir(args.temp_dir) or os.listdir(args.temp_dir)):
        parser.error(f"--temp-dir: {args.temp_dir!r} already exists and is not an empty directory; give a new "
                     "path (it is deleted at shutdown)")
    if args.address_file:
        args.address_file = os.path.abspath(args.address_file)
        parent = os.path.dirname(args.address_file)
        if not os.path.isdir(parent):
            parser.error(f"--address-file: directory {parent!r} does not exist")
        if os.path.isdir(args.address_file):
            parser.error(f"--address-file: {args.address_file!r} is a directory; give a file path")
    return args


class StopRequest:
    """SIGINT and SIGTERM only set a flag: the cluster is never left half started or half stopped."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signal_name = ""

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        if not self.event.is_set():
            self.signal_name = signal.Signals(signum).name
        self.event.set()

    def wait(self) -> None:
        while not self.event.wait(1.0):
            pass


def node_labels(index: int, args: argparse.Namespace) -> dict[str, str]:
    labels = {"node-name": f"w{index}", "rack": f"r{index % args.racks}"}
    if args.gpus_per_node:
        # What Ray itself puts on a real GPU node; campaigns select on it (placement.node_labels).
        labels.update({"gpu-type": args.gpu_type, "ray.io/accelerator-type": args.gpu_type})
    return labels


def start_cluster(args: argparse.Namespace, stop: StopRequest):
    """Head (no GPU) and the GPU nodes; returns the Cluster, possibly partly started if a stop came first."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=False)
    head_args = dict(num_cpus=args.head_cpus, num_gpus=0, temp_dir=args.temp_dir,
                     object_store_memory=args.object_store_mb << 20, labels={"node-name": "head"},
                     include_dashboard=args.dashboard,
                     # a free port rather than Ray's fixed 52365, which another Ray on this machine may hold
                     dashboard_agent_listen_port=0)
    if args.dashboard:
        head_args.update(dashboard_host="127.0.0.1", dashboard_port=args.dashboard_port)
    cluster.add_node(**head_args)
    # Each Ray node object installs its own SIGTERM handler (stop that node, exit 1): take SIGTERM back.
    stop.install()
    for i in range(args.nodes):
        if stop.event.is_set():
            return cluster
        cluster.add_node(num_cpus=args.cpus_per_node, num_gpus=args.gpus_per_node,
                         object_store_memory=args.object_store_mb << 20, labels=node_labels(i, args),
                         # Nodes on one machine share a session dir; each needs its own runtime_env dir,
                         # or working_dir runtime envs fail on some of them.
                         runtime_env_dir_name=f"runtime_resources_w{i}")
        stop.install()
    cluster.wait_for_nodes(timeout=60)
    return cluster


def describe(cluster, args: argparse.Namespace) -> str:
    gpus = f"{args.gpus_per_node} simulated GPUs" if args.gpus_per_node else "no GPU"
    lines = [f"Fake Ray cluster up: a head node (no GPU, {args.head_cpus} CPUs) and {args.nodes} node(s) with "
             f"{gpus} and {args.cpus_per_node} CPUs each.",
             "  nodes: " + ", ".join(f"w{i} (rack r{i % args.racks})" for i in range(args.nodes)),
             f"  address: {cluster.address}"]
    if args.gpus_per_node:
        lines.append(f"  labels: node-name, rack, gpu-type={args.gpu_type}, ray.io/accelerator-type={args.gpu_type}")
    if args.dashboard:
        lines.append(f"  dashboard: http://{cluster.webui_url}")
    if args.address_file:
        lines.append(f"  address file: {args.address_file}")
    auth = os.environ.get("RAY_AUTH_MODE", "disabled")
    lines += ["Use it from another shell (the client must also stay on loopback):",
              f"  export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_AUTH_MODE={auth} VLLM_HOST_IP=127.0.0.1",
              f"  raysweep run CAMPAIGN --address {cluster.address}",
              "Ctrl-C or SIGTERM stops the cluster."]
    return "\n".join(lines)


def shutdown(cluster, args: argparse.Namespace, address: str | None) -> None:
    if args.address_file and address:
        try:
            with open(args.address_file) as f:
                ours = f.read() == address
            if ours:
                os.unlink(args.address_file)
        except FileNotFoundError:
            pass
    if cluster is not None:
        cluster.shutdown()
    shutil.rmtree(args.temp_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for key, value in RAY_ENV.items():
        if key == "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER":
            os.environ[key] = value  # must be 0 before Ray starts, or Ray binds to the host's external address
        else:
            os.environ.setdefault(key, value)
    # Token auth would make every client need the token; this cluster listens on loopback only.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")

    stop = StopRequest()
    stop.install()
    import ray._common.utils as ray_utils

    # Cluster records its address in <system temp>/ray/ray_current_cluster and needs that directory.
    os.makedirs(ray_utils.get_default_ray_temp_dir(), exist_ok=True)
    os.makedirs(args.temp_dir, exist_ok=True)
    cluster = None
    address = None
    started = time.monotonic()
    try:
        cluster = start_cluster(args, stop)
        if stop.event.is_set():
            print(f"{stop.signal_name} during start-up: stopping.", file=sys.stderr, flush=True)
            return 0
        address = cluster.address
        # Ray records the address in <system temp>/ray/ray_current_cluster, which every Ray on this machine
        # rewrites; the job supervisor resolves a job's RAY_ADDRESS from <temp dir>/ray_current_cluster, and
        # without that file it joins any Ray it finds on the machine. Recorded here, jobs stay on this cluster.
        write_text_atomic(os.path.join(args.temp_dir, "ray_current_cluster"), address)
        if args.address_file:
            write_text_atomic(args.address_file, address)
        print(describe(cluster, args), flush=True)
        print(f"(started in {time.monotonic() - started:.1f} s)", flush=True)
        stop.wait()
        print(f"{stop.signal_name}: stopping the cluster...", file=sys.stderr, flush=True)
        return 0
    except Exception as exc:  # start-up failed: say why, and still stop whatever did start
        print(f"error: the fake cluster could not start: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        shutdown(cluster, args, address)


if __name__ == "__main__":
    sys.exit(main())
