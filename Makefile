# The two set-up commands: `make demo` (the CPU demo campaign) and `make test` (the lint and the type check, then
# every test); `make test-fast` runs the lint, the type check and every test that starts neither Ray nor vLLM
# nor a lab (about a minute). The lab tier (marker `lab`, tests/test_lab.py: real hosts in network namespaces)
# runs within `make test` as one group on one worker, beside the other worker's tests; it needs root and is
# skipped, with a warning that says so, without it.
# Both create .venv with everything they need on a fresh machine.
VENV   := .venv
BIN    := $(VENV)/bin
MODEL  := $(CURDIR)/.cache/tiny-llama
# Ray and vLLM stay on loopback on this machine; Ray's usage stats stay off.
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER := 0
export RAY_USAGE_STATS_ENABLED := 0
export VLLM_HOST_IP := 127.0.0.1
# Two pytest workers (pytest-xdist): while one test waits on a server's start or a stand-in's sleep, the other
# runs. The longest tests go first (tests/conftest.py) and each worker holds at most 3 tests, so that the next
# free worker takes the next longest; the tests of the shared real server form one group (`--dist loadgroup`),
# sent to one worker, so that one `vllm serve` serves them all. The tests that judge the client's own timing
# (marker `timing`) run after them, one at a time, with nothing beside them; docs/tests.md has the times.
PYTEST := $(BIN)/python -m pytest -q -p no:cacheprovider -n 2 --dist loadgroup

.PHONY: setup demo demo-cluster demo-slurm slurm-up slurm-down install-slurm test test-fast lint clean-demo
setup:
	bash scripts/setup-venv.sh

demo: setup
	$(BIN)/raysweep tiny-model $(MODEL)
	RAYSWEEP_DEMO_MODEL=$(MODEL) $(BIN)/raysweep run configs/demo-cpu.yaml

# The multi-node demo on a lab of 3 real hosts on this machine (root; docs/multinode.md): the lab up, a campaign
# with one configuration pipeline-parallel across two hosts and one on a single host, clients on the third, its
# status with the links measured, the lab down.
demo-cluster: setup
	env -u RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER -u VLLM_HOST_IP BIN=$(BIN) MODEL=$(MODEL) bash scripts/demo-cluster.sh

# A real Slurm on a lab of 3 hosts (root; docs/cluster.md): Debian's slurmctld, slurmd and munge installed
# once (scripts/install-slurm.sh), slurmctld on host 1, a slurmd per host, the hosts' simulated GPUs as gres.
# `make demo-slurm` submits the multi-node demo to it with the sbatch `raysweep slurm` writes.
install-slurm:
	bash scripts/install-slurm.sh

slurm-up: setup install-slurm
	env -u RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER -u VLLM_HOST_IP $(BIN)/raysweep lab up --name slurm --subnet 10.77.2.0/24 --slurm

slurm-down:
	$(BIN)/raysweep lab down --name slurm

demo-slurm: setup
	env -u RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER -u VLLM_HOST_IP BIN=$(BIN) MODEL=$(MODEL) bash scripts/demo-slurm.sh

test: lint
	bash scripts/install-browser.sh
	bash scripts/install-slurm.sh
	RAY_AUTH_MODE=disabled RAYSWEEP_REQUIRE_VLLM=1 $(PYTEST) -m "not timing" --durations=25
	RAY_AUTH_MODE=disabled RAYSWEEP_REQUIRE_VLLM=1 $(BIN)/python -m pytest -q -p no:cacheprovider -m timing

# ruff (lint and import order) and mypy, with the rules in pyproject.toml; .pre-commit-config.yaml runs the same
lint: setup
	$(BIN)/ruff check raysweep tests benchmarks
	$(BIN)/mypy

test-fast: lint
	RAY_AUTH_MODE=disabled $(PYTEST) -m "not ray and not vllm and not lab" --durations=10

clean-demo:
	rm -rf results/demo-cpu
