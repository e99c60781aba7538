VENV ?= .venv
PY := $(VENV)/bin/python
# Beam's worker pool (portable runner tests) spawns `python` from PATH: the venv must come first.
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: venv demo test bench clean

$(VENV)/.installed: setup.py
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test,gcp]"
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(PY) -m pipeline.run --config=configs/local.yaml --overwrite

test: venv
	$(PY) -m pytest -q tests

# Issue 10's large-photo target is measured against this revision (main when the issue was filed).
BENCH_BASELINE ?= 5188ed2
BENCH_FLAGS ?=
bench: venv
	$(PY) -m benchmarks.run --baseline_rev=$(BENCH_BASELINE) $(BENCH_FLAGS)

clean:
	rm -rf out .pytest_cache
