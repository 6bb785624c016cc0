# Entry points. Every target installs what it needs first (tools/install-deps.sh is
# idempotent) and builds through CMakePresets.json, so each works on a fresh Debian 12 machine.
SAMPLE ?= tests/data/sample/gpt_tiny_50steps.jsonl.gz
FUZZ_SECONDS ?= 300

.PHONY: all deps deps-torch build release demo demo-cluster test bench bench-snapshot fuzz format clean eval soak

all: build

deps:
	@tools/install-deps.sh

# PyTorch, libtorch-dev and pybind11: the release build then has the virtual GPU's native module.
deps-torch:
	@tools/install-deps.sh --with-torch

build: deps
	cmake --preset dev
	cmake --build --preset dev

release: deps
	cmake --preset release
	cmake --build --preset release

# The main job on bundled sample data: a request trace captured from a real PyTorch training run.
# Builds the native parts too (python/: `PYTHONPATH=python /usr/bin/python3 -c 'import fragscope.torch'`).
demo: deps-torch release
	SAMPLE=$(SAMPLE) tools/demo.sh

# The live loop (docs/live-monitoring.md): 8 torchrun CPU ranks on virtual GPUs, fragscope serve
# and Prometheus; without the monitor rank 3's OOM kills the job, with it every rank checkpoints,
# torchrun restarts, the fix is applied and the job finishes. Writes build/demo-cluster/summary.json.
demo-cluster: deps-torch release
	/usr/bin/python3 tools/demo_cluster.py --bin build/release/apps/fragscope/fragscope --out build/demo-cluster

# Every test: unit + CLI golden tests (dev build), the whole suite again under ASan+UBSan, and
# the Python tools' tests. Ends with one line of totals.
test:
	@tools/install-deps.sh --with-torch
	@tools/run_tests.sh

# The Google Benchmark programs, then the snapshot speed table (bench/python/snapshot_table.py:
# fragscope analyze vs a Python summary vs pickle.load alone, per size; SNAPSHOT_SIZES=28,447,2048
# adds the opt-in 2 GB file; SNAPSHOT_SHAPE=factor makes the issue's file shape, many segments
# and short stacks). bench-snapshot prints the table alone.
SNAPSHOT_SIZES ?= 28,447
SNAPSHOT_SHAPE ?= entries
SNAPSHOT_RUNS ?= 3
bench: deps
	cmake --preset bench
	cmake --build --preset bench
	tools/run_benchmarks.sh
	/usr/bin/python3 bench/python/snapshot_table.py --bin build/bench/apps/fragscope/fragscope \
	  --sizes $(SNAPSHOT_SIZES) --runs $(SNAPSHOT_RUNS) --shape $(SNAPSHOT_SHAPE) --report

bench-snapshot: deps
	cmake --preset bench
	cmake --build --preset bench --target fragscope
	/usr/bin/python3 bench/python/snapshot_table.py --bin build/bench/apps/fragscope/fragscope \
	  --sizes $(SNAPSHOT_SIZES) --runs $(SNAPSHOT_RUNS) --shape $(SNAPSHOT_SHAPE) --report

# The libFuzzer targets, FUZZ_SECONDS each, then the long adversarial run (random hostile
# inputs through analyze and convert, each bounded in exit code, memory, time and bytes
# written; tools/adversarial_inputs.py) for FUZZ_SECONDS.
fuzz: deps
	FUZZ_SECONDS=$(FUZZ_SECONDS) tools/run_fuzzers.sh
	cmake --preset dev
	cmake --build --preset dev --target fragscope
	/usr/bin/python3 tools/adversarial_inputs.py --bin build/dev/apps/fragscope/fragscope --seconds $(FUZZ_SECONDS)

format:
	git ls-files '*.cc' '*.h' | xargs clang-format -i

clean:
	rm -rf build

# The forecast evaluation (docs/forecast.md, docs/benchmarks.md "Forecast evaluation"): replays
# every request trace in bench/forecast_eval/workloads/ (plus the bundled sample and the
# harness's synthetic workloads) below and above the capacity that fits, and scores the warnings.
# Two sets (bench/forecast_eval/manifest.txt, issue 31): tuning and held-out test, each with its
# totals, reliability table and the four targets; the risk with resampling seeds 1, 2 and 3. The
# native core is built first: one test workload runs live on the virtual GPU (torch 2.13 of
# the user environment, tools/setup_user_env.sh; skipped without it).
EVAL = build/bench/bench/forecast_eval/forecast_eval --workloads bench/forecast_eval/workloads \
	  --trace $(SAMPLE)
eval:
	@tools/install-deps.sh --with-torch
	cmake --preset bench
	cmake --build --preset bench --target forecast_eval fragscope_core
	bench/forecast_eval/capture_workloads.sh
	$(EVAL) --risk --seed 1
	$(EVAL) --risk-only --seed 2
	$(EVAL) --risk-only --seed 3
# Load and fault test of `fragscope serve` (release build): 64 agents x 10 samples/s for 60 s,
# scrapes every 100 ms, agents that send garbage, flood or disconnect mid-frame. Prints scrape
# latency and the daemon's peak RSS; fails if a sample is lost (docs/benchmarks.md).
SOAK_ARGS ?= --agents 64 --rate 10 --seconds 60
soak: release
	/usr/bin/python3 tools/soak_serve.py --bin build/release/apps/fragscope/fragscope $(SOAK_ARGS)
