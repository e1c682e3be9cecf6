"""A stand-in for `vllm serve` in tests that need many fast server starts: the OpenAI-ish endpoints
raysweep touches (/health, /v1/models, /v1/completions, the cache resets, /metrics), on loopback."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _nccl_lines(net: str, rank: int, delay: float) -> None:
    """What NCCL 2.2x prints for a 2-node pipeline: the version, the network chosen, the devices, one local
    channel and the cross-node channels."""
    if os.environ.get("NCCL_DEBUG", "").upper() != "INFO":
        return
    time.sleep(delay)
    host, pid = f"node{rank}", os.getpid()
    head = f"{host}:{pid}:{pid + 7} [0] NCCL INFO"
    lines = [f"{head} NCCL version 2.21.5+cuda12.4"]
    if net == "intra":  # a data-parallel replica whole on this node: its NCCL links stay inside it
        lines += [f"{head} NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.{rank + 1}<0>", f"{head} Using network IB",
                  f"{head} Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
                  f"{head} Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM/read",
                  f"{head} Connected all rings, use ring PXN 0 GDR 1"]
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()
        return
    via = {"gdr": "NET/IB/0/GDRDMA", "ib": "NET/IB/0", "socket": "NET/Socket/0"}[net]
    if net == "socket":
        lines += [f"{head} NET/IB : No device found.", f"{head} NET/Socket : Using [0]eth0:10.0.0.{rank + 1}<0>",
                  f"{head} Using network Socket"]
    else:
        lines += [f"{head} NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.0.0.{rank + 1}<0>",
                  f"{head} Using network IB"]
    lines += [f"{head} Channel 00/0 : {2 * rank}[0] -> {2 * rank + 1}[1] via P2P/CUMEM/read",
              f"{head} Channel 00/0 : {2 * rank + 1}[1] -> {2 * (1 - rank)}[0] [send] via {via}",
              f"{head} Channel 01/0 : {2 * (1 - rank) + 1}[1] -> {2 * rank}[0] [receive] via {via}",
              f"{head} Connected all rings, use ring PXN 0 GDR {1 if net == 'gdr' else 0}"]
    text = "\n".join(lines) + "\n"
    target = os.environ.get("NCCL_DEBUG_FILE")
    if target:
        with open(target.replace("%h", host).replace("%p", str(pid)), "a") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("--model", dest="model_opt")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--startup-delay", type=float, default=0.0)
    ap.add_argument("--request-delay", type=float, default=0.0, help="extra seconds each /v1/completions takes")
    ap.add_argument("--spawn-child", action="store_true", help="fork a long sleep, like vLLM's engine process")
    ap.add_argument("--die-after", type=int, default=0, help="exit(3) after this many completions")
    ap.add_argument("--die-once-file", default=None, help="with --die-after: die only if this file is absent "
                                                          "(and create it), so a restarted server lives")
    ap.add_argument("--fail-start", action="store_true", help="exit(1) before listening")
    ap.add_argument("--fail-usage", default=None, help="exit(2) at once with this argparse error message")
    ap.add_argument("--fail-with", default=None, help="exit(1) before listening, with this exception line in the log "
                    "above a traceback that ends on vLLM's 'See root cause above'")
    ap.add_argument("--reset-refuses", action="store_true", help="answer {success: false} to cache resets")
    ap.add_argument("--pid-file", default=None, help="append our pid (and the child's) to this file")
    ap.add_argument("--headless", action="store_true", help="a multi-node rank > 0: no HTTP, just run")
    ap.add_argument("--node-rank", type=int, default=0)
    ap.add_argument("--headless-die-after", type=float, default=0.0,
                    help="a headless rank exits(4) after this many seconds (once, with --die-once-file)")
    ap.add_argument("--data-parallel-start-rank", type=int, default=0)
    ap.add_argument("--nccl-net", choices=["gdr", "ib", "socket", "intra"], default=None,
                    help="print the NCCL_DEBUG=INFO lines of a rank whose cross-node links use this transport "
                         "(to NCCL_DEBUG_FILE when that is set, else to stdout), only when NCCL_DEBUG=INFO")
    ap.add_argument("--nccl-delay", type=float, default=0.0, help="seconds after ready before the NCCL lines")
    args, _unknown = ap.parse_known_args()
    model = args.model_opt or args.model or "standin"
    if args.pid_file:
        with open(args.pid_file, "a") as f:
            f.write(f"{os.getpid()}\n")
    if args.spawn_child:
        child = subprocess.Popen(["sleep", "300"])
        if args.pid_file:
            with open(args.pid_file, "a") as f:
                f.write(f"{child.pid}\n")
    # at INFO, as vLLM logs its arguments: a line that quotes them is not what went wrong
    print(f"INFO {time.strftime('%m-%d %H:%M:%S')} [server.py:1] standin: starting {model} with argv {sys.argv[1:]} "
          f"env CVD={os.environ.get('CUDA_VISIBLE_DEVICES')} HF_TOKEN={os.environ.get('HF_TOKEN')}", flush=True)
    if args.fail_usage:
        ap.error(args.fail_usage)  # argparse's usage line and `server.py: error: ...`, exit 2
    if args.fail_with:
        print(f"(EngineCore_DP0 pid={os.getpid()}) ERROR 11-28 14:00:06 [core.py:700] {args.fail_with}", flush=True)
        print("Traceback (most recent call last):\n  File \"main.py\", line 1, in main\nRuntimeError: Engine core "
              "initialization failed. See root cause above. Failed core proc(s): {}", flush=True)
        sys.exit(1)
    if args.fail_start:
        print("standin: failing on purpose", flush=True)
        sys.exit(1)
    time.sleep(args.startup_delay)
    if args.nccl_net:
        rank = args.node_rank or (1 if args.data_parallel_start_rank else 0)
        threading.Thread(target=_nccl_lines, args=(args.nccl_net, rank, args.nccl_delay),
                         daemon=True).start()
    if args.headless:
        print(f"standin: headless rank {args.node_rank}", flush=True)
        if args.headless_die_after and not (args.die_once_file and os.path.exists(args.die_once_file)):
            time.sleep(args.headless_die_after)
            if args.die_once_file:
                open(args.die_once_file, "w").close()
            print("standin: headless rank dying on purpose", flush=True)
            sys.exit(4)
        while True:
            time.sleep(3600)
    state = {"completions": 0, "resets": 0}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def _send(self, code: int, body: object) -> None:
            data = json.dumps(body).encode() if not isinstance(body, str) else body.encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, "")
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": model, "object": "model"}]})
            elif self.path == "/metrics":
                self._send(200, f'vllm:num_requests_running{{engine="0",model_name="{model}"}} 0\n')
            else:
                self._send(404, {"detail": "not found"})

        def do_POST(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(n) or b"{}")
            if self.path.startswith("/reset_prefix_cache"):
                state["resets"] += 1
                self._send(200, {"success": not args.reset_refuses})
            elif self.path in ("/reset_mm_cache", "/reset_encoder_cache"):
                self._send(200, "")
            elif self.path == "/v1/completions":
                with lock:
                    state["completions"] += 1
                    count = state["completions"]
                if args.die_after and count > args.die_after:
                    if not args.die_once_file or not os.path.exists(args.die_once_file):
                        if args.die_once_file:
                            open(args.die_once_file, "w").close()
                        print("standin: dying on purpose", flush=True)
                        os._exit(3)
                time.sleep(0.002 + args.request_delay)
                out = int(body.get("max_tokens") or 16)
                self._send(200, {"choices": [{"text": "x" * out}],
                                 "usage": {"prompt_tokens": 10, "completion_tokens": out}})
            else:
                self._send(404, {"detail": "not found"})

    srv = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"standin: listening on {args.host}:{args.port}", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
