"""The campaign's `slo:` (service-level objective) and SLA target metrics refused through `raysweep validate`:
exit 2 naming the field and what is accepted, nothing written. Ranking under an slo is tested in
tests/test_conclusions_verdicts.py."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from helpers import standin_campaign

from raysweep.cli import main


def validate(tmp_path, **fields):
    f = standin_campaign(tmp_path, **fields)
    return CliRunner().invoke(main, ["validate", str(f)])


def test_an_slo_in_the_target_syntax_is_accepted(tmp_path):
    res = validate(tmp_path, slo={"p99_ttft_ms": 500, "median_tpot_ms": "<=50", "output_throughput": 10})
    assert res.exit_code == 0, res.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("slo, expected", [
    ({"p99_ttf_ms": 500}, ["slo.p99_ttf_ms", "not a metric", "did you mean p99_ttft_ms"]),
    ({"p99_ttft_ms": 0}, ["slo.p99_ttft_ms", "must be a positive number"]),
    ({"median_tpot_ms": -5}, ["slo.median_tpot_ms", "must be a positive number"]),
    ({"p101_ttft_ms": 500}, ["slo.p101_ttft_ms", "percentile 101 is outside 0 to 100"]),
    ({"p99_ttft_ms": "about 500"}, ["slo.p99_ttft_ms", "neither a number nor"]),
    ([500], ["slo", "valid dictionary"]),
])
def test_a_bad_slo_exits_2_naming_the_field(tmp_path, slo, expected):
    res = validate(tmp_path, slo=slo)
    assert res.exit_code == 2, res.output
    for text in expected:
        assert text in res.output, (text, res.output)
    assert not (tmp_path / "out").exists()


def test_an_sla_target_beyond_p100_is_refused(tmp_path):
    res = validate(tmp_path, bench={"backend": "native", "cmd": "vllm bench serve --model m --num-prompts 10"},
                   sla={"targets": [{"p101_ttft_ms": "<=200"}], "variable": "max_concurrency"})
    assert res.exit_code == 2, res.output
    assert "sla.targets[0].p101_ttft_ms" in res.output and "outside 0 to 100" in res.output
    assert not (tmp_path / "out").exists()
