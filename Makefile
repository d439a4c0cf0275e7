# The two set-up commands of the README: `make demo` (the main job) and `make test`.
# Each installs what is missing (system packages via apt-get when root, a .venv), then runs.
VENV_PY := .venv/bin/python

.PHONY: setup demo test test-matrices bench bench-setup model-bench sanitize soak net-fuzz readme-check clean tiledb int8-sweep int8-arm-sweep winograd-sweep fp16-sweep regret-runs

setup:
	@scripts/setup.sh

demo: setup
	@$(VENV_PY) scripts/demo.py

test: setup
	@$(VENV_PY) -m pytest -n 2 tests

# Every case of the suite's exhaustive matrices (tests marked matrix: `make test` runs one in N of
# each) with every compile-only kernel compiled -> benchmarks/results/test_matrices.json. Not in CI.
test-matrices: setup
	@$(VENV_PY) scripts/test_matrices.py

bench-setup:
	@scripts/setup.sh --bench

bench: bench-setup
	@$(VENV_PY) benchmarks/bench_cpu.py

# Host kernels under ASan + UBSan on edge-case shapes, every host ISA (not in CI; see scripts/sanitize.py).
sanitize: setup
	@$(VENV_PY) scripts/sanitize.py

# The shipped tile databases (tile_db/README.md): static rows for every shipped SoC and core.
# Row timestamps are the time of the last commit that touched the inputs (the files that decide
# the rows' contents), so a rebuild of the same inputs gives byte-identical tile_db/*.jsonl.
TILEDB_INPUTS := hardware_descriptions xfc/_version.py xfc/__init__.py $(addprefix xfc/hardware/,model.py schema.py ranges.py rules.py load.py) $(addprefix xfc/cpu/,isa.py ir.py tiles.py cost_model.py decide.py explain.py synth.py winograd.py) $(addprefix xfc/ops/,spec.py workloads.py winograd.py) \
	$(addprefix xfc/tiledb/,schema.py records.py fingerprint.py evaluators.py operators.py \
	build.py exchange.py)
tiledb: setup
	@epoch=$${SOURCE_DATE_EPOCH:-$$(git log -1 --format=%ct -- $(TILEDB_INPUTS) 2>/dev/null)}; \
		SOURCE_DATE_EPOCH=$${epoch:-0} $(VENV_PY) -m xfc.tiledb.shipped

# Not in CI: exports torchvision MobileNetV2 and ResNet-18 (random weights) at run time, runs
# `xfc model --hw host --verify --json` and writes benchmarks/results/model_<arch>_host.json.
# Needs torch + torchvision in .venv (the script names the pip command when they are missing).
model-bench: setup
	@$(VENV_PY) benchmarks/model_bench.py

# The README's "Using it" commands as printed, in a fresh directory under umask 022: every line
# exits as the README says and every output is 0644 (programs 0755). Not in CI (full-size kernels).
readme-check: setup
	@$(VENV_PY) scripts/readme_check.py

# Differential fuzzing soak (not in CI): 10,000 random kernels of every dtype (fp32, fp16, int8) on host,
# qemu-aarch64 and PoCL (~3 h on 2 cores). It can run in shards, each its own seed and file, e.g.
#   make soak SOAK_CASES=2500 SOAK_SEED=1 SOAK_OUT=benchmarks/results/soak/seed1.json
# and scripts/soak_summary.py adds up the shards in benchmarks/results/soak/.
SOAK_CASES ?= 10000
SOAK_SEED ?= 20240601
SOAK_JOBS ?= 2
SOAK_OUT ?= benchmarks/results/fuzz.json
soak: setup
	@$(VENV_PY) -m xfc fuzz --cases $(SOAK_CASES) --seed $(SOAK_SEED) --targets host,qemu,pocl --dtype fp32,fp16,int8 \
		--jobs $(SOAK_JOBS) --out $(SOAK_OUT)

# Random small networks through the network runtime (issue 32; not in CI): xfc fuzz --networks,
# host and snapdragon-865 under qemu alternating -> benchmarks/results/fuzz_networks.json.
NET_FUZZ_NETWORKS ?= 200
NET_FUZZ_SEED ?= 32
net-fuzz: setup
	@$(VENV_PY) -m xfc fuzz --networks $(NET_FUZZ_NETWORKS) --seed $(NET_FUZZ_SEED) --targets host,qemu \
		--out benchmarks/results/fuzz_networks.json

# int8 (issue 13), correctness only (not in CI): the suite on every host int8 dialect and >= 100
# random shapes per operator, byte-exact against xfc/ops/quant.py -> benchmarks/results/int8_sweep.json.
INT8_CASES ?= 100
int8-sweep: setup
	@$(VENV_PY) scripts/int8_sweep.py --cases $(INT8_CASES)

# ARM int8 (issue 13), correctness only (not in CI): the same cases (suite + >= 100 random shapes per
# operator) built static for AArch64 and run under qemu-aarch64 on Cortex-A76 (sdot), Cortex-A55
# (sdot, in-order), Cortex-A715 and Cortex-A510 (smmla) -> benchmarks/results/int8_arm_sweep.json.
int8-arm-sweep: setup
	@$(VENV_PY) scripts/int8_arm_sweep.py --cases $(INT8_CASES)

# Winograd lowering (issue 19, not in CI): 240 random 3x3 stride-1 shapes verified under the derived
# bound on every host ISA and under qemu-aarch64 (A55, A76, X1); writes benchmarks/results/winograd_sweep.json.
winograd-sweep: setup
	@$(VENV_PY) scripts/winograd_sweep.py

# fp16 CPU kernels (issue 13, not in CI): the suite and FP16_CASES random shapes per operator and core under
# qemu-aarch64 (Cortex-A76 and A55 descriptions), verified under the derived fp16 bound (docs/fp16.md);
# writes benchmarks/results/fp16_sweep.json. Correctness only.
FP16_CASES ?= 100
fp16-sweep: setup
	@$(VENV_PY) scripts/fp16_sweep.py --cases $(FP16_CASES)

# Winograd regret (issue 34, not in CI) as it is judged: three benchmarks/regret.py runs per thread count
# (1 and 2), each row's median over them (benchmarks/regret_runs.py). About 40 minutes on 2 cores; run it
# on a quiet machine. REGRET_TAG names the files, e.g. REGRET_TAG=intel_gnr_s68 ->
# benchmarks/results/regret_winograd_intel_gnr_s68_{1,2}t_{1,2,3}.json and regret_runs_intel_gnr_s68_{1,2}t.json.
REGRET_TAG ?=
REGRET_RESULTS = benchmarks/results/regret_winograd_$(REGRET_TAG)
regret-runs: setup
	@test -n "$(REGRET_TAG)" || { echo "make regret-runs: set REGRET_TAG, a name for this machine's files (e.g. REGRET_TAG=zen4_s68)" >&2; exit 2; }
	@for t in 1 2; do \
		for i in 1 2 3; do \
			$(VENV_PY) benchmarks/regret.py --part winograd --layers all --threads $$t \
				--out $(REGRET_RESULTS)_$${t}t_$$i.json || exit 1; \
		done; \
		$(VENV_PY) benchmarks/regret_runs.py $(REGRET_RESULTS)_$${t}t_1.json $(REGRET_RESULTS)_$${t}t_2.json \
			$(REGRET_RESULTS)_$${t}t_3.json --out-name regret_runs_$(REGRET_TAG)_$${t}t.json || exit 1; \
	done

clean:
	rm -rf xfc-out .pytest_cache
