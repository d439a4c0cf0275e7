"""The device evaluator of the tile database (`xfc tiledb build --evaluators adb:SERIAL`) against the
virtual Snapdragon 865 through a real adb server: rows named adb:<serial> with their conditions and
the emulated flag, micro-kernel output checked against float64 numpy (a wrong kernel is refused),
emulated rows stored but never used by synthesis, a re-run measures nothing, and every device
problem is one line with exit 3 and no database written. No speed is asserted."""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from android_runner.testbed import free_port
from android_runner.virtual_device import Faults, VirtualDevice
from xfc.cpu.isa import isa_for
from xfc.cpu.synth import synthesize_cpu
from xfc.cpu.tiles import MicroTile, enumerate_micro_tiles
from xfc.errors import VerificationError, XfcError
from xfc.hardware.load import load
from xfc.ops.spec import make_spec
from xfc.runners.adb import AdbRunner
from xfc.runners.base import WHERE_VIRTUAL
from xfc.tiledb.build import OperatorTask, run_build
from xfc.tiledb.calibrate import calibrated_constants
from xfc.tiledb.device import DeviceEvaluator, check_micro_output
from xfc.tiledb.evaluators import TileDbEvaluator, tile_params
from xfc.tiledb.fingerprint import fingerprint, label
from xfc.tiledb.operators import best_operator, plan_json
from xfc.tiledb.records import as_dict, check_record
from xfc.tiledb.store import TileDb, timestamps

HAVE_ARM = bool(shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-gcc"))
pytestmark = [pytest.mark.adb, pytest.mark.skipif(not HAVE_ARM, reason="no qemu-aarch64 / aarch64 gcc")]

REPO = Path(__file__).resolve().parent.parent
XFC = [sys.executable, "-m", "xfc"]
HW = "snapdragon-865"
CLUSTER = "prime"
# A ragged matmul with a fused epilogue: the synthesized plan has row and column tails.
SPEC = make_spec("matmul", dict(m=19, n=23, k=17), bias=True, activation="relu")


def xfc(*args, timeout=300):
    env = {k: v for k, v in os.environ.items() if k != "XFC_DEBUG"}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([*XFC, *args], capture_output=True, text=True, timeout=timeout, env=env)


def one_line_error(proc, code: int) -> str:
    assert proc.returncode == code, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xfc: error: ") and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def sd865(server):
    dev = VirtualDevice(soc=HW).start()
    assert server.connect(dev.serial) == "device"
    yield dev
    server.disconnect(dev.serial)
    dev.stop()


@pytest.fixture(scope="module")
def hw():
    return load(HW)


@pytest.fixture(scope="module")
def chosen_tile(hw):
    """The micro-tile the static synthesizer picks for SPEC on the prime core: measuring it is what
    could change the plan, if emulated rows were (wrongly) used."""
    g = synthesize_cpu(SPEC, hw, CLUSTER, 1).plan.gemm
    return g.mr, g.nr


@pytest.fixture(scope="module")
def built(tmp_path_factory, server, sd865, hw, chosen_tile):
    """A database built by the CLI (two tile shapes) plus one small operator built in-process."""
    path = tmp_path_factory.mktemp("adb-db") / "tiles.sqlite"
    tiles = f"{chosen_tile[0]}x{chosen_tile[1]},4x8"
    proc = xfc("tiledb", "build", "--hw", HW, "--cluster", CLUSTER, "--evaluators", f"adb:{sd865.serial}",
               "--tiles", tiles, "--db", str(path), "--adb-port", str(server.port), "--quiet")
    assert proc.returncode == 0, proc.stderr
    runs_after_tiles = len(sd865.system.taskset_log)
    cluster = hw.cluster(CLUSTER)
    evaluator = DeviceEvaluator(AdbRunner(serial=sd865.serial, adb_port=server.port), repeats=3,
                                operator_repeats=2).attach(hw, [cluster])
    task = OperatorTask(fingerprint=fingerprint(hw, cluster), label=label(hw, cluster), hw=hw, cluster=cluster,
                        workload="mm_ragged", spec=SPEC, threads=1, source=evaluator.source,
                        origin="", evaluator=evaluator)
    with TileDb.open(path) as db:
        task = replace(task, origin=db.origin_for(evaluator.source))
        summary = run_build(db, [task], progress=None, created_at=timestamps({}))
    # two runs: the per-call entry point timed, the pre-packed one run once (both judged)
    assert summary.evaluated == 1 and evaluator.runs == 2
    return path, proc.stdout, runs_after_tiles, task


def test_rows_name_the_device_record_conditions_and_are_emulated(built, sd865, hw, chosen_tile):
    path, out, _, _ = built
    assert "evaluated, 0 already present" in out
    fp = fingerprint(hw, hw.cluster(CLUSTER))
    with TileDb.open(path, readonly=True) as db:
        rows, db_id = db.rows("tile"), db.db_id
        operators = db.rows("operator")
    shapes = {(json.loads(r.params)["mr"], json.loads(r.params)["nr_vectors"] * 4) for r in rows}
    assert shapes == {chosen_tile, (4, 8)} and len(rows) >= 2
    for r in rows:
        assert (r.source, r.origin, r.fingerprint, r.isa) == (f"adb:{sd865.serial}", db_id, fp, "neon")
        assert r.emulated is True and r.rank < 0
        assert r.cycles_per_k > 0 and r.seconds > 0 and r.gflops > 0 and r.repeats == 9 and r.spread >= 0
        assert r.compiler.startswith("aarch64-linux-gnu-gcc ")
        c = json.loads(r.conditions)
        assert c["emulated"] is True and c["where"] == WHERE_VIRTUAL and "never used to rank" in c["note"]
        # pinned to the prime cluster (CPU 7), with its governor, clocks and zones before and after
        assert c["cpu_ids"] == [7] and c["pinned"] == "taskset 80" and c["governor"] == c["governor_after"] == {"7": "schedutil"}
        assert set(c["freq_khz_before"]) == set(c["freq_khz_after"]) == set(c["max_freq_khz"]) == {"7"}
        assert c["temps_c_before"] and set(c["temps_c_after"]) == set(c["temps_c_before"])
        assert c["temp_c_max_after"] >= min(c["temps_c_after"].values())
        assert c["throttled"] is False and c["throttle_reasons"] == [] and "scaling_max_freq" in c["throttle_rule"]
        check_record("tile", as_dict(r), "tile row")
    # every run was pinned to CPU 7 (the virtual device records taskset masks)
    assert sd865.system.taskset_log and all(entry[0] == "80" for entry in sd865.system.taskset_log)
    [op] = operators
    assert op.source == f"adb:{sd865.serial}" and op.emulated and op.measured_s > 0 and op.repeats == 2
    assert op.plan == plan_json(synthesize_cpu(SPEC, hw, CLUSTER, 1).plan)
    assert json.loads(op.conditions)["emulated"] is True
    assert xfc("tiledb", "verify", "--db", str(path)).returncode == 0


def test_emulated_rows_never_rank_nor_calibrate_and_show_says_so(built, sd865, hw, tmp_path, chosen_tile):
    path, _, _, task = built
    cluster = hw.cluster(CLUSTER)
    with TileDb.open(path, readonly=True) as db:
        # the operator row is there, but a lookup never takes an emulated one
        assert best_operator(db, task.fingerprint, SPEC.key(), CLUSTER, 1) is None
        assert calibrated_constants(db, hw, cluster) is None
        evaluator = TileDbEvaluator(db, hw, CLUSTER)
        with_db = synthesize_cpu(SPEC, hw, CLUSTER, 1, evaluator=evaluator)
    without = synthesize_cpu(SPEC, hw, CLUSTER, 1)
    assert with_db.plan == without.plan and with_db.estimate == without.estimate
    assert with_db.micro_tile_source == "static" and with_db.explain() == without.explain()
    [note] = evaluator.notes
    assert f"emulated micro-tile rows for {HW}:{CLUSTER}" in note and f"from adb:{sd865.serial}" in note
    assert "never rank tiles" in note
    # The same rows marked as real measurements would answer: what the flag alone prevents.
    real = tmp_path / "real.sqlite"
    shutil.copy(path, real)
    with sqlite3.connect(real) as conn:
        conn.execute("UPDATE tile SET emulated = 0")
    with TileDb.open(real, readonly=True) as db:
        tile = tile_of(hw, chosen_tile)
        score = TileDbEvaluator(db, hw, CLUSTER).evaluate(tile, cluster.core, "neon")
        assert score.source == f"tile_db:adb:{sd865.serial}"
    # The command line says it too.
    synth = xfc("synth", "matmul", "--hw", HW, "--cluster", CLUSTER, "--threads", "1", "--shape", "m=19,n=23,k=17",
                "--bias", "--activation", "relu", "--tile-db", str(path), "--explain", "-o", str(tmp_path / "out"))
    assert synth.returncode == 0, synth.stderr
    explain = synth.stdout.split("\n\n")[0]
    assert "micro-tile score" in explain and "cycles/k step, static)" in explain
    assert f"note: tile db {path}: emulated micro-tile rows" in explain and "never rank tiles" in explain
    assert "micro-tiles from" not in synth.stdout     # the summary names no database source either
    show = xfc("tiledb", "show", "--db", str(path))
    assert show.returncode == 0 and f"adb:{sd865.serial} (emulated)" in show.stdout
    stats = xfc("tiledb", "stats", "--db", str(path), "--json")
    data = json.loads(stats.stdout)
    assert data["measured_hardware"] == [] and data["emulated_only_hardware"] == [f"{HW}:{CLUSTER}"]
    assert "never used to rank" in xfc("tiledb", "stats", "--db", str(path)).stdout


def tile_of(hw, shape):
    """The (first, widest A load) micro-tile of this MR x NR on the prime core."""
    core = hw.cluster(CLUSTER).core
    return next(t for t in enumerate_micro_tiles(core, isa_for(core)) if (t.mr, t.nr) == shape)


def test_second_build_measures_nothing(built, server, sd865, chosen_tile):
    path, _, runs_before, _ = built
    with TileDb.open(path, readonly=True) as db:
        rows = db.rows("tile")
    runs = len(sd865.system.taskset_log)
    proc = xfc("tiledb", "build", "--hw", HW, "--cluster", CLUSTER, "--evaluators", f"adb:{sd865.serial}",
               "--tiles", f"{chosen_tile[0]}x{chosen_tile[1]},4x8", "--db", str(path), "--adb-port",
               str(server.port), "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert f"{len(rows)} task(s) for {HW}: 0 evaluated, {len(rows)} already present" in proc.stdout
    assert len(sd865.system.taskset_log) == runs and runs > runs_before   # no run on the device at all
    with TileDb.open(path, readonly=True) as db:
        assert db.rows("tile") == rows


def test_a_wrong_micro_kernel_is_refused_not_stored(server, sd865, hw, monkeypatch):
    cluster = hw.cluster(CLUSTER)
    real = DeviceEvaluator.kernel_source

    def broken(tile, core, isa, kc):   # B advances one float too far per k step: wrong sums
        source = real(tile, core, isa, kc)
        assert "bp += XFC_NR;" in source
        return source.replace("bp += XFC_NR;", "bp += XFC_NR + 1;")
    monkeypatch.setattr(DeviceEvaluator, "kernel_source", staticmethod(broken))
    evaluator = DeviceEvaluator(AdbRunner(serial=sd865.serial, adb_port=server.port), repeats=2).attach(hw, [cluster])
    tile = tile_of(hw, (4, 8))
    with pytest.raises(VerificationError, match="row .* column .* expected"):
        evaluator.measure(tile, cluster, "neon")


def test_check_micro_output_catches_one_wrong_value():
    tile = MicroTile(mr=3, nr_vectors=2, lanes=4, a_load_bits=128)
    rng = np.random.default_rng(1)
    a, b = rng.uniform(-1, 1, (40, 3)).astype(np.float32), rng.uniform(-1, 1, (40, 8)).astype(np.float32)
    out = (a.T @ b).astype(np.float32)
    check_micro_output(tile, a, b, out, "exact")
    out[2, 5] += 1e-3
    with pytest.raises(VerificationError, match="row 2 column 5"):
        check_micro_output(tile, a, b, out, "one off")


def test_a_capped_clock_is_throttling_and_conditions_fit_a_row():
    from xfc.runners.base import Measurement
    from xfc.tiledb.device import DeviceEvaluator, cpufreq_paths, run_conditions
    zones = {f"thermal_zone{i}": 30.0 + i for i in range(40)}          # phones have dozens of zones
    m = Measurement.from_samples([1e-3, 2e-3], where="adb:X (phone)", emulated=False, freq_before={4: 2_000_000},
                                 freq_after={4: 2_000_000}, temps_before=zones, temps_after=zones)
    before = dict(zip(cpufreq_paths((4,), ("scaling_governor", "cpuinfo_max_freq")), ("performance", "2400000")))
    capped = dict(zip(cpufreq_paths((4,), ("scaling_governor", "scaling_max_freq")), ("performance", "1800000")))
    c = run_conditions(m, (4,), before, capped, (False, []), "X", "phone")
    assert c["throttled"] is True and c["throttle_reasons"] == ["cpu4 capped at 1800000 kHz below its 2400000 kHz maximum"]
    assert c["emulated"] is False and "note" not in c and c["pinned"] == "taskset 10"
    assert list(c["temps_c_after"]) == [f"thermal_zone{i}" for i in range(28, 40)] and c["temp_c_max_after"] == 69.0
    at_max = dict(capped, **{cpufreq_paths((4,), ("scaling_max_freq",))[0]: "2400000"})
    assert run_conditions(m, (4,), before, at_max, (False, []), "X", "phone")["throttled"] is False
    assert run_conditions(m, (4,), {}, {}, (None, ["no readings: throttling unknown"]), "X", "phone")["throttled"] is None
    long = {**c, "throttle_reasons": ["x" * 300] * 20}
    fitted = DeviceEvaluator._fit(long)
    assert len(json.dumps(fitted, separators=(",", ":"))) <= 4096 and "temps_c_after" not in fitted


def test_throttling_is_flagged(server, hw):
    dev = VirtualDevice(soc=HW, faults=Faults(throttle=True)).start()
    try:
        assert server.connect(dev.serial) == "device"
        cluster = hw.cluster(CLUSTER)
        evaluator = DeviceEvaluator(AdbRunner(serial=dev.serial, adb_port=server.port), repeats=2).attach(hw, [cluster])
        tile = tile_of(hw, (4, 8))
        c = evaluator.measure(tile, cluster, "neon").conditions
        with pytest.raises(XfcError, match="emulated: its timings never rank tiles"):
            evaluator.evaluate(tile, cluster.core, "neon")    # a live score from the virtual device: refused
        assert c["throttled"] is True and c["freq_khz_after"]["7"] < c["freq_khz_before"]["7"]
        assert any("clock dropped" in r for r in c["throttle_reasons"])
    finally:
        server.disconnect(dev.serial)
        dev.stop()


def test_device_problems_are_one_line_exit_3_and_write_nothing(server, sd865, tmp_path):
    db = tmp_path / "never.sqlite"
    base = ["tiledb", "build", "--cluster", CLUSTER, "--tiles", "4x8", "--db", str(db)]
    no_server = xfc(*base, "--hw", HW, "--evaluators", "adb", "--adb-port", str(free_port()), "--no-start-server")
    assert "no adb server reachable" in one_line_error(no_server, 3)
    missing = xfc(*base, "--hw", HW, "--evaluators", "adb:127.0.0.1:1", "--adb-port", str(server.port))
    assert "device '127.0.0.1:1' not found" in one_line_error(missing, 3)
    other = xfc(*base, "--hw", "snapdragon-888", "--evaluators", f"adb:{sd865.serial}", "--adb-port", str(server.port))
    line = one_line_error(other, 3)
    assert f"device {sd865.serial} is {HW}" in line and "not snapdragon-888" in line and f"--hw {HW}" in line
    locked = VirtualDevice(soc=HW, faults=Faults(unauthorized=True)).start()
    try:
        assert server.connect(locked.serial, want_state="unauthorized") == "unauthorized"
        refused = xfc(*base, "--hw", HW, "--evaluators", f"adb:{locked.serial}", "--adb-port", str(server.port))
        assert "is unauthorized" in one_line_error(refused, 3)
    finally:
        server.disconnect(locked.serial)
        locked.stop()
    assert list(tmp_path.iterdir()) == []
