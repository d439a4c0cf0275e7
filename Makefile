# The two set-up commands of the README: `make demo` (the main job) and `make test`.
# Each installs what is missing (system packages via apt-get when root, a .venv), then runs.
VENV_PY := .venv/bin/python

.PHONY: setup demo test bench bench-setup clean

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

clean:
	rm -rf xfc-out .pytest_cache
