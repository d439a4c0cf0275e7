# The two set-up commands of the README: `make demo` (the main job) and `make test`.
# Each installs what is missing (system packages via apt-get when root, a .venv), then runs.
VENV_PY := .venv/bin/python

.PHONY: setup demo test bench bench-setup model-bench clean

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

# Not in CI: exports torchvision MobileNetV2 and ResNet-18 (random weights) at run time, runs
# `xfc model --hw host --verify --json` and writes benchmarks/results/model_<arch>_host.json.
# Needs torch + torchvision in .venv (the script names the pip command when they are missing).
model-bench: setup
	@$(VENV_PY) benchmarks/model_bench.py

clean:
	rm -rf xfc-out .pytest_cache
