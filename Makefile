# prebake: every target works on a fresh machine: it makes .venv and installs what it needs.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: demo test test-fast bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	# torch first, pinned: on the project's machines this is the CPU build that lies on disk.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

## demo: bake tiny-llama into the embedded registry, then fetch (install) it from there
demo: $(STAMP)
	$(BIN)/doit bake model=tiny-llama precision=bf16
	$(BIN)/prebake ls
	$(BIN)/prebake fetch --model tiny-llama --precision bf16

## test: the whole suite (unit, contract, integration, faults)
test: $(STAMP)
	$(BIN)/pytest -q

## test-fast: everything but the tests that compile real graphs
test-fast: $(STAMP)
	$(BIN)/pytest -q -m "not slow"

## bench: the benchmark scripts, each printing ratios measured in one run
bench: $(STAMP)
	$(BIN)/python benchmarks/noop_bake.py
	$(BIN)/python benchmarks/bundle.py
	$(BIN)/python benchmarks/buckets.py

clean:
	rm -rf $(VENV) .prebake .doit.db* build *.egg-info
