# Developer entry points. `make test` is what CI runs (.ci/run).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP_INSTALL := $(PY) -m pip install --quiet --disable-pip-version-check
# `make test` runs pytest in three tiers on pytest-xdist workers (tests/conftest.py says how the work is
# spread): everything but the end-to-end tests on one worker per core, then the end-to-end tests, which
# mostly wait on trial windows, four side by side, then those marked `alone` by themselves. Apart, no
# end-to-end tuning run shares the CPU with the unit tests' bursts, which would skew the latencies its
# simulated engines serve; the `alone` ones judge a twin's predicted quantiles against measured ones
# within 15%, which four runs sharing two cores skew too.
PYTEST := CHUNKPILOT_REQUIRE_TORCH=1 CHUNKPILOT_REQUIRE_COMPILED_SIM=1 $(VENV)/bin/pytest --durations=30 --dist loadfile --no-loadscope-reorder
TEST_WORKERS ?= 2
E2E_WORKERS ?= 4

.PHONY: dev demo test test-unit lint typecheck crds clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip==26.3

# Strict editable install: the top-level folders are mapped onto chunkpilot.*
# packages through a link tree under build/. Re-run after adding a module.
# Then the simulator's compiled core (mypyc, about a minute; kept per source digest in
# ~/.cache/chunkpilot/sim-core/): without a C compiler the simulator runs as Python.
dev: $(PY)
	$(PIP_INSTALL) --editable '.[test,report]' --config-settings editable_mode=strict
	$(VENV)/bin/chunkpilot sim build-core || echo "the simulator runs as Python (see the error above)"

demo: dev
	$(VENV)/bin/chunkpilot cluster fetch
	$(VENV)/bin/chunkpilot demo --fast

lint: dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

typecheck: dev
	$(VENV)/bin/mypy -p chunkpilot

test-unit: dev
	$(VENV)/bin/pytest -m "not cluster and not e2e and not prometheus and not postgres and not vllm and not sglang and not gpu"

# Everything that runs without a GPU: unit, control-plane, Prometheus, PostgreSQL, e2e and
# real-vLLM-on-the-CPU tiers. The heavy environments (control-plane binaries, torch for the probe,
# vLLM's CPU build) are built once, with progress, and cached in ~/.cache/chunkpilot/.
test: dev lint typecheck
	$(VENV)/bin/chunkpilot cluster fetch
	$(VENV)/bin/chunkpilot probe torch-env
	$(VENV)/bin/python -m chunkpilot.engine.vllm_plugin.env
	$(VENV)/bin/python -m chunkpilot.engine.sglang.env
	$(VENV)/bin/python -m chunkpilot.engine.sim.aiperf_env
	$(PYTEST) -n $(TEST_WORKERS) -m "not gpu and not e2e"
	$(PYTEST) -n $(E2E_WORKERS) -m "e2e and not alone and not gpu"
	$(PYTEST) -m "e2e and alone and not gpu"

crds: dev
	$(VENV)/bin/chunkpilot crds generate

clean:
	rm -rf build $(VENV) .mypy_cache .ruff_cache .pytest_cache
