# Where torch and triton already import (the GPU machines: no network), use that python3 and
# install nothing. Elsewhere (a fresh CPU machine, CI) build .venv with pinned CPU wheels.
SHELL := /bin/bash
HAVE_DEPS := $(shell python3 -c "import torch, triton, hypothesis, pytest, xdist" >/dev/null 2>&1 && echo yes)
ifeq ($(HAVE_DEPS),yes)
PY := python3
ENV :=
else
PY := .venv/bin/python
ENV := .venv/.installed
endif

# Never multicast / NVLS on the GPU machines (docs/DESIGN.md §8); harmless on CPU.
export TORCH_SYMM_MEM_DISABLE_MULTICAST := 1
export NCCL_NVLS_ENABLE := 0
export NVSHMEM_DISABLE_NVLS := 1

# CPU wheels: torch 2.13.0 is a local CPU build; anything newer would pull GBs of CUDA wheels.
# numpy: the Triton interpreter runs kernels on it. The rest pins the `test` extra of
# pyproject.toml (the suite, the fuzzers, the linter), which the venv installs with the project.
PINS := torch==2.13.0 triton==3.6.0 numpy==2.4.6 hypothesis==6.170.17 pytest==9.2.0 pytest-xdist==3.8.0 ruff==0.17.6

.PHONY: test test-load test-slow demo wheel-smoke bench fuzz fuzz-smoke mutants mutants-ci lint format env clean
env: $(ENV)

.venv/.installed: Makefile pyproject.toml
	python3 -m venv .venv
	.venv/bin/pip install --quiet --disable-pip-version-check $(PINS) -e '.[test]'
	touch $@

# ruff, configured in pyproject.toml: lint and the formatter's verdict (CI runs this first).
# On the GPU machines (no network, no ruff) run it here instead.
lint: $(ENV)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(ENV)
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

# The README's test command. Step 1: xdist spreads the single-process tiers over the cores;
# on a GPU machine each worker is pinned to one GPU (conftest.py), so the GPU tier runs there
# too. Step 2: the multi-rank tier, not under xdist (its ranks spin-wait on each other): GPU
# ranks, one per GPU (CP beyond the GPU count shares GPUs), where GPUs exist; CPU ranks
# elsewhere. `slow` cases (CP = 8 on CPU ranks, ...) run in `make test-slow`.
test: $(ENV)
	$(PY) -m pytest -n auto -q -m "not multirank and not slow"
	$(PY) -m pytest -q -m "multirank and not slow"

# make test beside four busy-looping processes (a loaded shared runner): every verdict must
# hold there too (.ci/under-load; docs/TESTING.md).
test-load: $(ENV)
	bash .ci/under-load $(MAKE) --no-print-directory test

test-slow: $(ENV)
	$(PY) -m pytest -n auto -q -m "slow and not multirank"
	$(PY) -m pytest -q -m "slow and multirank"

demo: $(ENV)
	$(PY) -m fast demo

# The wheel a user installs, in a fresh venv outside the tree: the demos, a fuzz campaign and
# the README's Python blocks from there (.ci/wheel-smoke; CI runs it).
wheel-smoke: $(ENV)
	WHEEL_PINS="$(filter torch==% triton==% numpy==% hypothesis==%,$(PINS))" bash .ci/wheel-smoke $(PY)

# GPU machines: ceilings, scorer bandwidth, per-layer CP vs stock (results/bench-<time>/).
bench: $(ENV)
	$(PY) -m bench

# Hypothesis campaigns (database under .hypothesis/, git-ignored). fuzz: ~10 minutes over
# every target; fuzz-smoke: each target's smoke budget, the one CI runs.
fuzz: $(ENV)
	$(PY) -m fuzz all

fuzz-smoke: $(ENV)
	$(PY) -m fuzz smoke --seed 0

# The mutation campaign: every planted bug of fuzz/campaign.py in its own copy of the tree,
# its fast tiers and its fuzz smoke against it; a table and the kill rate (about 15 minutes
# on 2 cores; docs/CAMPAIGN.md). mutants-ci: the day's two bugs of its CI pool (CI runs it).
mutants: $(ENV)
	$(PY) -m fuzz mutants

mutants-ci: $(ENV)
	$(PY) -m fuzz mutants --rotate 2 --budget 240

clean:
	rm -rf .venv .pytest_cache .hypothesis
