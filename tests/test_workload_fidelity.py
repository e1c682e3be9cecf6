"""The workload a user asked for, request for request, against vLLM 0.32's `vllm bench serve`
(vllm/benchmarks/serve.py, datasets/datasets.py): trace replay (ignore_eos, prompt lengths, order), the custom
set's chat template, multi-turn sessions that fail halfway, parameters that shadow measured fields or change
nothing. Pure tests first (the tiny model's tokenizer, no server)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import native_campaign, standin_campaign
from test_native import _run, stream_server  # noqa: F401 - the stand-in fixture and the point runner

from raysweep.bench.datasets import make_requests, payload
from raysweep.bench.options import parse_load_options
from raysweep.errors import CampaignError
from raysweep.record.directory import CampaignDir


def opts(*argv: str, model: str = "m"):
    return parse_load_options(["--model", model, *argv])


def _trace(path: Path, rows: list[dict], blank: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + blank)
    return path


@pytest.fixture(scope="module")
def tok(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model), local_files_only=True)


# -- trace replay --------------------------------------------------------------------------------------------

def test_trace_replay_sends_ignore_eos_as_vllm_forces_it(tmp_path):
    f = _trace(tmp_path / "t.jsonl", [{"timestamp": 0, "input_length": 8, "output_length": 5}])
    o = opts("--dataset-name", "timed_trace", "--dataset-path", str(f))
    assert o.ignore_eos
    body = json.loads(payload(make_requests(o)[0], o, "m"))
    assert body["ignore_eos"] is True and body["max_tokens"] == 5


def test_trace_replay_on_the_chat_api_is_refused_as_vllm_refuses_it(tmp_path):
    f = _trace(tmp_path / "t.jsonl", [{"timestamp": 0, "input_length": 8, "output_length": 5}])
    with pytest.raises(CampaignError, match="completions"):
        opts("--dataset-name", "timed_trace", "--dataset-path", str(f), "--backend", "openai-chat")


def test_trace_prompts_sent_as_text_have_the_traces_input_length(tmp_path, tiny_model, tok):
    """The server counts the text's tokens plus its special ones (BOS): that must be the trace's length."""
    rows = [{"timestamp": i, "input_length": n, "output_length": 3, "hash_ids": [7, 8, 9 + i]}
            for i, n in enumerate((512, 100, 37))]
    f = _trace(tmp_path / "t.jsonl", rows)
    o = opts("--dataset-name", "timed_trace", "--dataset-path", str(f), "--prompt-format", "text",
             "--tokenizer", str(tiny_model), "--timed-trace-chunk-hash-size", "32")
    reqs = make_requests(o)
    special = tok.num_special_tokens_to_add()
    for r, row in zip(reqs, rows):
        assert isinstance(r.prompt, str)
        assert len(tok.encode(r.prompt, add_special_tokens=False)) + special == row["input_length"]
    # equal leading hash ids still give an equal leading text (the shared prefix the cache serves)
    assert reqs[0].prompt[:40] == reqs[1].prompt[:40]


def test_an_unsorted_trace_is_replayed_in_time_order_and_says_so(tmp_path, caplog):
    from raysweep.bench.trace import trace_due, trace_entries, trace_report

    rows = [{"timestamp": t, "input_length": 4 + i, "output_length": 2} for i, t in enumerate((0, 300, 100, 200, 50))]
    f = _trace(tmp_path / "t.jsonl", rows)
    o = opts("--dataset-name", "timed_trace", "--dataset-path", str(f), "--trace-format", "mooncake")
    with caplog.at_level(logging.WARNING):
        due = trace_due(o)
    assert list(due) == sorted(due) and [e.input_len for e in trace_entries(o)] == [4, 8, 6, 7, 5]
    assert trace_report(o)["trace_lines_out_of_order"] == 3
    assert "out of time order" in caplog.text and "line 3" in caplog.text


def test_a_negative_trace_timestamp_is_refused_naming_the_line(tmp_path):
    rows = [{"timestamp": 0, "input_length": 4, "output_length": 2}, {"timestamp": -5, "input_length": 4,
                                                                     "output_length": 2}]
    f = _trace(tmp_path / "t.jsonl", rows)
    with pytest.raises(CampaignError, match=r"line 2.*timestamp.*negative"):
        make_requests(opts("--dataset-name", "timed_trace", "--dataset-path", str(f)))


def test_blank_trace_lines_are_reported_once(tmp_path, caplog):
    from raysweep.bench.trace import read_trace

    f = _trace(tmp_path / "t.jsonl", [{"timestamp": 0, "input_length": 4, "output_length": 2}], blank="\n  \n\n")
    o = opts("--dataset-name", "timed_trace", "--dataset-path", str(f))
    with caplog.at_level(logging.WARNING):
        read_trace(o)
        read_trace(o)
    assert caplog.text.count("blank line") == 1 and "3 blank line" in caplog.text


def test_a_trace_shorter_than_num_prompts_records_the_requests_sent(tmp_path):
    from raysweep.bench.native import planned_prompts

    f = _trace(tmp_path / "t.jsonl", [{"timestamp": i, "input_length": 4, "output_length": 2} for i in range(3)])
    o = opts("--dataset-name", "timed_trace", "--dataset-path", str(f), "--num-prompts", "10")
    assert len(make_requests(o)) == 3
    assert planned_prompts(o, 3) == {"num_prompts": 10, "num_prompts_sent": 3}
    assert planned_prompts(opts("--num-prompts", "10"), 10) == {"num_prompts": 10}


# -- the custom set's chat template --------------------------------------------------------------------------

def _custom(path: Path) -> Path:
    path.write_text("".join(json.dumps({"prompt": p, "output_tokens": 4}) + "\n"
                            for p in ("What is the capital of India?", "And of Iran?")))
    return path


def test_custom_prompts_are_wrapped_in_the_chat_template_as_vllm_does(tmp_path, tiny_model, tok):
    f = _custom(tmp_path / "c.jsonl")
    flags = ("--dataset-name", "custom", "--dataset-path", str(f), "--num-prompts", "2", "--disable-shuffle")
    reqs = make_requests(opts(*flags, model=str(tiny_model)))
    want = tok.apply_chat_template([{"role": "user", "content": "What is the capital of India?"}],
                                   add_generation_prompt=True, tokenize=False)
    assert reqs[0].prompt == want and want != "What is the capital of India?"
    raw = make_requests(opts(*flags, "--skip-chat-template", model=str(tiny_model)))
    assert [r.prompt for r in raw] == ["What is the capital of India?", "And of Iran?"]


def test_custom_prompts_without_a_local_tokenizer_are_refused_naming_the_way_out(tmp_path):
    f = _custom(tmp_path / "c.jsonl")
    with pytest.raises(CampaignError, match="--skip-chat-template"):
        make_requests(opts("--dataset-name", "custom", "--dataset-path", str(f), "--num-prompts", "2"))


# -- multi-turn sessions -------------------------------------------------------------------------------------

def test_a_leading_system_message_is_the_sessions_system_prompt_and_a_leading_answer_is_skipped():
    from raysweep.bench.sessions import system_history, turns_of

    conv = {"messages": [{"role": "assistant", "content": "a follow-up's answer"},
                         {"role": "system", "content": "be brief"},
                         {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                         {"role": "user", "content": "bye"}]}
    system, turns = turns_of(conv)
    assert system == "be brief" and turns == [("hi", "hello"), ("bye", None)]
    assert system_history(system) == [{"role": "system", "content": "be brief"}] and system_history(None) == []
    sharegpt = {"conversations": [{"from": "gpt", "value": "x"}, {"from": "human", "value": "q"}]}
    assert turns_of(sharegpt) == (None, [("q", None)])


def test_sessions_from_a_file_carry_their_system_prompt(tmp_path, tiny_model):
    from raysweep.bench.sessions import conversations
    from raysweep.bench.text import tokenizer_for

    f = tmp_path / "s.json"
    f.write_text(json.dumps([{"messages": [{"role": "system", "content": "be brief"},
                                           {"role": "user", "content": "hi"},
                                           {"role": "assistant", "content": "hello there"}]}]))
    o = opts("--backend", "openai-chat", "--dataset-name", "multi_turn", "--dataset-path", str(f),
             "--num-prompts", "1", model=str(tiny_model))
    conv = conversations(o, tokenizer_for(o))
    assert conv.systems == ["be brief"] and conv.messages == ["hi"]


@pytest.mark.timing
@pytest.mark.ray
@pytest.mark.parametrize("stream_server", [["--fail-every", "2"]], indirect=True)
def test_a_failed_turn_counts_the_rest_of_its_session_as_failed(gpu_cluster, stream_server, tiny_model):
    """One slot, two sessions of three turns; the server fails every second request: each session's second
    turn fails, and its third, never sent, counts as failed too ("session aborted")."""
    from raysweep.bench.native import NativeBench

    nb = NativeBench(cpus=0.5)
    try:
        out = _run(nb, ["--backend", "openai-chat", "--tokenizer", str(tiny_model), "--dataset-name", "multi_turn",
                        "--num-prompts", "2", "--multi-turn-turns", "3", "--random-input-len", "6",
                        "--random-output-len", "3", "--max-concurrency", "1", "--disable-shuffle"], stream_server)
    finally:
        nb.close()
    r, s = out["result"], out["samples"]
    assert r["completed"] == 2 and r["failed"] == 4 and r["sessions_failed"] == 2
    aborted = [(u, t) for u, t, e in zip(s["session"], s["turn"], s["error"]) if e and "session aborted" in e]
    assert sorted(aborted) == [(0, 2), (1, 2)]
    assert r["client_limited"] is False


# -- parameters that hide a measurement or change nothing ---------------------------------------------------

def _validate(f: Path):
    from raysweep.cli import main

    return CliRunner().invoke(main, ["validate", str(f)])


@pytest.mark.parametrize("key", ["duration", "completed", "mean_ttft_ms", "request_throughput",
                                 "server_num_preemptions"])
def test_a_parameter_named_as_a_measured_field_is_refused(tmp_path, key):
    f = native_campaign(tmp_path, bench_args="--max-concurrency 2", bench_params={"grid": {key: [1, 2]}})
    result = _validate(f)
    assert result.exit_code == 2 and f"bench.params[0].{key}" in result.output and "measured" in result.output
    assert not (tmp_path / "out").exists()
    if key == "duration":
        assert "duration_limit" in result.output


def test_the_time_limit_is_swept_as_duration_limit(tmp_path):
    f = native_campaign(tmp_path, bench_args="--max-concurrency 2", bench_params={"grid": {"duration_limit": [2, 4]}})
    result = _validate(f)
    assert result.exit_code == 0, result.output
    assert opts("--max-concurrency", "2", "--duration-limit", "3").duration == 3.0


def test_vllms_own_sweep_example_pairing_sharegpt_with_random_lengths_is_refused(tmp_path):
    """vLLM's example bench parameter file sweeps random_input_len; with a ShareGPT command every point sends
    the same requests. Both backends: the check reads `vllm bench serve` options."""
    share = tmp_path / "share.json"
    share.write_text(json.dumps([{"conversations": [{"from": "human", "value": "hello there friend"},
                                                     {"from": "gpt", "value": "hi to you as well"}]}]))
    params = [{"random_input_len": n, "random_output_len": 8} for n in (128, 256, 512)]
    f = standin_campaign(tmp_path, bench_params=params,
                         bench={"cmd": f"vllm bench serve --model m --dataset-name sharegpt --dataset-path {share}"})
    result = _validate(f)
    assert result.exit_code == 2 and "bench.params[0].random_input_len" in result.output
    assert "sharegpt" in result.output and "same requests" in result.output


def test_request_rate_with_a_self_timed_trace_is_refused(tmp_path):
    trace = _trace(tmp_path / "t.jsonl", [{"timestamp": 0, "input_length": 4, "output_length": 2}])
    f = native_campaign(tmp_path, bench_args=f"--dataset-name timed_trace --dataset-path {trace}",
                        bench_params={"grid": {"request_rate": [1, 2]}})
    result = _validate(f)
    assert result.exit_code == 2 and "bench.params[0].request_rate" in result.output
    assert "--no-self-timed" in result.output


# -- data files checked before anything starts ----------------------------------------------------------------

_GOOD_TRACE = [{"timestamp": 0, "input_length": 4, "output_length": 2}, {"timestamp": 10, "input_length": 5,
                                                                        "output_length": 2}]


@pytest.mark.parametrize("content, words", [
    (json.dumps(_GOOD_TRACE[0]) + "\n" + json.dumps(_GOOD_TRACE[1])[:20] + "\n", ["line 2", "not JSON"]),
    (json.dumps(_GOOD_TRACE[0]) + "\n" + '{"timestamp": "soon", "input_length": 4, "output_length": 2}\n',
     ["line 2", "timestamp"]),
    (json.dumps(_GOOD_TRACE[0]) + "\n" + '{"timestamp": 3, "output_length": 2}\n', ["line 2", "input_length"]),
    ("", ["no request"]),
    ("\n\n", ["no request"]),
])
def test_a_bad_trace_in_the_command_is_refused_by_validate_naming_file_line_and_field(tmp_path, content, words):
    trace = tmp_path / "t.jsonl"
    trace.write_text(content)
    f = native_campaign(tmp_path, bench_args=f"--dataset-name timed_trace --dataset-path {trace}", bench_params=[{}])
    result = _validate(f)
    assert result.exit_code == 2, result.output
    assert str(trace) in result.output and all(w in result.output for w in words), result.output
    assert "Traceback" not in result.output and not (tmp_path / "out").exists()


def test_a_bad_data_file_given_as_a_bench_parameter_is_refused_naming_the_parameter(tmp_path):
    good = _trace(tmp_path / "good.jsonl", _GOOD_TRACE)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(_GOOD_TRACE[0]) + "\n{\"timestamp\": 1, \"input_len\n")
    f = native_campaign(tmp_path, bench_args=f"--dataset-name timed_trace --dataset-path {good}",
                        bench_params=[{}, {"dataset_path": str(bad)}])
    result = _validate(f)
    assert result.exit_code == 2 and "bench.params[1]" in result.output and "line 2" in result.output


@pytest.mark.parametrize("kind", ["custom", "sharegpt", "multi_turn"])
def test_bad_custom_sharegpt_and_session_files_are_refused(tmp_path, tiny_model, kind):
    path = tmp_path / ("d.jsonl" if kind == "custom" else "d.json")
    tok = f"--tokenizer {tiny_model}"
    if kind == "custom":
        path.write_text('{"prompt": "a", "output_tokens": 3}\n{"prompt": "b", "output_tokens": "many"}\n')
        args, words = f"--dataset-name custom --custom-output-len -1 {tok}", ["line 2", "output_tokens"]
    elif kind == "sharegpt":
        path.write_text(json.dumps([{"conversations": [{"from": "human", "value": "q"}, {"from": "gpt"}]}]))
        args, words = f"--dataset-name sharegpt {tok}", ["entry 0", "value"]
    else:
        path.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{"messages": [\n')
        args, words = f"--backend openai-chat --dataset-name multi_turn {tok}", ["line 2", "not JSON"]
    f = native_campaign(tmp_path, bench_args=f"{args} --dataset-path {path}", bench_params=[{}])
    result = _validate(f)
    assert result.exit_code == 2, result.output
    assert str(path) in result.output and all(w in result.output for w in words), result.output


def test_a_file_with_no_usable_request_and_a_missing_tokenizer_are_refused(tmp_path):
    share = tmp_path / "s.json"
    share.write_text(json.dumps([{"conversations": [{"from": "human", "value": "only one turn"}]}]))
    f = standin_campaign(tmp_path, bench_params=[{}],
                         bench={"cmd": f"vllm bench serve --model m --dataset-name sharegpt --dataset-path {share}"})
    result = _validate(f)  # the command backend: vLLM's own reading, checked without a tokenizer
    assert result.exit_code == 2 and "no usable request" in result.output, result.output
    f = native_campaign(tmp_path, bench_args="--backend openai-chat --dataset-name multi_turn", bench_params=[{}])
    result = _validate(f)  # synthetic sessions need the model's tokenizer, and model "m" has none here
    assert result.exit_code == 2 and "--tokenizer" in result.output, result.output


def test_validate_notes_blank_and_out_of_order_trace_lines(tmp_path):
    trace = _trace(tmp_path / "t.jsonl", [_GOOD_TRACE[1], _GOOD_TRACE[0]], blank="\n")
    f = native_campaign(tmp_path, bench_args=f"--dataset-name timed_trace --dataset-path {trace}", bench_params=[{}])
    result = _validate(f)
    assert result.exit_code == 0, result.output
    assert "1 blank line(s)" in result.output and "1 line(s) out of time order" in result.output


@pytest.mark.ray
def test_a_point_whose_data_fails_at_run_time_is_not_tried_again(gpu_cluster, tmp_path):
    """A custom hook that is good when `run` checks it and bad when the point reads it: the point fails once,
    with the reason, and is not tried again (the same data would fail on every attempt and server)."""
    from raysweep.ledger import Ledger

    calls = tmp_path / "calls"
    hook = tmp_path / "hook.py"
    hook.write_text("from pathlib import Path\n"
                    f"CALLS = Path({str(calls)!r})\n"
                    "def make(num_prompts, seed):\n"
                    "    n = int(CALLS.read_text()) if CALLS.exists() else 0\n"
                    "    CALLS.write_text(str(n + 1))\n"
                    "    return [{'prompt': [5, 6, 7], 'output_len': 2 if n == 0 else -1}] * num_prompts\n")
    f = native_campaign(tmp_path, bench_args=f"--dataset-name custom --dataset-path {hook}:make --max-concurrency 2",
                        bench_params=[{}], max_attempts=3, bench={"client_cpus": 0.5})
    from helpers import run_file

    summary, out = run_file(f)
    assert summary.counts["failed"] == 1, summary.counts
    assert calls.read_text() == "2"  # checked once before the start, read once by the point
    ledger = Ledger(out / "ledger.sqlite")
    try:
        (row,) = ledger.points()
    finally:
        ledger.close()
    assert row.attempts >= 3 and "could not be prepared" in (row.error or "") and "item 0" in (row.error or "")


# -- public artifacts (tests/fixtures/README.md) ----------------------------------------------------------------

FIXTURES = Path(__file__).parent / "fixtures"
MOONCAKE = FIXTURES / "mooncake" / "conversation_trace_head.jsonl"
FASTCHAT = FIXTURES / "fastchat" / "dummy_conversation_head.json"
VLLM_SWEEP = FIXTURES / "vllm-sweep"


def test_the_mooncake_trace_excerpt_replays_request_for_request():
    from raysweep.bench.trace import trace_due, trace_report

    rows = [json.loads(line) for line in MOONCAKE.read_text().splitlines()]
    o = opts("--dataset-name", "timed_trace", "--dataset-path", str(MOONCAKE), "--trace-format", "mooncake",
             "--num-prompts", str(len(rows)))
    reqs = make_requests(o)
    assert [len(r.prompt) for r in reqs] == [r["input_length"] for r in rows]
    assert [r.output_len for r in reqs] == [r["output_length"] for r in rows]
    assert o.ignore_eos and trace_report(o) == {"trace_lines_out_of_order": 0, "trace_blank_lines": 0}
    assert sorted(set(trace_due(o).tolist())) == pytest.approx([0.0, 3.0, 5.999])  # Mooncake's milliseconds
    first = {tuple(r.prompt[:512]) for r in reqs}
    assert len(first) == 1  # every request opens with hash id 0: one shared 512-token block
    assert len({tuple(r.prompt[512:1024]) for r in reqs if len(r.prompt) >= 1024}) == \
        sum(1 for r in rows if r["input_length"] >= 1024)  # their second blocks all differ


def test_the_fastchat_sharegpt_file_gives_requests_and_sessions(tiny_model):
    from raysweep.bench.sessions import conversations
    from raysweep.bench.text import tokenizer_for

    data = json.loads(FASTCHAT.read_text())
    o = opts("--dataset-name", "sharegpt", "--dataset-path", str(FASTCHAT), "--num-prompts", "10",
             "--disable-shuffle", model=str(tiny_model))
    reqs = make_requests(o)
    firsts = {e["conversations"][0]["value"] for e in data}
    assert len(reqs) == 10 and all(r.prompt in firsts and r.output_len >= 4 for r in reqs)
    o = opts("--backend", "openai-chat", "--dataset-name", "multi_turn", "--dataset-path", str(FASTCHAT),
             "--num-prompts", "5", "--disable-shuffle", model=str(tiny_model))
    conv = conversations(o, tokenizer_for(o))
    want = [sum(1 for m in e["conversations"] if m["from"] == "human") for e in data[:5]]
    assert [n for _, n in conv.spans] == want and conv.messages[0] == data[0]["conversations"][0]["value"]


def test_vllms_sweep_parameter_files_are_read_as_vllm_reads_them(tmp_path):
    f = native_campaign(tmp_path, serve_params=str(VLLM_SWEEP / "serve_hparams.json"),
                        bench_params=str(VLLM_SWEEP / "bench_hparams.json"))
    result = _validate(f)
    assert result.exit_code == 0, result.output
    assert "6 server config(s) x 3 bench point(s)" in result.output
    share = tmp_path / "share.json"
    share.write_text(FASTCHAT.read_text())
    f = native_campaign(tmp_path, serve_params=str(VLLM_SWEEP / "serve_hparams.json"),
                        bench_params=str(VLLM_SWEEP / "bench_hparams.json"),
                        bench={"cmd": f"vllm bench serve --model m --dataset-name sharegpt --dataset-path {share}"})
    result = _validate(f)  # vLLM's documented pairing: every bench point would send the same requests
    assert result.exit_code == 2 and "random_input_len" in result.output and "bench_hparams.json" in result.output


@pytest.mark.vllm
def test_a_sweep_directory_written_by_vllm_bench_sweep_serve_is_imported_and_plotted(tmp_path, tiny_model):
    """The real `vllm bench sweep serve` against the streaming stand-in (one server config, vLLM's example
    bench parameter file, one run each): `raysweep import` and `pareto` read what it wrote."""
    import subprocess
    import sys

    from helpers import STANDIN

    from raysweep import procs
    from raysweep.cli import main

    vllm = Path(sys.executable).parent / "vllm"
    port = procs.free_port()
    serve = (f"{sys.executable} {STANDIN / 'stream_server.py'} --model {tiny_model} --host 127.0.0.1 "
             f"--port {port}")
    bench = (f"{vllm} bench serve --model {tiny_model} --host 127.0.0.1 --port {port} --dataset-name random "
             "--num-prompts 4 --max-concurrency 2")
    (tmp_path / "serve.json").write_text(json.dumps([{"max_num_seqs": 8}]))
    out = tmp_path / "sweep"
    proc = subprocess.run([str(vllm), "bench", "sweep", "serve", "--serve-cmd", serve, "--bench-cmd", bench,
                           "--after-bench-cmd", "true", "--serve-params", str(tmp_path / "serve.json"),
                           "--bench-params", str(VLLM_SWEEP / "bench_hparams.json"), "--num-runs", "1",
                           "-o", str(out)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "VLLM_HOST_IP": "127.0.0.1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    summaries = list(out.rglob("summary.json"))
    assert len(summaries) == 3
    runner = CliRunner()
    imported = runner.invoke(main, ["import", str(out), str(tmp_path / "imp")])
    assert imported.exit_code == 0 and "3 run(s)" in imported.output, imported.output
    from raysweep.results.importer import read_table

    df = read_table(tmp_path / "imp").df
    assert sorted(df["random_input_len"].tolist()) == [128, 256, 512]
    assert (df["completed"] == 4).all() and (df["total_output_tokens"] == 4 * df["random_output_len"]).all()
    front = runner.invoke(main, ["pareto", str(out), "--dry-run"])
    assert front.exit_code == 0 and "plot_pareto" in front.output, front.output


@pytest.mark.ray
@pytest.mark.vllm
def test_real_server_gets_the_traces_lengths_and_the_custom_sets_template(gpu_cluster, vllm_server, tmp_path, tok):
    """On the real server: a trace's requests generate exactly the trace's output lengths (ignore_eos sent),
    its text prompts count exactly its input lengths, and the custom set's prompts arrive in the chat
    template (the server counts the templated prompt's tokens, as vLLM's client counts them)."""
    from raysweep.bench.native import NativeBench

    url, model = vllm_server["url"], vllm_server["model"]
    rows = [{"timestamp": 0.05 * i, "input_length": n, "output_length": o, "hash_ids": [1, 2 + i]}
            for i, (n, o) in enumerate(((40, 12), (70, 9), (33, 16), (64, 5)))]
    trace = _trace(tmp_path / "t.jsonl", rows)
    custom = _custom(tmp_path / "c.jsonl")
    nb = NativeBench(cpus=0.5)
    try:
        ids = _run(nb, ["--dataset-name", "timed_trace", "--dataset-path", str(trace),
                        "--timed-trace-chunk-hash-size", "16"], url, model=model)
        text = _run(nb, ["--dataset-name", "timed_trace", "--dataset-path", str(trace), "--prompt-format", "text",
                         "--tokenizer", model, "--timed-trace-chunk-hash-size", "16"], url, model=model)
        chat = _run(nb, ["--dataset-name", "custom", "--dataset-path", str(custom), "--num-prompts", "2",
                         "--disable-shuffle", "--custom-output-len", "3", "--tokenizer", model], url, model=model)
    finally:
        nb.close()
    for out in (ids, text):
        r, s = out["result"], out["samples"]
        assert r["completed"] == 4 and r["failed"] == 0, r.get("errors_sample")
        got = sorted(zip(s["in_tok"], s["out_tok"]))
        assert got == sorted((row["input_length"], row["output_length"]) for row in rows)
    r, s = chat["result"], chat["samples"]
    assert r["completed"] == 2, r.get("errors_sample")
    want = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
            for p in ("What is the capital of India?", "And of Iran?")]
    assert sorted(s["in_tok"]) == sorted(len(tok(w).input_ids) for w in want)
    assert min(s["in_tok"]) > len(tok("And of Iran?").input_ids) + 5  # the template's tokens arrived


@pytest.mark.ray
@pytest.mark.parametrize("stream_server", [["--ttft-delay", "0.01"]], indirect=True)
def test_an_actor_whose_clock_is_off_by_seconds_still_sends_on_the_common_timeline(gpu_cluster, stream_server):
    """One of two actors runs its wall clock 5 s ahead: its offset is measured and its requests are still
    sent at their due times on the one timeline, interleaved with the other actor's."""
    import numpy as np
    import ray

    from raysweep.bench.native import NativeBench

    nb = NativeBench(cpus=0.5)
    try:
        nb._ensure(2)
        ray.get(nb.actors[1].skew_clock.remote(5.0))
        out = _run(nb, ["--num-prompts", "20", "--request-rate", "20", "--burstiness", "1000",
                        "--random-input-len", "4", "--random-output-len", "2"], stream_server, clients=2)
    finally:
        nb.close()
    r, s = out["result"], out["samples"]
    assert r["completed"] == 20 and r["client_clock_offset_ms_max"] == pytest.approx(5000, abs=250)
    begin, due, actor = (np.asarray(s[k], dtype=float) for k in ("begin", "due", "actor"))
    assert set(actor.tolist()) == {0.0, 1.0}
    assert np.max(np.abs(begin - due)) < 1.0  # neither actor 5 s early nor late: the merged timeline holds
    order = actor[np.argsort(begin)]
    assert np.sum(order[1:] != order[:-1]) >= 15  # dealt round robin, the two actors' requests interleave


@pytest.mark.ray
def test_warmup_requests_reach_the_server_before_the_point(gpu_cluster, tmp_path):
    """The stand-in fails every 4th request it receives. With 3 warmup requests sent first, the point's
    requests are the server's 4th, 5th, ...: its 1st, 5th and 9th fail (without the warmup: its 4th and 8th)."""
    from helpers import run_file

    from raysweep.record.runs import read_samples
    from raysweep.results.table import results_table

    f = native_campaign(tmp_path, server_args="--fail-every 4",
                        bench_args="--random-input-len 8 --random-output-len 2 --max-concurrency 1",
                        bench_params=[{}], warmup=3, bench={"client_cpus": 0.5})
    summary, out = run_file(f)
    assert summary.counts["done"] == 1, summary.failures
    row = results_table(CampaignDir(out)).iloc[0]
    s = read_samples(out / row["samples_path"])
    failed = sorted(int(k) for k, ok in zip(s["index"], s["ok"]) if not ok)
    assert failed == [0, 4, 8] and row["failed"] == 3
