VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
# Every venv is built by this uv (from PyPI) from requirements.lock: what CI tested, exactly.
UV_VERSION := 0.13.9
LOCK := requirements.lock
LOCK_EXTRAS := --extra test --extra gcp --extra aws
# Beam's worker pool (portable runner tests) spawns `python` from PATH: the venv must come first.
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: venv demo test test-fast lint lock test-newest test-oldest engines test-engines stores test-stores bench bench-smoke clean \
	test-detection-readers lock-modelgarden

# A fresh venv holding exactly the locked versions, plus imgrec itself (editable, no dependencies).
$(VENV)/.installed: $(LOCK) setup.py
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)
	$(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(PY) -r $(LOCK)
	$(VENV)/bin/uv pip install --quiet --python $(PY) --no-deps -e .
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(PY) -m pipeline.run --input=data/sample --output=out/demo --overwrite

# The whole suite CI runs (.ci/run): unit, Beam, end to end and slow tests; not the real engines,
# nor the object stores (make test-stores), nor Model Garden's reader (make test-detection-readers),
# nor the benchmark harness's own run (make bench-smoke). Three pytest-xdist workers on two cores,
# a test file each at a time (its module fixtures run once): many tests wait on the processes they
# start, so a third worker fills the gaps (6:46 and 7:14 against 7:09 and 7:31 with two, 2 rounds
# interleaved; the same for make test-fast). TEST_WORKERS=0 runs them in one.
TEST_WORKERS ?= 3
test: venv
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile \
		-m "not engines and not stores and not modelgarden and not bench" tests

# Unit tests and TestPipeline tests without converter processes: well under a minute, for every edit.
# Many short tests: spread one by one over the workers (33-35 s against 52-53 s in one, load ~1).
FAST := (unit or beam) and not converter
test-fast: venv
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m "$(FAST)" tests

lint: venv
	$(PY) -m ruff check pipeline transforms tests benchmarks data

# Refresh the lock to the newest releases setup.py allows; then `make test` (and commit both).
lock: venv
	$(VENV)/bin/uv pip compile setup.py $(LOCK_EXTRAS) --python-version 3.11 --upgrade \
		--custom-compile-command "make lock" --quiet -o $(LOCK)

# Early warning: a separate venv with the newest releases setup.py allows (not the lock), the fast
# suite and the demo on it. What moved since the lock is printed first, and again if it fails.
NEWEST_VENV ?= .venv-newest
test-newest:
	$(MAKE) --no-print-directory check-range RANGE_VENV=$(NEWEST_VENV) RESOLUTION=highest

# The oldest releases setup.py allows (its lower bounds, `uv --resolution=lowest-direct`).
OLDEST_VENV ?= .venv-oldest
test-oldest:
	$(MAKE) --no-print-directory check-range RANGE_VENV=$(OLDEST_VENV) RESOLUTION=lowest-direct

.PHONY: check-range
check-range:
	rm -rf $(RANGE_VENV)
	$(PYTHON) -m venv $(RANGE_VENV)
	$(RANGE_VENV)/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)
	$(RANGE_VENV)/bin/uv pip install --quiet --compile-bytecode --python $(RANGE_VENV)/bin/python --resolution=$(RESOLUTION) \
		-e ".[test,gcp,aws]"
	$(RANGE_VENV)/bin/python -m tests.lock_drift $(LOCK)
	PATH="$(abspath $(RANGE_VENV))/bin:$$PATH" $(RANGE_VENV)/bin/python -m pytest -q -m "unit or beam" tests \
		&& PATH="$(abspath $(RANGE_VENV))/bin:$$PATH" $(RANGE_VENV)/bin/python -m pipeline.run \
			--input=data/sample --output=out/$(RANGE_VENV) --overwrite \
		|| { $(RANGE_VENV)/bin/python -m tests.lock_drift --failed $(LOCK); exit 1; }

# Model Garden's TfExampleDecoder reads imgrec's detection records (tests/test_detection_readers.py).
# tf-models-official pins its own TensorFlow, so it gets its own venv from its own lock.
MODELGARDEN_VENV ?= .venv-modelgarden
MODELGARDEN_LOCK := requirements-modelgarden.lock
$(MODELGARDEN_VENV)/.installed: $(MODELGARDEN_LOCK)
	rm -rf $(MODELGARDEN_VENV)
	$(PYTHON) -m venv $(MODELGARDEN_VENV)
	$(MODELGARDEN_VENV)/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)
	$(MODELGARDEN_VENV)/bin/uv pip install --quiet --python $(MODELGARDEN_VENV)/bin/python -r $(MODELGARDEN_LOCK)
	touch $@

test-detection-readers: venv $(MODELGARDEN_VENV)/.installed
	MODELGARDEN_PYTHON=$(abspath $(MODELGARDEN_VENV))/bin/python $(PY) -m pytest -q -m modelgarden tests

lock-modelgarden: venv
	$(VENV)/bin/uv pip compile requirements-modelgarden.in --python-version 3.11 --upgrade \
		--custom-compile-command "make lock-modelgarden" --quiet -o $(MODELGARDEN_LOCK)

# Real engines (Prism, a Flink session cluster, a Spark standalone cluster): fetch whatever is not
# cached yet (Go module cache, pip's cache, ~/.m2, ~/.cache/imgrec-engines) and build Beam's Flink
# and Spark job servers from engines/ with Maven (skipped while the poms are unchanged; flags for
# mvn in IMGREC_MVN_FLAGS, e.g. -o to build from ~/.m2 alone), then run their tests.
engines: venv
	$(PY) -m tests.engines.fetch

test-engines: engines stores
	$(PY) -m pytest -q -rsxXfE --force-short-summary -m engines tests/engines

# Object stores: moto's S3 server (test extra) and fake-gcs-server (go install, cached in
# ~/.cache/imgrec-stores, sources in the Go module cache), which the tests start on loopback.
stores: venv
	$(PY) -m tests.stores.servers

test-stores: stores
	$(PY) -m pytest -q -rsxXfE --durations=0 -m stores tests/stores

# The contenders run with imgrec's default install (no extras), as a user converting local files
# has it, at the locked versions; the harness (corpora, timing) runs in $(VENV).
BENCH_VENV ?= .venv-bench
$(BENCH_VENV)/.installed: $(LOCK) setup.py
	rm -rf $(BENCH_VENV)
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)
	$(BENCH_VENV)/bin/uv pip install --quiet --compile-bytecode --python $(BENCH_VENV)/bin/python -c $(LOCK) -e .
	touch $@

# The benchmark harness end to end on small corpora (a few minutes): after changing benchmarks/.
bench-smoke: venv
	$(PY) -m pytest -q -m bench tests

# Issue 10's large-photo target is measured against this revision (main when the issue was filed).
BENCH_BASELINE ?= 5188ed2
BENCH_FLAGS ?=
bench: venv $(BENCH_VENV)/.installed
	$(PY) -m benchmarks.run --python=$(BENCH_VENV)/bin/python --baseline_rev=$(BENCH_BASELINE) $(BENCH_FLAGS)

clean:
	rm -rf out .pytest_cache
