"""GPU kernels built with the C harness and run on PoCL (host CPU), verified against numpy.

PoCL timings are host-CPU timings, never phone GPU timings; PoCL has no cl_khr_fp16, so for
dtype fp16 the fp16-storage / fp32-arithmetic variant is what runs here. The harness is cached
under XFC_CACHE_DIR, which conftest.py points at the session's temporary directory.
"""
from __future__ import annotations

import json
import random
import subprocess

import numpy as np
import pytest

import support
from support import needs_opencl
from xfc.errors import ToolchainError
from xfc.toolchain.opencl import build_harness
from xfc.pipeline import run_gpu_synth
from xfc.runners.pocl import POCL_LABEL
from xfc.hardware.load import load
from xfc.ops.spec import make_spec
from xfc.ops.workloads import SUITE, suite_spec

pytestmark = [pytest.mark.opencl, needs_opencl]

HARDWARE = ("mali-g78", "adreno-650")


@pytest.fixture(scope="module")
def harness():
    try:
        return build_harness()
    except ToolchainError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def hws():
    return {name: load(name) for name in HARDWARE}


def _run(spec, hw, tmp_path, **kw):
    kw.setdefault("verify", True)
    kw.setdefault("explain", False)
    kw.setdefault("bench", False)
    kw.setdefault("dtype", "fp32")
    result = run_gpu_synth(spec, hw, tmp_path, **kw)
    report = result.to_dict()
    assert result.target == "gpu" and result.verified == report["verified"] and report["output_dir"] == str(tmp_path)
    m = result.measurement   # the one Measurement type: PoCL timings are labelled, never phone timings
    if kw["verify"] or kw["bench"]:
        assert m.emulated and m.where == POCL_LABEL and m.median_s == report["measurement"]["median_s"]
        assert list(m.samples_s) == report["measurement"]["samples_s"] and m.output.size == int(np.prod(spec.output_shape))
    else:
        assert m is None
    if report.get("verified"):
        support.assert_clamps_for_seed(spec, 0)   # run_gpu_synth's inputs: make_inputs(spec, 0)
        support.record("opencl (PoCL)", "ran")
    return report


# Full-size suite workloads with a bias + ReLU6 epilogue, each on one of the two GPUs (alternating:
# the plans differ per GPU, the PoCL run costs the same) to keep the emulated FLOPs in budget;
# `make test` runs about half of them (PoCL runs on every core), both GPUs among them.
SUITE_CASES = [pytest.param(name, HARDWARE[i % 2], id=f"{name}-{HARDWARE[i % 2]}") for i, name in enumerate(sorted(SUITE))]


@pytest.mark.matrix(every=2, cover=("hw_name",))
@pytest.mark.parametrize("name,hw_name", SUITE_CASES)
def test_workload_suite_verifies_on_pocl(name, hw_name, hws, harness, tmp_path):
    report = _run(suite_spec(name, bias=True, activation="relu6"), hws[hw_name], tmp_path)
    assert report["verified"] is True, report
    assert report["error_to_bound_ratio"] <= 1.0
    assert report["measurement"]["median_s"] > 0


def _random_specs(count=26, seed=2024):
    rng = random.Random(seed)
    primes = [1, 2, 3, 5, 7, 11, 13, 17, 31, 37, 61, 67]
    acts = ["none", "relu", "relu6"]
    specs = []
    for i in range(count):
        op = ("matmul", "conv2d", "depthwise")[i % 3]
        bias, act = rng.random() < 0.6, rng.choice(acts)
        if op == "matmul":
            shape = dict(m=rng.choice(primes + [64, 129]), n=rng.choice(primes + [4, 33, 130]),
                         k=rng.choice(primes + [100]), batch=rng.choice([1, 1, 2]))
            specs.append(make_spec(op, shape, bias=bias, activation=act))
            continue
        r, s = rng.choice([1, 2, 3, 5]), rng.choice([1, 3, 4])
        h, w = rng.randint(r + 1, 23), rng.randint(s + 1, 29)
        stride = f"{rng.choice([1, 2])},{rng.choice([1, 2])}"
        pad = ",".join(str(rng.randint(0, max(0, extent - 1))) for extent in (r, s, r, s))
        dil = "2,1" if (i % 7 == 0 and h > 2 * r) else "1"
        shape = dict(c=rng.choice([1, 3, 5, 16, 17]), h=h, w=w, r=r, s=s, n=rng.choice([1, 1, 2]))
        if op == "conv2d":
            shape["k"] = rng.choice([1, 3, 8, 13, 33])
        specs.append(make_spec(op, shape, stride=stride, pad=pad, dilation=dil, bias=bias, activation=act))
    return specs


RANDOM_SPECS = _random_specs()


def test_random_suite_is_varied():
    assert len(RANDOM_SPECS) >= 20
    keys = " ".join(s.key() for s in RANDOM_SPECS)
    assert "relu6" in keys and "bias" in keys and "st2" in keys.replace("st1x2", "st2")
    assert any(getattr(s, "pad_top", 0) != getattr(s, "pad_bottom", 0) for s in RANDOM_SPECS)


# Each random shape runs on one GPU, alternating (13 each): the two GPUs' plans differ in the
# tiles and vector widths they choose, not in the kernel paths. `make test` runs a third of them
# (matrix), the CI fuzz 20 more PoCL cases.
@pytest.mark.matrix(every=3, cover=())   # random shapes: no value needs keeping
@pytest.mark.parametrize("index", range(len(RANDOM_SPECS)),
                         ids=[f"{HARDWARE[i % len(HARDWARE)]}-{s.key()}" for i, s in enumerate(RANDOM_SPECS)])
def test_random_shapes_verify_on_pocl(index, hws, harness, tmp_path):
    spec, hw_name = RANDOM_SPECS[index], HARDWARE[index % len(HARDWARE)]
    report = _run(spec, hws[hw_name], tmp_path)
    assert report["verified"] is True, (hw_name, report["tile_summary"], report["error_to_bound_ratio"])


@pytest.mark.parametrize("hw_name", HARDWARE)
def test_fp16_storage_variant_runs_and_half_kernel_is_rendered(hw_name, hws, harness, tmp_path):
    spec = make_spec("conv2d", dict(c=5, h=11, w=13, k=6, r=3, s=3), pad="1,0,1,2", bias=True, activation="relu6")
    report = _run(spec, hws[hw_name], tmp_path, dtype="fp16")
    assert report["run_variant"] == "fp16_storage" and report["verified"] is True
    assert report["fp16_kernel"]["status"] in ("rendered only", "compile-checked")
    assert "PoCL has no cl_khr_fp16" in report["fp16_kernel"]["note"]
    half_src = (tmp_path / f"{spec.key()}.fp16.cl").read_text()
    assert "#pragma OPENCL EXTENSION cl_khr_fp16 : enable" in half_src


def test_report_and_files(hws, harness, tmp_path):
    spec = make_spec("matmul", dict(m=37, n=41, k=19), bias=True, activation="relu")
    report = _run(spec, hws["adreno-650"], tmp_path, explain=True, bench=True, repeat=3)
    on_disk = json.loads((tmp_path / "report.json").read_text())
    for key in ("hardware", "target", "operator", "shape", "dims", "tiles", "predicted_gflops", "synthesis_seconds",
                "build_seconds", "verified", "max_abs_error", "error_to_bound_ratio", "measurement", "explain"):
        assert key in report and key in on_disk
    assert report["target"] == "gpu" and report["operator"] == "matmul" and report["verified"] is True
    assert report["timing_label"] == POCL_LABEL and "not a phone GPU timing" in POCL_LABEL
    assert report["prediction_label"] == "cost-model prediction, not a measurement"
    assert report["measurement"]["repeats"] == 3 and len(report["measurement"]["samples_s"]) == 3
    support.assert_samples_positive(report["measurement"]["samples_s"])
    assert "cost-model prediction" in report["explain"]
    for name in ("harness.c", "build.sh", "explain.txt", f"{spec.key()}.fp32.cl"):
        assert (tmp_path / name).exists()


def test_harness_command_line_and_json(hws, harness, tmp_path):
    spec = make_spec("depthwise", dict(c=3, h=9, w=10, r=3, s=3), pad=1)
    _run(spec, hws["mali-g78"], tmp_path, verify=False, bench=True)
    kernel = tmp_path / f"{spec.key()}.fp32.cl"
    args = [str(harness), str(kernel), str(tmp_path / "a.f32"), str(tmp_path / "b.f32"), str(tmp_path / "bias.f32"),
            str(tmp_path / "o.f32"), "--repeat", "5", "--warmup", "2"]
    out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=120).stdout
    line = json.loads(out.strip())
    assert set(line) == {"kernel", "repeats", "median_s", "min_s", "max_s", "samples_s", "device"}
    assert line["repeats"] == 5 and len(line["samples_s"]) == 5
    support.assert_samples_positive(line["samples_s"])
    assert np.fromfile(tmp_path / "o.f32", dtype=np.float32).size == 3 * 9 * 10
    # a wrong-size input is a one-line error, not a crash
    (tmp_path / "short.f32").write_bytes(b"\0" * 8)
    bad = subprocess.run([str(harness), str(kernel), str(tmp_path / "short.f32"), *args[3:6]],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and bad.stderr.count("\n") == 1 and "size mismatch" in bad.stderr
