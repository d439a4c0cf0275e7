"""benchmarks/winograd_stages.py: the XFC_WINO_STAGES switch of both Winograd templates really runs
only the stages asked for (a build without one of them no longer computes the convolution, the
whole one does), and a smoke run of the benchmark writes its table and JSON. Host: builds and runs
generic-ISA kernels."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from support import conv, host_kernel, host_march
from xfc.cpu.codegen import render_cpu_kernel
from xfc.cpu.winograd import STAGE_BITS, hand_winograd_plan, stage_only_source
from xfc.ops.reference import check_winograd_output, make_inputs

pytestmark = pytest.mark.host
REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("vectors", ["tiles", "channels"])
def test_a_build_without_a_stage_no_longer_computes_the_convolution(vectors, tmp_path):
    spec = conv(24, 11, 13, 20, 3, 3, pad=1, bias=True, act="relu")      # ragged for m = 4
    plan = hand_winograd_plan(spec, 4, "generic", 1, gcc_march=host_march("generic"), vectors=vectors,
                              function_name=f"wino_stages_{vectors}")
    rendered = render_cpu_kernel(plan)
    a, b, bias = make_inputs(spec)
    outputs = {}
    for label in STAGE_BITS:
        kernel = host_kernel(replace(rendered, source=stage_only_source(rendered.source, label)), tmp_path / label)
        outputs[label] = kernel(a, b, bias)
    assert check_winograd_output(spec, 4, outputs["whole"], a, b, bias).ok
    for label in ("input", "gemms", "output"):
        assert not np.allclose(outputs[label], outputs["whole"]), label


def test_the_stage_benchmark_smoke_run_writes_its_table_and_json(tmp_path):
    out = tmp_path / "stages.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "XFC_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "winograd_stages.py"), "--only", "tiny",
                           "--rounds", "1", "--repeats", "2", "--m", "2,4", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [(r["layer"], r["m"], r["threads"]) for r in rows] == [("tiny", 2, 1), ("tiny", 4, 1)]
    for r in rows:
        assert set(r["measured_ms"]) == {"whole", "input", "gemms", "output"}
        assert all(v > 0 for v in r["measured_ms"].values()) and r["model_ms"]["whole"] > 0
    assert "tiny" in proc.stdout and "wrote" in proc.stdout
