"""Helpers shared by the tests: campaign files around the stand-in server and bench commands."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

STANDIN = Path(__file__).parent / "standin"
PY = sys.executable


def standin_campaign(path: Path, *, name: str = "t", server_args: str = "", bench_args: str = "",
                     serve_params: Any = None, bench_params: Any = None, **fields: Any) -> Path:
    """Write a campaign file that runs the stand-in server and bench; returns its path."""
    data: dict[str, Any] = {
        "name": name,
        "output_dir": str(path / "out"),
        "runs": 1,
        "serve": {"cmd": f"{PY} {STANDIN / 'server.py'} --model m {server_args}".strip(), "ready_timeout_s": 30,
                  "params": serve_params if serve_params is not None else {"grid": {"max_num_seqs": [8]}}},
        "bench": {"backend": "command",
                  "cmd": f"{PY} {STANDIN / 'bench.py'} --model m --num-prompts 10 {bench_args}".strip(),
                  "params": bench_params if bench_params is not None else {"grid": {"random_input_len": [16, 32]}}},
    }
    for key, value in fields.items():
        if key in ("serve", "bench"):
            data[key].update(value)
        else:
            data[key] = value
    f = path / "campaign.yaml"
    f.write_text(yaml.safe_dump(data))
    return f


def run_file(campaign_file: Path, **kw: Any) -> tuple[Any, Path]:
    """Run a campaign file on the connected Ray cluster; returns the run summary and the output dir."""
    from raysweep.campaign import load_campaign
    from raysweep.driver import run_campaign

    spec = load_campaign(campaign_file)
    out = Path(spec.campaign.output_dir or "")
    return run_campaign(spec, out, **kw), out


def native_campaign(path: Path, *, name: str = "n", server_args: str = "", bench_args: str = "",
                    bench_params: Any = None, **fields: Any) -> Path:
    """A campaign file with the native client against the streaming stand-in server; returns its path."""
    f = standin_campaign(path, name=name, bench_params=bench_params, **fields)
    data = yaml.safe_load(f.read_text())
    data["serve"]["cmd"] = f"{PY} {STANDIN / 'stream_server.py'} --model m {server_args}".strip()
    data["bench"].update(backend="native", cmd=f"vllm bench serve --model m --num-prompts 10 {bench_args}".strip())
    for key, value in fields.get("bench", {}).items():
        data["bench"][key] = value
    f.write_text(yaml.safe_dump(data))
    return f
