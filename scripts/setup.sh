#!/usr/bin/env bash
# Installs what xfc needs on a Debian/Ubuntu machine, idempotently:
#   system packages (apt-get, when run as root; otherwise a message naming them), then
#   a virtual environment .venv with xfc (editable) and its Python dependencies.
# Usage: scripts/setup.sh [--bench]   (--bench adds the peers used by benchmarks/: torch, onnxruntime)
# The tests need the 'test' and 'ray' extras (Ray: tests/test_ray_cluster.py, --executor ray).
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(gcc make python3-venv gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user
              pocl-opencl-icd ocl-icd-opencl-dev opencl-headers clinfo llvm-16 adb cmake)

missing=()
need() { command -v "$1" >/dev/null 2>&1 || missing+=("$2"); }
need gcc gcc
need make make
need aarch64-linux-gnu-gcc gcc-aarch64-linux-gnu
need qemu-aarch64 qemu-user
need clinfo clinfo
need llvm-mca-16 llvm-16
need adb adb
need cmake cmake
[ -e /usr/aarch64-linux-gnu/lib/libc.a ] || missing+=(libc6-dev-arm64-cross)
[ -e /usr/include/CL/cl.h ] || missing+=(opencl-headers)
ls /usr/lib/x86_64-linux-gnu/libOpenCL.so >/dev/null 2>&1 || missing+=(ocl-icd-opencl-dev)
ls /etc/OpenCL/vendors/pocl.icd >/dev/null 2>&1 || missing+=(pocl-opencl-icd)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)

if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing system packages: ${APT_PACKAGES[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # Third-party chatter (debconf notes, pip banners) goes to a log shown only on failure,
    # so set-up output is xfc's own.
    log=$(mktemp -t xfc-setup-apt.XXXXXX)
    if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${APT_PACKAGES[@]}"; } >"$log" 2>&1; then
      cat "$log" >&2; echo "xfc setup: apt-get failed (log above)" >&2; exit 1
    fi
    rm -f "$log"
  else
    echo "xfc setup: missing system packages: ${missing[*]}" >&2
    echo "xfc setup: install them as root, e.g.: sudo apt-get install -y ${APT_PACKAGES[*]}" >&2
    exit 1
  fi
fi

PY=python3
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "xfc setup: Python >= 3.11 is required (found $($PY --version 2>&1))" >&2
  exit 1
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv

# Re-install only when the dependency list changed: keeps re-runs fast.
extras="test,ray"
[ "${1:-}" = "--bench" ] && extras="test,ray,bench"
stamp=".venv/.xfc-installed-$(sha256sum pyproject.toml | cut -c1-16)-${extras//,/-}"
if [ ! -e "$stamp" ]; then
  echo "[setup] installing Python packages into .venv (xfc[$extras])"
  log=.venv/xfc-pip.log
  if ! { .venv/bin/python -m pip install -q --upgrade pip && .venv/bin/python -m pip install -q -e ".[$extras]"; } >"$log" 2>&1; then
    cat "$log" >&2; echo "xfc setup: pip install failed (log above, also in $log)" >&2; exit 1
  fi
  touch "$stamp"
fi

# Byte-compile the project's own modules, as pip does for the packages it installs (an editable
# install leaves it to the first import, which PYTHONDONTWRITEBYTECODE turns off): every `xfc`
# process then starts in ~0.45 s instead of ~0.75 s. Stale files are rewritten, current ones kept.
.venv/bin/python -m compileall -q -j 0 xfc android_runner tests benchmarks scripts >/dev/null ||
  echo "[setup] byte-compiling the sources failed (python -m compileall xfc shows why); xfc still runs" >&2
# The same for the test modules in the form pytest runs them (assertions rewritten, cached in
# tests/__pycache__): a collection writes them once (~7 s), so the first `pytest -m unit -n 2` of a
# clone takes what later ones do (~23 s, not ~33 s: each worker rewrote every module). ~2 s when current.
if [ -d tests ] && .venv/bin/python -c "import pytest" 2>/dev/null; then
  .venv/bin/python -m pytest --collect-only -q -p no:cacheprovider tests >/dev/null 2>&1 ||
    echo "[setup] collecting the tests failed (python -m pytest --collect-only tests shows why)" >&2
fi
