"""A stand-in for `vllm bench serve`: sends real requests to the server and writes a result JSON with
vLLM's field names, so the command backend can be tested with fast processes."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", default="standin")
    ap.add_argument("--num-prompts", type=int, default=10)
    ap.add_argument("--max-concurrency", type=int, default=4)
    ap.add_argument("--random-input-len", type=int, default=16)
    ap.add_argument("--random-output-len", type=int, default=8)
    ap.add_argument("--save-result", action="store_true")
    ap.add_argument("--result-dir", default=".")
    ap.add_argument("--result-filename", default="result.json")
    ap.add_argument("--percentile-metrics", default="ttft,tpot,itl")
    ap.add_argument("--metric-percentiles", default="99")
    ap.add_argument("--fail", action="store_true")
    ap.add_argument("--fail-while", default=None, help="fail while this file exists")
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--hold-while", default=None, help="from call --hold-from on (counted in --log-file), wait "
                                                       "while this file exists before measuring")
    ap.add_argument("--hold-from", type=int, default=1)
    ap.add_argument("--report-throughput", default=None,
                    help="report these request throughputs (and the token throughputs they give) instead of the "
                         "measured ones, comma-separated: the k-th call of a point (counted in --count-file) "
                         "reports the k-th value, cyclically; a point's runs then do not hang on the machine's "
                         "load (one value: they agree exactly)")
    ap.add_argument("--count-file", default=None, help="where --report-throughput counts the calls of each point")
    ap.add_argument("--log-file", default=None, help="append the argv of each call here")
    ap.add_argument("--env-file", default=None, help="append the CUDA_VISIBLE_DEVICES each call saw here")
    ap.add_argument("--journal", default=None, help="append {call, event: start|done, t, argv} of each call here; "
                                                    "the result carries its call id as standin_call")
    args, _unknown = ap.parse_known_args()
    call = uuid.uuid4().hex
    _journal(args.journal, call, "start", argv=sys.argv[1:])
    if args.log_file:
        with open(args.log_file, "a") as f:
            f.write(json.dumps(sys.argv[1:]) + "\n")
    if args.env_file:
        with open(args.env_file, "a") as f:
            f.write(json.dumps({"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}) + "\n")
    if args.fail or (args.fail_while and os.path.exists(args.fail_while)):
        print("standin bench: failing on purpose")
        sys.exit(1)
    time.sleep(args.sleep)
    if args.hold_while and args.log_file:
        with open(args.log_file) as f:
            number = sum(1 for _ in f)
        while number >= args.hold_from and os.path.exists(args.hold_while):
            time.sleep(0.1)

    def one(i: int) -> tuple[float, float, bool]:
        t0 = time.time()
        req = urllib.request.Request(args.base_url + "/v1/completions", method="POST",
                                     data=json.dumps({"model": args.model, "prompt": "x",
                                                      "max_tokens": args.random_output_len}).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                r.read()
            return t0, time.time(), True
        except OSError:
            return t0, time.time(), False

    t0 = time.time()
    with ThreadPoolExecutor(args.max_concurrency) as ex:
        samples = list(ex.map(one, range(args.num_prompts)))
    duration = time.time() - t0
    ok = [s for s in samples if s[2]]
    lat = [(e - s) * 1000 for s, e, _ in ok] or [0.0]
    result = {"date": time.strftime("%Y%m%d-%H%M%S"), "backend": "openai", "model_id": args.model,
              "num_prompts": args.num_prompts, "request_rate": "inf", "burstiness": 1.0,
              "max_concurrency": args.max_concurrency, "duration": duration, "completed": len(ok),
              "failed": len(samples) - len(ok), "total_input_tokens": 10 * len(ok),
              "total_output_tokens": args.random_output_len * len(ok),
              "request_throughput": len(ok) / duration,
              "output_throughput": args.random_output_len * len(ok) / duration,
              "total_token_throughput": (10 + args.random_output_len) * len(ok) / duration,
              "latencies": [x / 1000 for x in lat]}
    if args.report_throughput is not None:
        rate = _reported(args)
        result.update(request_throughput=rate, output_throughput=args.random_output_len * rate,
                      total_token_throughput=(10 + args.random_output_len) * rate)
    for m in args.percentile_metrics.split(","):
        result[f"mean_{m}_ms"] = statistics.mean(lat)
        result[f"median_{m}_ms"] = statistics.median(lat)
        result[f"std_{m}_ms"] = statistics.pstdev(lat)
        for p in args.metric_percentiles.split(","):
            q = sorted(lat)[min(len(lat) - 1, int(float(p) / 100 * len(lat)))]
            result[f"p{p}_{m}_ms"] = q
    if args.save_result:
        os.makedirs(args.result_dir, exist_ok=True)
        with open(os.path.join(args.result_dir, args.result_filename), "w") as f:
            json.dump({**result, "standin_call": call}, f)
    _journal(args.journal, call, "done", completed=len(ok))
    print(f"standin bench: {len(ok)} ok, {len(samples) - len(ok)} failed in {duration:.2f} s")


def _reported(args: argparse.Namespace) -> float:
    """The request throughput this call reports (see --report-throughput)."""
    values = [float(v) for v in args.report_throughput.split(",")]
    if len(values) == 1:
        return values[0]
    key = f"{args.random_input_len} {args.max_concurrency} {args.num_prompts}"  # the point, as its options say
    with open(args.count_file, "a+") as f:
        f.seek(0)
        k = sum(1 for line in f if line.strip() == key)
        f.write(key + "\n")
    return values[k % len(values)]


def _journal(path: str | None, call: str, event: str, **fields: object) -> None:
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"call": call, "event": event, "t": time.time(), **fields}) + "\n")


if __name__ == "__main__":
    main()
