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

bench: venv
	$(PY) -m benchmarks.run

clean:
	rm -rf out .pytest_cache
