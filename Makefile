# The two set-up commands of the README: `make demo` (the main job) and `make test`.
# Each installs what is missing (system packages via apt-get when root, a .venv), then runs.
VENV_PY := .venv/bin/python

.PHONY: setup demo test bench bench-setup soak clean

setup:
	@scripts/setup.sh

demo: setup
	@$(VENV_PY) scripts/demo.py

test: setup
	@$(VENV_PY) -m pytest -n 2 tests

bench-setup:
	@scripts/setup.sh --bench

bench: bench-setup
	@$(VENV_PY) benchmarks/bench_cpu.py

# Differential fuzzing soak (not in CI): 10,000 random kernels on host, qemu-aarch64 and PoCL.
SOAK_CASES ?= 10000
SOAK_SEED ?= 20240601
SOAK_JOBS ?= 2
soak: setup
	@$(VENV_PY) -m xfc fuzz --cases $(SOAK_CASES) --seed $(SOAK_SEED) --targets host,qemu,pocl \
		--jobs $(SOAK_JOBS) --out benchmarks/results/fuzz.json

clean:
	rm -rf xfc-out .pytest_cache
