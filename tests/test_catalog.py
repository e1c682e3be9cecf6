"""The catalogue: campaigns found and added once, updated while they run, queried with DuckDB, bad input
refused with the catalogue unchanged; like-for-like comparison; history with its regression verdicts.
Stub campaigns (tests/catalog_stubs.py): no Ray, no server."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from catalog_stubs import make_campaign
from click.testing import CliRunner

from raysweep.catalog.fields import mismatches
from raysweep.catalog.history import history
from raysweep.catalog.store import FORMAT, INDEX_FILE, Catalog
from raysweep.cli import main


def _cli(*args: str):
    return CliRunner().invoke(main, list(args))


def _state(cat: Path) -> dict[str, bytes]:
    return {str(p.relative_to(cat)): p.read_bytes() for p in sorted(cat.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def campaigns(tmp_path_factory):
    """Two finished campaigns of one workload (the second 20 % slower, on a newer vLLM), one more like the
    first, and one of another input length."""
    root = tmp_path_factory.mktemp("campaigns")
    make_campaign(root / "team/old", "old", started_at=1.70e9, vllm="0.31.0", seed=1, write_results=True)
    make_campaign(root / "team/new", "new", started_at=1.71e9, vllm="0.32.0", scale=0.8, seed=2)
    make_campaign(root / "team/same", "same", started_at=1.72e9, vllm="0.32.1", seed=3)
    make_campaign(root / "other/long", "long", started_at=1.73e9, input_lens=(64,), seed=4)
    return root


def test_add_finds_campaigns_recursively_once_and_queries_them(campaigns, tmp_path):
    cat = tmp_path / "cat"
    res = _cli("catalog", "add", str(cat), str(campaigns))
    assert res.exit_code == 0, res.output
    assert "4 added, 0 updated, 0 unchanged (112 runs written)" in res.output
    before = _state(cat)
    again = _cli("catalog", "add", str(cat), str(campaigns / "team"), str(campaigns / "other"))
    assert again.exit_code == 0, again.output
    assert "0 added, 0 updated, 4 unchanged (0 runs written)" in again.output
    assert _state(cat) == before  # adding twice adds nothing
    c = Catalog(cat)
    entries = {e["name"]: e for e in c.campaigns.values()}
    assert entries["old"]["vllm"] == ["0.31.0"] and entries["long"]["runs"] == 16 and entries["old"]["complete"]
    runs = c.query("SELECT campaign, model, dataset, input_len, output_len, load_variable, load_value, hardware, "
                   "vllm_version, build, validity_ok, server_settings FROM runs WHERE campaign = 'long'")
    assert len(runs) == 16
    row = runs.iloc[0]
    assert (row["model"], row["dataset"], row["input_len"], row["output_len"]) == ("tiny", "random", "64", "16")
    assert row["load_variable"] == "max_concurrency" and row["load_value"] in (1.0, 2.0)
    assert row["build"] == "cpu" and row["validity_ok"] and "--max-num-seqs" in row["server_settings"]
    listed = _cli("catalog", "list", str(cat))
    assert listed.exit_code == 0 and all(n in listed.output for n in ("old", "new", "same", "long"))
    q = _cli("catalog", "query", str(cat), "--campaign", "long", "--csv")
    assert q.exit_code == 0, q.output
    lines = q.output.strip().splitlines()
    assert len(lines) == 1 + 4 and lines[0].startswith("campaign,config,model,dataset,input_len")
    sql = _cli("catalog", "query", str(cat), "--sql", "SELECT count(*) AS n FROM runs", "--csv")
    assert sql.output.split() == ["n", "112"]


def test_a_running_campaign_is_added_as_it_stands_and_updated_later(tmp_path):
    src = make_campaign(tmp_path / "runs/live", "live", runs=3, input_lens=(16,), concurrencies=(1,), done=2)
    cat = tmp_path / "cat"
    assert _cli("catalog", "add", str(cat), str(src)).exit_code == 0
    entry = next(iter(Catalog(cat).campaigns.values()))
    assert entry["runs"] == 2 and not entry["complete"]
    make_campaign(tmp_path / "runs/live", "live", runs=3, input_lens=(16,), concurrencies=(1,))  # it went on
    res = _cli("catalog", "add", str(cat), str(tmp_path / "runs"))
    assert "0 added, 1 updated" in res.output, res.output
    entries = list(Catalog(cat).campaigns.values())
    assert len(entries) == 1 and entries[0]["runs"] == 6 and entries[0]["complete"]
    assert entries[0]["added_at"] == entry["added_at"]
    assert len(Catalog(cat).query("SELECT * FROM runs")) == 6


def test_bad_input_names_the_path_and_leaves_the_catalogue_unchanged(campaigns, tmp_path):
    cat = tmp_path / "cat"
    assert _cli("catalog", "add", str(cat), str(campaigns / "other")).exit_code == 0
    before = _state(cat)
    empty = tmp_path / "nothing here"
    empty.mkdir()
    (empty / "notes.json").write_text("{}")
    res = _cli("catalog", "add", str(cat), str(campaigns / "team"), str(empty))
    assert res.exit_code == 2 and str(empty) in res.output and "neither a campaign" in res.output
    assert _state(cat) == before  # the good directory before it was not added either
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "ledger.sqlite").write_bytes(b"not a database at all" * 100)
    res = _cli("catalog", "add", str(cat), str(damaged))
    assert res.exit_code == 2 and str(damaged) in res.output and "cannot be read" in res.output
    assert _state(cat) == before
    index = json.loads((cat / INDEX_FILE).read_text())
    (cat / INDEX_FILE).write_text(json.dumps({**index, "format": FORMAT + 1}))
    before = _state(cat)
    for args in (("catalog", "add", str(cat), str(campaigns / "team")), ("catalog", "list", str(cat)),
                 ("history", str(cat))):
        res = _cli(*args)
        assert res.exit_code == 2 and str(cat / INDEX_FILE) in res.output and "newer raysweep" in res.output
    assert _state(cat) == before
    res = _cli("catalog", "list", str(tmp_path / "no catalogue"))
    assert res.exit_code == 2 and "not a catalogue" in res.output


def test_two_adds_at_once_each_keep_their_campaigns(campaigns, tmp_path):
    """A catalogue opened before another `catalog add` wrote to it: its own add starts from the index as it is
    when it writes (under the directory's lock), so neither campaign is lost; and the lock is exclusive."""
    import fcntl
    import os
    import threading

    cat = tmp_path / "cat"
    assert _cli("catalog", "add", str(cat), str(campaigns / "team/old")).exit_code == 0
    stale = Catalog(cat)  # opened now, written later
    assert _cli("catalog", "add", str(cat), str(campaigns / "team/new")).exit_code == 0
    report = stale.add([campaigns / "other/long"])
    assert report.added == ["long"]
    assert sorted(e["name"] for e in Catalog(cat).campaigns.values()) == ["long", "new", "old"]
    assert len(Catalog(cat).query("SELECT * FROM runs")) == 32 + 32 + 16  # old, new and long
    fd = os.open(cat, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another add holds the catalogue: this one waits for it
    done = threading.Event()
    worker = threading.Thread(target=lambda: (Catalog(cat).add([campaigns / "team/same"]), done.set()))
    worker.start()
    try:
        assert not done.wait(1.0)
    finally:
        os.close(fd)
    worker.join(60)
    assert done.is_set() and len(Catalog(cat).campaigns) == 4


def test_history_and_the_list_as_json(campaigns, tmp_path):
    import jsonschema

    from raysweep.cli.jsonout import schema

    cat = tmp_path / "cat"
    assert _cli("catalog", "add", str(cat), str(campaigns / "team/old"), str(campaigns / "team/new")).exit_code == 0
    res = CliRunner().invoke(main, ["history", str(cat), "--fail-on-regression", "--json"])
    assert res.exit_code == 1, res.output  # the newest campaign is worse: the exit says so with --json too
    doc = json.loads(res.stdout)
    jsonschema.validate(doc, schema("history"))
    assert doc["regressed"] == doc["judged"] == len(doc["series"]) == 8
    old, new = doc["series"][0]["points"]
    assert (old["campaign"], old["verdict"], new["campaign"], new["verdict"]) == ("old", "first", "new", "worse")
    assert new["low"] < new["ratio"] < new["high"] < 0.95 and new["vllm"] == "0.32.0"
    res = CliRunner().invoke(main, ["catalog", "list", str(cat), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    jsonschema.validate(doc, schema("catalog"))
    assert [c["name"] for c in doc["campaigns"]] == ["old", "new"] and doc["campaigns"][0]["vllm"] == ["0.31.0"]


def test_like_for_like_says_why_points_are_not_comparable(campaigns, tmp_path):
    a, b = {"model": "m", "input_len": "1024", "hardware": "h"}, {"model": "m", "input_len": "2048", "hardware": "h"}
    assert mismatches(a, b) == ["not comparable: input length 1024 vs 2048"]
    cat = tmp_path / "cat"
    assert _cli("catalog", "add", str(cat), str(campaigns)).exit_code == 0
    res = _cli("catalog", "compare", str(cat), "old", "long")
    assert res.exit_code == 1, res.output  # nothing compared: no empty table with exit 0
    assert "not comparable: input length 16 vs 64" in res.output  # the nearest point of the baseline
    assert "worse" not in res.output and "better" not in res.output  # nothing set side by side
    assert "nothing compared: no point of long is like a point of old" in res.output
    assert "┃ point" not in res.output and "baseline" not in res.output.split("nothing compared")[0].split(":")[0]
    res = _cli("catalog", "compare", str(cat), "old", "new")
    assert res.exit_code == 0 and res.output.count("worse") == 8 and "not comparable" not in res.output


def test_catalog_compare_as_json_and_an_empty_query_says_what_selected_nothing(campaigns, tmp_path):
    import jsonschema

    from raysweep.cli.jsonout import schema

    cat = tmp_path / "cat"
    assert _cli("catalog", "add", str(cat), str(campaigns)).exit_code == 0
    res = _cli("catalog", "compare", str(cat), "old", "new", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    jsonschema.validate(doc, schema("catalog_compare"))
    assert len(doc["matched"]) == 8 and all(m["verdict"] == "worse" for m in doc["matched"])
    none = _cli("catalog", "compare", str(cat), "old", "long", "--json")
    assert none.exit_code == 1 and json.loads(none.output)["matched"] == []
    assert json.loads(none.output)["unmatched"][0]["why"] == ["not comparable: input length 16 vs 64"]
    empty = _cli("catalog", "query", str(cat), "--model", "m")
    assert empty.exit_code == 2, empty.output
    assert "--model m: no valid run has it; there are: tiny" in empty.output
    both = _cli("catalog", "query", str(cat), "--campaign", "long", "--input-len", "16")
    assert both.exit_code == 2 and "no valid run matches them all" in both.output
    nojson = _cli("catalog", "add", str(cat), str(campaigns), "--json")
    assert nojson.exit_code == 2 and "`raysweep catalog add` has no JSON output" in nojson.output


def test_compare_controls_its_points_as_one_family(tmp_path):
    """Two campaigns of one configuration drawn alike (24 points, 5 runs each): alone, two points look
    different at p < 5 %; over the 24 tests (Benjamini-Hochberg) neither is called better or worse."""
    from raysweep.catalog import queries

    for name, seed, at in (("a", 105, 1.7e9), ("b", 205, 1.8e9)):
        make_campaign(tmp_path / name, name, seed=seed, runs=5, input_lens=(16, 32, 64), concurrencies=(1, 2, 4, 8),
                      started_at=at)
    cat = tmp_path / "cat"
    assert _cli("catalog", "add", str(cat), str(tmp_path / "a"), str(tmp_path / "b")).exit_code == 0
    result = queries.compare(Catalog(cat), "a", "b", "output_throughput")
    alone = [m for m in result.matched if m["p"] < 0.05]
    assert len(result.matched) == 24 and len(alone) == 2
    assert all(m["verdict"].startswith("not shown (") and m["p_adjusted"] >= 0.05 for m in alone)
    assert not any(m["verdict"] in ("better", "worse") for m in result.matched)
    res = _cli("catalog", "compare", str(cat), "a", "b")
    assert res.exit_code == 0, res.output
    assert "24 tests, false discovery rate (Benjamini-Hochberg) at 5%: a difference is called only" in res.output


def test_history_flags_the_regression_with_its_interval(campaigns, tmp_path):
    cat = tmp_path / "cat"
    assert _cli("catalog", "add", str(cat), str(campaigns / "team")).exit_code == 0
    series = history(Catalog(cat), "output_throughput", 0.05, {"config": "max_num_seqs=8", "input_len": "16"})
    assert len(series) == 2  # one per load: never mixed
    for s in series:
        assert [j.campaign for j in s.points] == ["old", "new", "same"]
        old, new, same = s.points
        assert new.word == "worse" and new.high < 0.95 and new.low < new.ratio < new.high
        assert same.word == "better" and same.low > 1.05  # back where it was
        assert not s.regressed
    res = _cli("history", str(cat), "--config", "max_num_seqs=8", "--fail-on-regression")
    assert res.exit_code == 0, res.output  # the newest campaign is not worse
    assert "worse: 0.8" in res.output and "0.31.0" in res.output
    latest = tmp_path / "cat2"
    assert _cli("catalog", "add", str(latest), str(campaigns / "team/old"), str(campaigns / "team/new")).exit_code == 0
    res = _cli("history", str(latest), "--metric", "output_throughput", "--fail-on-regression")
    assert res.exit_code == 1 and "8 with the newest campaign worse" in res.output
    res = _cli("history", str(latest), "--metric", "median_ttft_ms", "--fail-on-regression")
    assert res.exit_code == 0, res.output  # latencies did not move: nothing shown worse
    assert _cli("history", str(latest), "--metric", "nope").exit_code == 2


def test_a_filter_on_model_hardware_or_campaign_reads_only_the_campaigns_that_can_match(tmp_path):
    """The index lists each campaign's models and hardware: a query filtered on them opens only those
    campaigns' files, and answers as the query over every file does."""
    for name, hw in (("h", "1 node(s) x 1 GPU(s) / GPU H100"), ("a", "1 node(s) x 1 GPU(s) / GPU A100")):
        make_campaign(tmp_path / "c" / name, name, hardware=hw, input_lens=(16,), concurrencies=(1,))
    cat = tmp_path / "cat"
    assert _cli("catalog", "add", str(cat), str(tmp_path / "c")).exit_code == 0
    c = Catalog(cat)
    ids = {e["name"]: i for i, e in c.campaigns.items()}
    a100 = "1 node(s) x 1 GPU(s) / GPU A100"
    assert c.select(hardware=a100) == [ids["a"]] and c.select(model="tiny", campaign="h") == [ids["h"]]
    assert c.select(model="other") == [] and c.select() is None
    assert len(c.query("SELECT * FROM runs", only=c.select(hardware=a100))) == 8
    pruned = history(c, filters={"hardware": a100})
    assert [s.key["hardware"] for s in pruned] == [a100, a100]  # one per configuration
    assert history(c, filters={"model": "other"}) == []


def test_the_interconnect_is_the_transport_the_servers_nccl_lines_showed():
    from raysweep.catalog.sources import _common

    assert _common({"transport_inter": "IB", "transport_intra": "P2P/NVLink"})["interconnect"] == "IB between nodes"
    one = {"transport_inter": "n/a", "transport_intra": "P2P/NVLink"}
    assert _common(one)["interconnect"] == "P2P/NVLink within one node"
    assert _common({})["interconnect"] is None  # nothing read: missing, never guessed


def test_history_says_not_shown_with_too_few_runs(tmp_path):
    make_campaign(tmp_path / "c/a", "a", runs=2, input_lens=(16,), concurrencies=(1,), started_at=1.7e9)
    make_campaign(tmp_path / "c/b", "b", runs=2, input_lens=(16,), concurrencies=(1,), started_at=1.8e9, scale=0.5)
    cat = tmp_path / "cat"
    assert _cli("catalog", "add", str(cat), str(tmp_path / "c")).exit_code == 0
    series = history(Catalog(cat))
    assert series and all(s.points[-1].word.startswith("not shown (fewer than 3 runs") for s in series)


FIXTURES = Path(__file__).resolve().parent / "fixtures"


def test_other_tools_outputs_are_read_with_what_they_say_and_missing_what_they_do_not(tmp_path):
    from test_plots import build_vllm_dir

    src = tmp_path / "results"
    build_vllm_dir(src / "vllm")
    (src / "aiperf/run1").mkdir(parents=True)
    (src / "aiperf/run1/profile_export_aiperf.json").write_bytes(
        (FIXTURES / "aiperf/profile_export_aiperf.json").read_bytes())
    csv_export = (FIXTURES / "aiperf/csv-only/profile_export_aiperf.csv").read_bytes()
    (src / "aiperf/run1/profile_export_aiperf.csv").write_bytes(csv_export)  # beside its JSON: not read
    (src / "aiperf/run2").mkdir(parents=True)
    (src / "aiperf/run2/profile_export_aiperf.csv").write_bytes(csv_export)  # alone: read
    (src / "aiperf/run2/other.csv").write_text("a,b\n1,2\n")  # some other CSV: not a result
    (src / "guidellm").mkdir()
    (src / "guidellm/benchmarks.json").write_bytes((FIXTURES / "guidellm/benchmarks_stripped.json").read_bytes())
    (src / "guidellm/unrelated.json").write_text('{"not": "a result"}')
    cat = tmp_path / "cat"
    res = _cli("catalog", "add", str(cat), str(src))
    assert res.exit_code == 0, res.output
    assert "4 added" in res.output
    c = Catalog(cat)
    assert sorted(e["source"] for e in c.campaigns.values()) == ["aiperf", "aiperf-csv", "guidellm", "vllm-sweep"]
    runs = c.query("SELECT * FROM runs ORDER BY source, point, run_number")
    aiperf = runs[runs.source == "aiperf"].iloc[0]
    assert (aiperf.model, aiperf.dataset, aiperf.input_len, aiperf.load_variable, aiperf.load_value) == \
        ("mock-model", "synthetic", "550", "max_concurrency", 4.0)
    assert pd.isna(aiperf.output_len) and pd.isna(aiperf.hardware) and pd.isna(aiperf.vllm_version)  # not said
    assert aiperf.output_throughput == pytest.approx(1022443.0554692096) and aiperf.p99_e2el_ms == pytest.approx(
        15.14387014) and aiperf.validity_ok
    csv = runs[runs.source == "aiperf-csv"]
    assert len(csv) == 1 and csv.iloc[0].source_path.endswith("run2/profile_export_aiperf.csv")
    row = csv.iloc[0]  # the CSV holds no configuration: the model and the load missing, the measured input length
    assert pd.isna(row.model) and pd.isna(row.load_variable) and row.input_len == "550" and pd.isna(row.output_len)
    assert row.output_throughput == pytest.approx(2320.72) and row.request_throughput == pytest.approx(9.55)
    assert (row.mean_ttft_ms, row.median_ttft_ms, row.p99_ttft_ms) == pytest.approx((2343.22, 2369.32, 3833.39))
    assert row.p99_e2el_ms == pytest.approx(9297.61) and row.mean_itl_ms == pytest.approx(27.76)
    assert not row.validity_ok and row.validity_issues == "11 errored request(s)"
    assert row.date == pytest.approx(1759522419.15456896)
    guide = runs[runs.source == "guidellm"].iloc[0]
    assert (guide.model, guide.input_len, guide.output_len, guide.load_variable, guide.load_value) == \
        ("example_model", "256", "128", "max_concurrency", 1.0)  # a synchronous strategy: one at a time
    assert guide.output_throughput == pytest.approx(198.13346751788123)
    assert guide.p99_e2el_ms > 100  # GuideLLM's request latency is in seconds: kept in ms
    vllm = runs[runs.source == "vllm-sweep"]
    assert len(vllm) == 8 and set(vllm.model) == {"m"} and set(vllm.input_len) == {"128"}
    assert set(vllm.load_value) == {4.0, 8.0} and vllm.hardware.isna().all()
    # like for like across tools: different workloads are named, never compared
    res = _cli("catalog", "compare", str(cat), "exp-20250101", "run1/profile_export_aiperf.json")
    assert res.exit_code == 1 and "not comparable: model m vs mock-model" in res.output, res.output  # none alike
    again = _cli("catalog", "add", str(cat), str(src))
    assert "0 added, 0 updated, 4 unchanged" in again.output


def _flagged_campaign(out: Path) -> Path:
    """A finished campaign every run of which failed a validity check (shared CPUs)."""
    make_campaign(out, "flagged", started_at=1.74e9, seed=5)
    for path in (out / "points").rglob("run=*.json"):
        rec = json.loads(path.read_text())
        path.write_text(json.dumps({**rec, "validity_ok": False, "validity_issues": "shared CPUs"}))
    return out


def test_a_campaign_whose_every_point_failed_is_listed_ended_not_complete(tmp_path):
    from raysweep.ledger import Ledger

    out = make_campaign(tmp_path / "broken", "broken", done=0)
    led = Ledger.open_existing(out)
    for p in led.points():
        led.mark_failed(p.point_id, "server failed to start", started=False)
    led.close()
    cat = tmp_path / "cat"
    assert _cli("catalog", "add", str(cat), str(out)).exit_code == 0
    listed = _cli("catalog", "list", str(cat))
    assert listed.exit_code == 0 and "ended, no run finished" in listed.output and "complete" not in listed.output
    assert _cli("site", str(cat), str(tmp_path / "site")).exit_code == 0
    index = (tmp_path / "site" / "index.html").read_text()
    assert "<td>ended, no run finished</td>" in index and "<td>complete</td>" not in index


INDEX_PROBE = """<script>
window.__errors = [];
window.addEventListener('error', function (e) { window.__errors.push(String(e.message)); });
window.addEventListener('load', function () {
  var rows = function () { return Array.from(document.querySelectorAll('#campaigns tbody tr'))
    .filter(function (r) { return r.style.display !== 'none'; })
    .map(function (r) { return r.cells[1].textContent; }); };
  var before = rows();
  var v = document.getElementById('f-vllm'); v.value = '0.31.0'; v.dispatchEvent(new Event('change'));
  var after = rows();
  document.body.setAttribute('data-probe', JSON.stringify({before: before, after: after, errors: window.__errors,
    reports: Array.from(document.querySelectorAll('a[href^="reports/"]')).length}));
});
</script>"""

OVERLAY_PROBE = """<script>
window.__errors = [];
window.addEventListener('error', function (e) { window.__errors.push(String(e.message)); });
var __t = setInterval(function () {
  if (document.body.getAttribute('data-drawn') !== 'yes') return;
  clearInterval(__t);
  var figs = Array.from(document.querySelectorAll('figure')).map(function (f) {
    return {campaigns: Array.from(f.querySelectorAll('svg.overlay g[data-campaign]')).map(function (g) {
      return {id: g.getAttribute('data-campaign'), points: g.querySelectorAll('circle').length,
              front: g.querySelectorAll('polyline.front').length}; }),
            curves: Array.from(f.querySelectorAll('svg.curves g[data-campaign]')).map(function (g) {
      return {id: g.getAttribute('data-campaign'), points: g.querySelectorAll('circle').length,
              configs: Array.from(g.querySelectorAll('polyline.curve')).map(function (l) {
                return [l.getAttribute('data-config'), l.getAttribute('points').split(' ').length]; })}; }),
            note: (f.querySelector('.note') || {}).textContent || '',
            legend: (f.querySelector('.legend') || {}).textContent || '',
            dashes: Array.from(f.querySelectorAll('.legend line')).map(function (l) {
              return l.getAttribute('stroke-dasharray'); }),
            ticks: Array.from(f.querySelectorAll('svg.overlay text.tick')).map(function (t) {
              return Number(t.textContent); }),
            ttft: Array.from(f.querySelectorAll('svg.overlay circle title')).map(function (t) {
              return Number(t.textContent.split(', ').pop().split(' ')[0]); })};
  });
  document.body.setAttribute('data-probe', JSON.stringify({figs: figs, errors: window.__errors,
    summary: document.getElementById('summary').textContent}));
}, 50);
</script>"""


def _probe(exe: str, page: Path, query: str = "") -> dict:
    import re

    from browser import run_browser

    done = run_browser(exe, "--virtual-time-budget=10000", "--dump-dom", page.as_uri() + query)
    assert done.returncode == 0, done.stderr[-3000:]
    found = re.search(r'data-probe="([^"]*)"', done.stdout)
    assert found, f"the probe did not run: {done.stdout[:500]} {done.stderr[-2000:]}"
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<")
                      .replace("&gt;", ">").replace("&#39;", "'"))


def test_the_site_lists_filters_and_overlays_in_chromium(campaigns, tmp_path):
    from browser import browser

    exe = browser()
    cat = tmp_path / "cat"
    assert _cli("catalog", "add", str(cat), str(campaigns)).exit_code == 0
    (campaigns / "team/old/report.html").write_text("<html><body>the old campaign's report</body></html>")
    res = _cli("site", str(cat), str(tmp_path / "site"))
    assert res.exit_code == 0, res.output
    site = tmp_path / "site"
    hist = (site / "history.html").read_text()
    assert "newest against the one before" in hist
    # a page per configuration (2 configurations x 2 input lengths measured by old, new and same): a line per
    # load, the campaigns in date order, the one shown worse than the one before it ringed at each load
    pages = sorted(site.glob("history-*.html"))
    assert len(pages) == 4 and all(f'href="{p.name}"' in hist for p in pages)
    for page in pages:
        text = page.read_text()
        assert text.count("<g data-load=") == 2 and text.count('class="worse"') == 2 + 2  # rings and cells
        assert text.index(">old (0.31.0)<") < text.index(">new (0.32.0)<") < text.index(">same (0.32.1)<")
    index = site / "probed-index.html"
    index.write_text((site / "index.html").read_text().replace("</body>", INDEX_PROBE + "</body>", 1))
    probe = _probe(exe, index)
    assert probe["errors"] == []
    assert sorted(probe["before"]) == ["long", "new", "old", "same"]  # what was added
    assert probe["after"] == ["old"] and probe["reports"] == 1  # the filter narrows it; the report is linked
    ids = {e["name"]: e["id"] for e in Catalog(cat).campaigns.values()}
    overlay = site / "probed-overlay.html"
    overlay.write_text((site / "overlay.html").read_text().replace("</body>", OVERLAY_PROBE + "</body>", 1))
    probe = _probe(exe, overlay, f"?ids={ids['old']},{ids['new']}")
    assert probe["errors"] == []
    figs = probe["figs"]
    assert len(figs) == 2  # one per input length (16, 32), both campaigns drawn in each
    for f in figs:
        assert {c["id"] for c in f["campaigns"]} == {ids["old"], ids["new"]} and not f["note"]
        assert all(c["points"] == 4 and c["front"] == 1 for c in f["campaigns"])  # 2 configs x 2 loads
        # and against the load, one curve per campaign and configuration, its loads in order
        assert {c["id"] for c in f["curves"]} == {ids["old"], ids["new"]}
        assert all(c["points"] == 4 and sorted(c["configs"]) == [["max_num_seqs=16", 2], ["max_num_seqs=8", 2]]
                   for c in f["curves"]), f["curves"]
        xs, ys = f["ticks"][0::2], f["ticks"][1::2]  # the scale: five ticks a side, from the data's range
        assert len(xs) == len(ys) == 5 and xs == sorted(xs) and ys == sorted(ys) and ys[0] == 0
        assert xs[0] == pytest.approx(min(f["ttft"]), rel=5e-3) and xs[-1] == pytest.approx(max(f["ttft"]), rel=5e-3)
        # a legend for the colours (campaigns, by name) and for the line styles (configurations)
        assert "colour: campaign" in f["legend"] and "old" in f["legend"] and ids["old"] not in f["legend"]
        assert "line (load curves): configuration" in f["legend"] and "max_num_seqs=16" in f["legend"]
        assert len(f["dashes"]) == 2 and len(set(f["dashes"])) == 2
    probe = _probe(exe, overlay, f"?ids={ids['old']},{ids['long']}")
    assert probe["errors"] == [] and len(probe["figs"]) == 3  # another input length: never on one axis
    assert all("not comparable: input length" in f["note"] for f in probe["figs"]), probe["figs"]
    assert all(ids["old"] not in f["note"] and ids["long"] not in f["note"] for f in probe["figs"])  # by name
    assert any(f["note"].startswith("only old measured this") for f in probe["figs"]), probe["figs"]
    # a campaign whose every run is flagged is said not drawn, by name, never dropped without a word
    flagged = _flagged_campaign(tmp_path / "flagged")
    assert _cli("catalog", "add", str(cat), str(flagged)).exit_code == 0
    assert _cli("site", str(cat), str(tmp_path / "site")).exit_code == 0
    ids = {e["name"]: e["id"] for e in Catalog(cat).campaigns.values()}
    overlay.write_text((site / "overlay.html").read_text().replace("</body>", OVERLAY_PROBE + "</body>", 1))
    probe = _probe(exe, overlay, f"?ids={ids['old']},{ids['flagged']}")
    assert probe["errors"] == [] and "not drawn, no valid run" in probe["summary"], probe["summary"]
    assert probe["summary"].endswith(": flagged") and len(probe["figs"]) == 2


def test_an_endpoint_campaign_has_the_model_its_bench_command_names(tmp_path):
    """A campaign against an endpoint raysweep did not start has no `vllm serve` command: its model is the one
    the bench command names (`--model`)."""
    from raysweep.ledger import Ledger

    out = make_campaign(tmp_path / "ep", "ep")
    for path in (out / "points").rglob("run=*.json"):
        rec = json.loads(path.read_text())
        rec.pop("provenance_model_path", None)  # an endpoint: no server of ours to read the model from
        path.write_text(json.dumps(rec))
    led = Ledger.open_existing(out)
    meaning = json.loads(led.meta("meaning") or "{}")
    led.set_meta("meaning", json.dumps({**meaning, "serve_cmd": []}))
    led.close()
    cat = tmp_path / "cat"
    assert _cli("catalog", "add", str(cat), str(out)).exit_code == 0
    (entry,) = Catalog(cat).campaigns.values()
    assert entry["models"] == ["tiny"]


def test_history_and_catalog_compare_leave_out_the_outlier_run_the_campaign_leaves_out(tmp_path):
    """One run of one point 3 times the others: the campaign's aggregates leave it out (Grubbs' rule), and so
    do `catalog compare` and `history`, so that they state the ratio `compare` states for the same campaigns."""
    from raysweep.results import compare as compare_dirs

    a = make_campaign(tmp_path / "a", "a", runs=6, input_lens=(16,), concurrencies=(1,), seed=11, started_at=1.70e9)
    b = make_campaign(tmp_path / "b", "b", runs=6, input_lens=(16,), concurrencies=(1,), seed=12, started_at=1.71e9)
    run = sorted((a / "points").rglob("run=2.json"))[0]
    rec = json.loads(run.read_text())
    run.write_text(json.dumps({**rec, "output_throughput": rec["output_throughput"] * 3}))
    cat = tmp_path / "cat"
    assert _cli("catalog", "add", str(cat), str(a), str(b)).exit_code == 0
    res = _cli("catalog", "compare", str(cat), "a", "b", "--json")
    matched = {m["point"].split(" | ")[0]: m for m in json.loads(res.output)["matched"]}
    cmp = compare_dirs.compare(compare_dirs.load_side(a), compare_dirs.load_side(b), metrics=["output_throughput"])
    by_config = {int(r["max_num_seqs"]): r["output_throughput_ratio"] for r in cmp.table.to_dict("records")}
    assert {k: round(v, 9) for k, v in by_config.items()} == {
        int(p.split("=")[1]): round(m["ratio"], 9) for p, m in matched.items()}, (by_config, matched)
    series = history(Catalog(cat), "output_throughput", 0.05, {"input_len": "16"})
    runs = {s.config: [j.runs for j in s.points] for s in series}
    assert sorted(runs.values()) == [[5, 6], [6, 6]], runs  # the outlier left out of its campaign's point


def test_history_leaves_out_a_value_the_campaign_cut_from_one_metric_only(tmp_path):
    """One run's p99 TTFT 3 times the others' (its throughput as theirs): the campaign leaves that value out of
    p99_ttft_ms only (Grubbs' rule per metric), and so does `history`: its p99 TTFT series rests on the other runs,
    its throughput series on all of them."""
    from raysweep.results import aggregate
    from raysweep.results.importer import read_table

    a = make_campaign(tmp_path / "a", "a", runs=6, input_lens=(16,), concurrencies=(1,), seed=11, started_at=1.70e9)
    run = sorted((a / "points").rglob("run=2.json"))[0]
    rec = json.loads(run.read_text())
    run.write_text(json.dumps({**rec, "p99_ttft_ms": rec["p99_ttft_ms"] * 3}))
    summary = aggregate.summarize(read_table(a).df)
    assert sum("p99_ttft_ms" in m.split(",") for m in summary["outlier_metrics"]) == 1
    cat = tmp_path / "cat"
    assert _cli("catalog", "add", str(cat), str(a)).exit_code == 0
    tail = {s.config: [j.runs for j in s.points] for s in history(Catalog(cat), "p99_ttft_ms", 0.05,
                                                                  {"input_len": "16"})}
    rate = {s.config: [j.runs for j in s.points] for s in history(Catalog(cat), "output_throughput", 0.05,
                                                                  {"input_len": "16"})}
    assert sorted(tail.values()) == [[5], [6]] and sorted(rate.values()) == [[6], [6]], (tail, rate)
