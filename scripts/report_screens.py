"""The first screens of three kinds of report, for the docs, each page checked in headless Chromium before
it is taken (`tests/browser.py`, `check_page`: no script or console error, every figure decoded, every in-page
link landing, no note said twice):

* `report-endpoint.png` (docs/endpoints.md): `raysweep profile` against an endpoint it did not start, the real
  `vllm serve` (CPU build, the demo's tiny dummy-weight model, on core 0 as `make demo` runs it); with
  `--standin`, the tests' stand-in streaming server instead;
* `report-multinode.png` (docs/multinode.md): a stand-in campaign (the tests' stand-in server and bench) on
  8 simulated GPUs on two simulated Ray nodes, configurations of 4 GPUs on one node and of 8 across both;
* `report-failed.png` (docs/report.md): a stand-in campaign whose every point failed (its servers exit
  before they are ready: an out-of-memory error, an argument error).

The campaigns run on a local Ray cluster of their own on 127.0.0.1 (a head without GPUs and two nodes of 4
simulated GPUs), through the `raysweep` command line (`--address`), and everything they start is stopped at
the end. Each screen is a 1280 x 900 window saved as a 256-colour PNG. The caption under each image (between
`<!-- report-screen:NAME:begin -->` and `<!-- report-screen:NAME:end -->` in its docs page) is written again
with the campaign and the time its last point ended.

    .venv/bin/python scripts/report_screens.py [--out docs/img] [--docs docs] [--standin] [--keep DIR]
        [--only endpoint|multinode|failed]...
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "scripts"))

STANDIN = ROOT / "tests" / "standin"
PY = sys.executable
SIZE = "1280,900"


@dataclass
class Shot:
    """One report's screen: its PNG, the docs page that shows it, the image's alt text and what the caption
    says produced it (before the campaign's name and date)."""

    name: str
    png: str
    page: str
    alt: str
    what: str


def raysweep(*args: str, ok: tuple[int, ...] = (0,)) -> None:
    """`raysweep ARGS` in a subprocess (this checkout's); its output goes to ours.

    :raises RuntimeError: it exited with a code not in `ok`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(":")}
    done = subprocess.run([PY, "-m", "raysweep", *args], env=env)
    if done.returncode not in ok:
        raise RuntimeError(f"raysweep {' '.join(args)} exited {done.returncode}")


def start_server(argv: list[str], url: str, log: Path, timeout_s: float, env: dict[str, str] | None = None
                 ) -> subprocess.Popen[bytes]:
    """A server in its own process group, once it lists its models at `url`/v1/models.

    :raises RuntimeError: it exited or did not answer within `timeout_s` (it is stopped then)."""
    from raysweep.procs import wait_for

    proc = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, **(env or {})})

    def up() -> bool:
        if proc.poll() is not None:
            return True
        try:
            return bool(urllib.request.urlopen(f"{url}/v1/models", timeout=1).status == 200)
        except OSError:
            return False

    if not wait_for(up, timeout_s, 0.5) or proc.poll() is not None:
        stop_server(proc)
        raise RuntimeError(f"{argv[0]} did not start at {url}:\n{log.read_text()[-3000:]}")
    return proc


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """Stop a server started by `start_server`, with its whole process group (SIGTERM, then SIGKILL)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(30)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def endpoint_campaign(work: Path, address: str, standin: bool) -> Path:
    """`raysweep profile` of a server started here (three loads, three runs each); its output dir."""
    from raysweep.procs import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    out = work / "endpoint"
    if standin:
        argv = [PY, str(STANDIN / "stream_server.py"), "--model", "m", "--port", str(port), "--ttft-delay", "0.05",
                "--itl-delay", "0.01", "--slots", "8"]
        model, env, name = "m", None, "endpoint-standin"
    else:
        from raysweep.lab.tiny_model import make_tiny_model

        model = str(make_tiny_model(work / "tiny-llama"))
        vllm = shutil.which("vllm") or str(Path(PY).parent / "vllm")
        # on core 0, as `make demo` runs it: the clients' actors keep the other core(s) to themselves
        pin = ["taskset", "-c", "0"] if shutil.which("taskset") and (os.cpu_count() or 1) > 1 else []
        argv = [*pin, vllm, "serve", model, "--load-format", "dummy", "--max-model-len", "1024", "--dtype", "bfloat16",
                "--gpu-memory-utilization", "0.2", "--enforce-eager", "--host", "127.0.0.1", "--port", str(port)]
        env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_SERVER_DEV_MODE": "1", "VLLM_HOST_IP": "127.0.0.1"}
        name = "endpoint-vllm-cpu"
    server = start_server(argv, url, work / "endpoint-server.log", 600, env)
    try:  # runs of 9 s, as the demo's: shorter ones on a busy machine are mostly client-limited
        raysweep("profile", url, "--name", name, "--grid", "max_concurrency=1,4,16", "--runs", "3",
                 "--bench-cmd", f"vllm bench serve --model {model} --dataset-name random --random-input-len 64 "
                                "--random-output-len 16 --num-prompts 64 --temperature 0 --max-concurrency 16 "
                                "--duration 9",
                 *([] if standin else ["--reset-url", f"{url}/reset_prefix_cache"]),
                 "--output-dir", str(out), "--address", address)
    finally:
        stop_server(server)
    return out


def standin_file(work: Path, name: str, serve_params: list[dict[str, Any]], bench_grid: dict[str, list[Any]],
                 **fields: Any) -> Path:
    """A campaign file of the tests' stand-in server and bench (tests/standin), as tests/helpers.py writes."""
    data: dict[str, Any] = {
        "name": name, "output_dir": str(work / name), "runs": 3,
        "serve": {"cmd": f"{PY} {STANDIN / 'server.py'} --model m --request-delay 0.02", "ready_timeout_s": 60,
                  "params": serve_params},
        "bench": {"backend": "command", "cmd": f"{PY} {STANDIN / 'bench.py'} --model m --num-prompts 24",
                  "params": {"grid": bench_grid}},
        **fields,
    }
    f = work / f"{name}.yaml"
    f.write_text(yaml.safe_dump(data, sort_keys=False))
    return f


def multinode_campaign(work: Path, address: str, standin: bool = True) -> Path:
    """Three configurations on the two nodes of 4 simulated GPUs: tp=4 on one node, tp=4 x pp=2 and
    tp=2 x dp=4 across both."""
    f = standin_file(work, "multinode-standin", [{"tensor_parallel_size": 4},
                                                 {"tensor_parallel_size": 4, "pipeline_parallel_size": 2},
                                                 {"tensor_parallel_size": 2, "data_parallel_size": 4}],
                     {"max_concurrency": [1, 4, 16]})
    raysweep("run", str(f), "--address", address)
    return work / "multinode-standin"


def failed_campaign(work: Path, address: str, standin: bool = True) -> Path:
    """Two configurations whose servers exit before they are ready, two loads each: every point fails."""
    f = standin_file(work, "failed-standin", [
        {"tensor_parallel_size": 4,
         "fail_with": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"},
        {"tensor_parallel_size": 2, "fail_usage": "unrecognized arguments: --max-num-seqz 16"}],
        {"max_concurrency": [1, 16]}, max_attempts=2)
    raysweep("run", str(f), "--address", address, ok=(0, 1))
    return work / "failed-standin"


CAMPAIGNS = {"endpoint": endpoint_campaign, "multinode": multinode_campaign, "failed": failed_campaign}


def ended(output_dir: Path) -> tuple[str, str]:
    """The campaign's name and when its last point ended (UTC), from its ledger."""
    from raysweep.ledger import Ledger

    ledger = Ledger.open_existing(output_dir)
    try:
        name = ledger.meta("name") or output_dir.name
        last = max((p.ended_at or 0.0 for p in ledger.points()), default=0.0) or float(ledger.meta("created_at") or 0)
    finally:
        ledger.close()
    return name, datetime.datetime.fromtimestamp(last, tz=datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def take(report: Path, png: Path, check_dir: Path) -> None:
    """Check `report` in Chromium (`check_page`), then its first screen as a 256-colour PNG at `png`."""
    from browser import check_page
    from PIL import Image
    from readme_sample import screenshot

    check_page(report, check_dir)
    raw = check_dir / f"{png.stem}-raw.png"
    screenshot(report, raw, size=SIZE)
    tmp = png.with_name(f".{png.name}.tmp.png")
    with Image.open(raw) as image:
        image.convert("RGB").quantize(256, dither=Image.Dither.NONE).save(tmp, optimize=True)
    os.replace(tmp, png)


def caption_block(shot: Shot, output_dir: Path) -> str:
    name, when = ended(output_dir)
    return (f"![{shot.alt}](img/{shot.png})\n\n"
            f"*{shot.what}: campaign `{name}`, last point ended {when}; taken by `scripts/report_screens.py`.*")


def replace_caption(page: Path, shot: Shot, new: str) -> None:
    """Write `new` between the page's markers for `shot` (whole file, temp then replace).

    :raises ValueError: the markers are not there exactly once, in order."""
    begin, end = f"<!-- report-screen:{shot.name}:begin -->", f"<!-- report-screen:{shot.name}:end -->"
    text = page.read_text()
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise ValueError(f"{page} must hold {begin} and then {end}, once each")
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    tmp = page.with_name(f".{page.name}.tmp")
    tmp.write_text(f"{head}{begin}\n{new}\n{end}{tail}")
    os.replace(tmp, page)


def shots(standin: bool) -> list[Shot]:
    server = ("the tests' stand-in streaming server (tests/standin/stream_server.py)" if standin else
              "the real `vllm serve` (CPU build, tiny dummy-weight model, on core 0 of 2)")
    return [
        Shot("endpoint", "report-endpoint.png", "endpoints.md", "The first screen of an endpoint sweep's report",
             f"`raysweep profile` of {server}, max_concurrency 1, 4 and 16, 3 runs of 9 s each"),
        Shot("multinode", "report-multinode.png", "multinode.md",
             "The first screen of a multi-node stand-in campaign's report",
             "The stand-in server and bench on 8 simulated GPUs on two simulated Ray nodes (tp=4 on one node, "
             "tp=4 x pp=2 and tp=2 x dp=4 across both), max_concurrency 1, 4 and 16, 3 runs each; its throughputs "
             "are the stand-in's, divided by each configuration's GPUs"),
        Shot("failed", "report-failed.png", "report.md", "The first screen of the report of a campaign whose "
             "every point failed", "Two stand-in server configurations that exit before they are ready (an "
             "out-of-memory error, an argument error), 2 loads each, every point failed"),
    ]


def local_cluster(temp_dir: str) -> Any:
    """A Ray cluster on this machine: a head without GPUs, two nodes of 4 simulated GPUs."""
    import ray
    from ray.cluster_utils import Cluster

    os.makedirs("/tmp/ray", exist_ok=True)  # Cluster writes its address file there whatever temp_dir says
    cluster = Cluster(initialize_head=True, head_node_args=dict(num_cpus=2, num_gpus=0, include_dashboard=False,
                                                                temp_dir=temp_dir))
    for i in range(2):
        cluster.add_node(num_cpus=2, num_gpus=4, labels={"node-name": f"gpu{i}"},
                         runtime_env_dir_name=f"runtime_resources_gpu{i}")
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    return cluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "img"), help="where the PNGs go")
    parser.add_argument("--docs", default=str(ROOT / "docs"), help="the docs pages whose captions are rewritten")
    parser.add_argument("--standin", action="store_true", help="profile the stand-in server, not the real vLLM")
    parser.add_argument("--keep", metavar="DIR", help="keep the campaigns here (default: a temp dir, removed)")
    parser.add_argument("--only", action="append", choices=list(CAMPAIGNS), help="only this one (repeatable)")
    args = parser.parse_args(argv)
    import ray

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="rs-shots-"))
    work.mkdir(parents=True, exist_ok=True)
    temp_dir = f"/tmp/rs-sh{os.getpid()}"
    cluster = local_cluster(temp_dir)
    try:
        made = {name: CAMPAIGNS[name](work, cluster.address, args.standin) for name in args.only or CAMPAIGNS}
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
    checks = work / "checks"
    checks.mkdir(exist_ok=True)
    for shot in (s for s in shots(args.standin) if s.name in made):
        out = made[shot.name]
        raysweep("report", str(out))
        png = Path(args.out) / shot.png
        take(out / "report.html", png, checks)
        replace_caption(Path(args.docs) / shot.page, shot, caption_block(shot, out))
        print(f"{png}: {png.stat().st_size // 1024} KB, the first screen of {out / 'report.html'}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
