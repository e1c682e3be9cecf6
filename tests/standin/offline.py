"""A stand-in for `vllm bench throughput` and `vllm bench latency` in tests: it sleeps as long as the engine
would take, prints what vLLM prints and writes the same --output-json. Run as `... serve MODEL --headless`
it is a follower node of a multi-node point: it waits until it is stopped. Its figures follow its parameters
(throughput grows with max_num_batched_tokens, shrinks with random_input_len), so tests can check that each
point's JSON landed on its own row."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)

from server import _nccl_lines  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("words", nargs="*")
    ap.add_argument("--model", default="m")
    ap.add_argument("--output-json", default=None)
    ap.add_argument("--num-prompts", type=int, default=100)
    ap.add_argument("--random-input-len", type=int, default=128)
    ap.add_argument("--random-output-len", type=int, default=32)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--num-iters", type=int, default=5)
    ap.add_argument("--sleep", type=float, default=0.2, help="seconds the run takes")
    ap.add_argument("--fail", action="store_true", help="exit(1) without a JSON")
    ap.add_argument("--no-json", action="store_true", help="exit(0) without writing the JSON")
    ap.add_argument("--die-once-file", default=None, help="exit(5) mid-run once (creating this file)")
    ap.add_argument("--pid-file", default=None, help="append our pid to this file")
    ap.add_argument("--nccl-net", choices=["gdr", "ib", "socket"], default=None)
    ap.add_argument("--node-rank", type=int, default=0)
    ap.add_argument("--nnodes", type=int, default=1)
    ap.add_argument("--env-file", default=None, help="append CUDA_VISIBLE_DEVICES and the argv here (JSON lines)")
    args, _unknown = ap.parse_known_args()
    kind = "latency" if "latency" in args.words else "serve" if "serve" in args.words else "throughput"
    if args.pid_file:
        with open(args.pid_file, "a") as f:
            f.write(f"{os.getpid()}\n")
    if args.env_file:
        with open(args.env_file, "a") as f:
            f.write(json.dumps({"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
                                "argv": sys.argv[1:], "rank": args.node_rank}) + "\n")
    print(f"standin offline {kind}: argv {sys.argv[1:]}", flush=True)
    if args.nccl_net:
        _nccl_lines(args.nccl_net, args.node_rank, 0.0)
    if "serve" in args.words:  # a follower node: `vllm serve MODEL --headless ...` until it is stopped
        if "--headless" not in sys.argv:
            print("standin offline: a follower must run headless", flush=True)
            sys.exit(2)
        while True:
            time.sleep(3600)
    if args.fail:
        print("standin offline: failing on purpose", flush=True)
        sys.exit(1)
    if args.die_once_file and not os.path.exists(args.die_once_file):
        time.sleep(args.sleep / 2)
        open(args.die_once_file, "w").close()
        print("standin offline: dying on purpose", flush=True)
        sys.exit(5)
    time.sleep(args.sleep)
    if kind == "throughput":
        rps = args.max_num_batched_tokens / (10.0 * args.random_input_len)
        elapsed = args.num_prompts / rps
        prompt = args.num_prompts * args.random_input_len
        output = args.num_prompts * args.random_output_len
        print(f"Throughput: {rps:.2f} requests/s, {(prompt + output) / elapsed:.2f} total tokens/s, "
              f"{output / elapsed:.2f} output tokens/s")
        print(f"Total num prompt tokens:  {prompt}")
        print(f"Total num output tokens:  {output}", flush=True)
        data = {"model_id": args.model, "elapsed_time": elapsed, "num_requests": args.num_prompts,
                "total_num_tokens": prompt + output, "requests_per_second": rps,
                "tokens_per_second": (prompt + output) / elapsed}
    else:
        base = args.random_input_len / 1000.0
        latencies = [base * (1 + i / 10) for i in range(args.num_iters)]
        print(f"Avg latency: {sum(latencies) / len(latencies)} seconds", flush=True)
        data = {"model_id": args.model, "avg_latency": sum(latencies) / len(latencies), "latencies": latencies,
                "percentiles": {"10": latencies[0], "50": latencies[len(latencies) // 2], "99": latencies[-1]}}
    if args.output_json and not args.no_json:
        with open(args.output_json, "w") as f:
            json.dump(data, f, indent=4)


if __name__ == "__main__":
    main()
