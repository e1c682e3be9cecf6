"""The test tiers of tests/conftest.py, checked in a small pytest run of their own: a test of the shared real
server carries the `vllm` marker and the server's group, and `--dist loadgroup` sends the whole group to one
worker (so that `make test` starts one `vllm serve` for them, not one per worker)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

TESTS = '''
import os

import pytest


@pytest.fixture(scope="session")
def vllm_server():   # stands in for the conftest's real server: which worker asked for it
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


@pytest.mark.parametrize("i", range(6))
def test_of_the_shared_server(vllm_server, request, i):
    assert request.node.get_closest_marker("vllm") is not None
    (request.config.rootpath / f"ran-{i}").write_text(vllm_server)


@pytest.mark.parametrize("i", range(8))
def test_of_nothing_shared(request, i):
    assert request.node.get_closest_marker("vllm") is None
'''


def test_the_shared_servers_tests_run_on_one_worker(tmp_path):
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_group.py").write_text(TESTS)
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist",
                          "loadgroup", "-v", "-o", "addopts="], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "14 passed" in run.stdout, run.stdout[-3000:]
    workers = {(tmp_path / f"ran-{i}").read_text() for i in range(6)}
    assert len(workers) == 1 and workers <= {"gw0", "gw1"}, workers
    assert run.stdout.count("@vllm-server") >= 6, run.stdout[-3000:]
