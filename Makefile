VENV ?= .venv
PY := $(VENV)/bin/python
# Beam's worker pool (portable runner tests) spawns `python` from PATH: the venv must come first.
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: venv demo test test-fast lint engines test-engines bench clean

$(VENV)/.installed: setup.py
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test,gcp]"
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(PY) -m pipeline.run --config=configs/local.yaml --overwrite

# The whole suite CI runs (.ci/run): unit, Beam, end to end and slow tests; not the real engines.
test: venv
	$(PY) -m pytest -q -m "not engines" tests

# Unit tests and TestPipeline tests only: under a minute, for every edit.
test-fast: venv
	$(PY) -m pytest -q -m "unit or beam" tests

lint: venv
	$(PY) -m ruff check pipeline transforms tests benchmarks data

# Real engines (Prism, a Flink session cluster, a Spark standalone cluster): fetch whatever is not
# cached yet (Go module cache, pip's cache, ~/.m2, ~/.cache/imgrec-engines), then run their tests.
engines: venv
	$(PY) -m tests.engines.fetch

test-engines: engines
	$(PY) -m pytest -q -rsxXfE --force-short-summary -m engines tests/engines

# The contenders run with imgrec's default install (no extras), as a user converting local files
# has it; the harness (corpora, timing) runs in $(VENV).
BENCH_VENV ?= .venv-bench
$(BENCH_VENV)/.installed: setup.py
	python3 -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install --quiet -e .
	touch $@

# Issue 10's large-photo target is measured against this revision (main when the issue was filed).
BENCH_BASELINE ?= 5188ed2
BENCH_FLAGS ?=
bench: venv $(BENCH_VENV)/.installed
	$(PY) -m benchmarks.run --python=$(BENCH_VENV)/bin/python --baseline_rev=$(BENCH_BASELINE) $(BENCH_FLAGS)

clean:
	rm -rf out .pytest_cache
