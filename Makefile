# The two set-up commands of the README: `make demo` (the main job) and `make test`.
# Each installs what is missing (system packages via apt-get when root, a .venv), then runs.
VENV_PY := .venv/bin/python

.PHONY: setup demo test bench bench-setup sanitize clean

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

# Host kernels under ASan + UBSan on edge-case shapes, every host ISA (not in CI; see scripts/sanitize.py).
sanitize: setup
	@$(VENV_PY) scripts/sanitize.py

clean:
	rm -rf xfc-out .pytest_cache
