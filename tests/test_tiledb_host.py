"""The tile database on this machine: micro-kernels rendered, built with gcc and timed; a build
killed with SIGKILL and resumed; synthesis answered from measured rows still builds kernels that
match numpy; the FMA probe gives plausible figures and caches them. No speed is asserted."""
from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import host_kernel
from xfc.cpu.codegen import render_cpu_kernel
from xfc.hardware.load import load
from xfc.ops.reference import check_output, make_inputs
from xfc.ops.spec import make_spec
from xfc.cpu.tiles import enumerate_micro_tiles
from xfc.cpu.isa import isa_for
from xfc.cpu.synth import synthesize_cpu
from xfc.tiledb.build import plan_tasks, register_hardware, run_build
from xfc.tiledb.evaluators import HostMicroKernelEvaluator, TileDbEvaluator, open_for_synthesis, tile_params
from xfc.tiledb import probe as probe_module
from xfc.tiledb.probe import host_probe
from xfc.hardware.host import detect_host
from xfc.tiledb.records import as_dict, check_record
from xfc.tiledb.store import TileDb

pytestmark = [pytest.mark.host,
              pytest.mark.skipif(shutil.which("gcc") is None, reason="no host gcc"),
              pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 host only")]

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def host():
    hw = load("host")
    core = hw.cluster().core
    return hw, core, isa_for(core)


def some_tiles(core, isa, count):
    """A spread of register tiles: small, the static model's favourites, wide."""
    tiles = enumerate_micro_tiles(core, isa)
    picks = [tiles[0], tiles[len(tiles) // 3], tiles[len(tiles) // 2], tiles[-1], tiles[len(tiles) // 4]]
    return list(dict.fromkeys(picks))[:count]


def env():
    out = {k: v for k, v in os.environ.items() if k != "XFC_DEBUG"}
    out["PYTHONPATH"] = str(REPO)
    return out


def test_host_micro_kernel_rows_are_complete(host, tmp_path):
    hw, core, isa = host
    evaluator = HostMicroKernelEvaluator(repeats=3)
    with TileDb.open(tmp_path / "h.sqlite") as db:
        register_hardware(db, hw)
        tasks = plan_tasks(db, hw, [evaluator], ["gemm"], tiles=frozenset(
            (t.mr, t.nr) for t in some_tiles(core, isa, 2)))
        assert len(tasks) == 2
        summary = run_build(db, tasks, jobs=2, progress=None,
                            created_at=lambda: "2024-01-01T00:00:00Z")
        assert summary.evaluated == 2
        rows = db.rows("tile")
        for row in rows:
            check_record("tile", as_dict(row), "host row")
            assert row.source == "host" and row.origin == db.db_id and row.repeats == 3 and not row.emulated
            assert row.cycles_per_k > 0 and row.gflops > 0 and row.seconds > 0 and row.spread >= 0
            assert row.compiler.startswith("gcc ")
            conditions = json.loads(row.conditions)
            for key in ("governor", "freq_mhz_before", "temp_c_after", "throttled", "kc", "clock_ghz"):
                assert key in conditions
            assert conditions["kc"] * (row.cycles_per_k / (conditions["clock_ghz"] * 1e9)) > 0
    score = evaluator.evaluate(tasks[0].tile, core, isa)   # the MicroTileEvaluator seam
    assert score.source == "host" and score.cycles_per_k > 0 and score.efficiency > 0


def test_kill_9_mid_build_then_resume_measures_nothing_twice(host, tmp_path):
    hw, core, isa = host
    tiles = some_tiles(core, isa, 5)
    spec = ",".join(f"{t.mr}x{t.nr}" for t in tiles)
    path = tmp_path / "k.sqlite"
    argv = [sys.executable, "-m", "xfc", "tiledb", "build", "--hw", "host", "--evaluators", "host", "--tiles", spec,
            "--db", str(path), "--quiet"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env())
    deadline = time.monotonic() + 240
    present = 0
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists():
            with TileDb.open(path, readonly=True) as db:
                present = db.count("tile")
            if present >= 2:
                break
        time.sleep(0.05)
    assert proc.poll() is None, "the build finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    with TileDb.open(path, readonly=True) as db:
        before = {r.params: r for r in db.rows("tile")}
        claims = db.count("claim")
    assert 2 <= len(before) < len(tiles)
    for row in before.values():                       # whole rows only
        check_record("tile", as_dict(row), "row before the kill")
    assert claims <= 1                                 # at most the task in flight
    rerun = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env())
    assert rerun.returncode == 0, rerun.stderr
    assert f"{len(tiles) - len(before)} evaluated, {len(before)} already present" in rerun.stdout, rerun.stdout
    with TileDb.open(path, readonly=True) as db:
        after = {r.params: r for r in db.rows("tile")}
        assert db.count("claim") == 0
    assert set(after) == {tile_params(t) for t in tiles}
    for params, row in before.items():
        assert after[params] == row                    # measured once, never again


def test_synthesis_from_measured_rows_builds_and_verifies(host, tmp_path):
    hw, core, isa = host
    specs = [make_spec("matmul", dict(m=37, n=53, k=71), bias=True, activation="relu"),
             make_spec("matmul", dict(m=64, n=130, k=300)),
             make_spec("conv2d", dict(c=5, h=13, w=11, k=19, r=3, s=3), stride=2, pad=1, bias=True)]
    favourites = {(s.plan.gemm.mr, s.plan.gemm.nr) for s in (synthesize_cpu(sp, hw, threads=1) for sp in specs)}
    evaluator = HostMicroKernelEvaluator(repeats=3)
    path = tmp_path / "s.sqlite"
    with TileDb.open(path) as db:
        register_hardware(db, hw)
        tasks = plan_tasks(db, hw, [evaluator], ["gemm"], tiles=frozenset(favourites))
        run_build(db, tasks, jobs=2, progress=None, created_at=lambda: "2024-01-01T00:00:00Z")
        measured = {(t.tile.mr, t.tile.nr) for t in tasks}
    warnings = []
    db = open_for_synthesis(path, warnings.append)
    for index, spec in enumerate(specs):
        ev = TileDbEvaluator(db, hw, warn=warnings.append)
        result = synthesize_cpu(spec, hw, threads=1, evaluator=ev)
        chosen = (result.plan.gemm.mr, result.plan.gemm.nr)
        assert result.micro_tile_source == ("tile_db:host" if chosen in measured else "static")
        kernel = host_kernel(render_cpu_kernel(result.plan), tmp_path / f"k{index}")
        a, b, bias = make_inputs(spec, seed=index)
        out = kernel(a, b, bias)
        ok, max_err, ratio = check_output(spec, out, a, b, bias)
        assert ok, f"{spec.describe()}: error {max_err:.3g} ({ratio:.3g}x the bound)"
    db.close()
    assert warnings == []


def test_probe_is_plausible_cached_and_remeasured(tmp_path, monkeypatch):
    environ = {"XFC_CACHE_DIR": str(tmp_path)}
    # the load average as a busy machine's: a probe measured while busy is then still served from the
    # cache (measured again only once the machine is quiet: tests/test_probe_busy.py)
    monkeypatch.setattr(probe_module.hostcc, "load_average", lambda: 1e6)
    first = host_probe(environ)
    assert not first.cached
    assert 0.5 <= first.clock_ghz <= 6.0
    assert 1.0 <= first.fma_latency_cycles <= 12.0
    assert first.fma_per_cycle and all(bits in (128, 256, 512) for bits, _ in first.fma_per_cycle)
    for bits, rate in first.fma_per_cycle:
        assert 0.25 <= rate <= 4.0, (bits, rate)
    assert first.dram_read_gbps is not None and 0.5 <= first.dram_read_gbps <= 2000
    # one core's L3 read, where an L3 holds the probe's buffer: a plausible rate, below the 64 bytes
    # per cycle two 256-bit loads give
    from xfc.hardware.host import read_caches
    caches = read_caches()
    if probe_module.shared_cache_buffer_bytes(int(caches["L2"]["size_kib"] * 1024) if "L2" in caches else None,
                                              int(caches["L3"]["size_kib"] * 1024) if "L3" in caches else None):
        assert first.shared_cache_read_gbps is not None
        assert probe_module.MIN_DRAM_GBPS <= first.shared_cache_read_gbps <= 64 * first.clock_ghz
    else:
        assert first.shared_cache_read_gbps is None
    # every CPU against one reading a buffer past the L3: where there is an L3 and more than one CPU
    l3_bytes = int(caches["L3"]["size_kib"] * 1024) if "L3" in caches else None
    if probe_module.overflow_buffer_bytes(l3_bytes, probe_module.probe_cpus()):
        assert 1.0 <= first.l3_overflow_read_speedup <= probe_module.probe_cpus()
    else:
        assert first.l3_overflow_read_speedup is None
    second = host_probe(environ)
    assert second.cached and (second.clock_ghz, second.fma_per_cycle, second.dram_read_gbps,
                              second.shared_cache_read_gbps, second.l3_overflow_read_speedup) == \
        (first.clock_ghz, first.fma_per_cycle, first.dram_read_gbps, first.shared_cache_read_gbps,
         first.l3_overflow_read_speedup)
    with TileDb.open(tmp_path / "tile-db.sqlite", readonly=True) as db:
        rows = db.rows("calibration")
        # clock, FMA latency, DRAM and L3 read bandwidths, the past-L3 speedup (0: not measured), one
        # FMA rate per vector width
        assert len(rows) == 5 + len(first.fma_per_cycle)
        assert any(r.name == "dram_read_gbps" and r.unit == "GB/s" for r in rows)
        assert {r.subject for r in rows} == {f"cpu:{first.cpu_key}"} and {r.source for r in rows} == {"host"}
        assert {r.origin for r in rows} == {db.db_id}
    third = host_probe(environ, remeasure=True)
    assert not third.cached
    with TileDb.open(tmp_path / "tile-db.sqlite", readonly=True) as db:
        assert len(db.rows("calibration")) == 5 + len(first.fma_per_cycle)   # replaced, not added
    core = detect_host(measured=third.measurement()).cluster().core
    assert core.fma_per_cycle * 2 == int(core.fma_per_cycle * 2)


def test_host_operator_row_is_the_verified_synthesized_plan(host):
    from xfc.tiledb.operators import HostOperatorEvaluator, plan_json
    hw, core, isa = host
    spec = make_spec("conv2d", dict(c=6, h=15, w=13, k=10, r=3, s=3), pad=1, bias=True, activation="relu6")
    result = HostOperatorEvaluator(repeats=3).measure_operator(hw, hw.cluster(), spec, 1)
    assert result.plan == plan_json(synthesize_cpu(spec, hw, threads=1).plan)
    assert result.measured_s > 0 and result.predicted_s > 0 and result.repeats == 3
    assert result.conditions["threads"] == 1 and result.compiler.startswith("gcc ")


def test_a_wrong_micro_kernel_is_refused_not_timed(host, monkeypatch):
    from xfc.errors import VerificationError
    hw, core, isa = host
    tile = some_tiles(core, isa, 1)[0]
    real = HostMicroKernelEvaluator.kernel_source

    def broken(tile, isa, kc):   # B advances one float too far per k step: wrong sums
        source, march = real(tile, isa, kc)
        assert "bp += XFC_NR;" in source
        return source.replace("bp += XFC_NR;", "bp += XFC_NR + 1;"), march
    monkeypatch.setattr(HostMicroKernelEvaluator, "kernel_source", staticmethod(broken))
    with pytest.raises(VerificationError, match="mismatch"):
        HostMicroKernelEvaluator(repeats=2).measure(tile, hw.cluster(), isa)
