"""A small sample of `make winograd-sweep` (scripts/winograd_sweep.py) in the suite: random 3x3
stride-1 shapes synthesized with the Winograd lowering forced, built for the host ISAs this CPU
runs, both entry points checked under the derived bound. The full sweep (240 cases, host and
qemu-aarch64) is `make winograd-sweep`."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.host

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "winograd_sweep.py"


def _sweep_module():
    spec = importlib.util.spec_from_file_location("winograd_sweep", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_random_shapes_sample(tmp_path):
    out = tmp_path / "sweep.json"
    status = _sweep_module().main(["--cases", "8", "--seed", "7", "--targets", "host", "--out", str(out)])
    data = json.loads(out.read_text())
    failed = [r for r in data["rows"] if not r.get("ok", True) and "skipped" not in r]
    assert status == 0 and not failed, failed
    assert data["summary"]["cases"] >= 6
    assert 0 < data["summary"]["worst_error_to_bound_ratio"] < 1
    assert all(data["summary"]["by_vectors"].values())      # both vector axes met random shapes
