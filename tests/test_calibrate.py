"""Calibration of the CPU cost model (issue 11 part 5): the fitter, the stored constants, the CLI."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import pytest

from xfc.cpu.cost_model import DEFAULT_CONSTANTS, CostConstants
from xfc.cpu.synth import synthesize_cpu
from xfc.ops.spec import DepthwiseSpec, MatmulSpec
from xfc.hardware.host import describe_host
from xfc.tiledb.calibrate import (GRIDS, Measured, calibrated_constants, fit, predicted_s, store_fit,
                                  training_specs)
from xfc.tiledb.store import TileDb

from support.calibration import CLUSTER, FACTS, HW


def _synthetic(truth: CostConstants, threads=(1, 2)) -> list[Measured]:
    """'Measurements' that are the model's own predictions under known constants."""
    items = []
    for spec in training_specs():
        for t in threads:
            plan = synthesize_cpu(spec, HW, CLUSTER.role, t).plan
            item = Measured(spec=spec, threads=t, plan=plan, measured_s=1.0, spread=0.0)
            items.append(replace(item, measured_s=predicted_s(item, HW, CLUSTER, truth)))
    return items


@pytest.mark.unit
def test_re_estimating_a_plan_reproduces_the_synthesizers_estimate():
    for spec in training_specs():
        result = synthesize_cpu(spec, HW, CLUSTER.role, 2)
        item = Measured(spec=spec, threads=2, plan=result.plan, measured_s=1.0, spread=0.0)
        assert predicted_s(item, HW, CLUSTER, DEFAULT_CONSTANTS) == pytest.approx(result.estimate.predicted_s, rel=1e-12)


@pytest.mark.unit
def test_the_fit_recovers_known_constants_from_their_predictions():
    truth = replace(DEFAULT_CONSTANTS, compute_efficiency=0.8, pack_rate_scale=0.5, depthwise_efficiency=0.6,
                    parallel_region_s=8e-6)
    for field, value in truth.as_dict().items():
        if field in GRIDS:                        # reachable, so an exact recovery is possible
            assert value in GRIDS[field], field
        else:                                     # not fitted: the truth keeps the static value
            assert value == getattr(DEFAULT_CONSTANTS, field), field
    items = _synthetic(truth)
    result = fit(items, HW, CLUSTER)
    assert result.error_before > 0.15            # the static constants are visibly wrong for this 'machine'
    assert result.error_after < 0.01 and result.worst_after < 0.03
    assert result.constants.compute_efficiency == pytest.approx(0.8)
    assert fit(items, HW, CLUSTER) == result     # deterministic


@pytest.mark.unit
def test_a_fit_to_the_static_model_changes_nothing():
    items = _synthetic(DEFAULT_CONSTANTS)
    result = fit(items, HW, CLUSTER)
    assert result.constants == DEFAULT_CONSTANTS and result.error_after == pytest.approx(0.0, abs=1e-12)


@pytest.mark.host
def test_stored_constants_round_trip_and_follow_the_fingerprint(tmp_path):
    truth = replace(DEFAULT_CONSTANTS, compute_efficiency=0.9, depthwise_stage_scale=1.4)
    result = fit(_synthetic(truth, threads=(1,)), HW, CLUSTER)
    with TileDb.open(tmp_path / "db.sqlite") as db:
        assert calibrated_constants(db, HW, CLUSTER) is None
        store_fit(db, HW, CLUSTER, result, (1,))
        assert calibrated_constants(db, HW, CLUSTER) == result.constants
        other = describe_host(FACTS, {}, 2, "x86_64")           # another description: other fingerprint
        assert calibrated_constants(db, other, other.cluster()) is None


def _xfc(*args, tmp_path):
    env = {**os.environ, "XFC_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, "-m", "xfc", *args], capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.subprocess
def test_calibrate_refuses_hardware_it_cannot_measure(tmp_path):
    proc = _xfc("tiledb", "calibrate", "--hw", "snapdragon-865", "--db", str(tmp_path / "x.sqlite"), tmp_path=tmp_path)
    assert proc.returncode == 2 and "only the host can be measured here" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "x.sqlite").exists()
    proc = _xfc("tiledb", "calibrate", "--threads", "0", "--db", str(tmp_path / "x.sqlite"), tmp_path=tmp_path)
    assert proc.returncode == 2 and "--threads 0" in proc.stderr


@pytest.mark.host
def test_calibrate_on_the_host_times_fits_and_stores(tmp_path, monkeypatch, capsys):
    """The command end to end (in this process) on a few of its training operators: a matmul, a
    depthwise and one Winograd layer's direct plan and Winograd plans. The whole set is ~60 builds and
    timings, over a minute on a 2-vCPU host (what `xfc tiledb calibrate` runs); the fit over it is
    tested on the model's own predictions above."""
    from xfc.cli.main import main
    from xfc.tiledb import calibrate
    cases = calibrate.training_cases()
    winograd_layer = next(c.spec for c in cases if c.lowering == "winograd")
    few = [next(c for c in cases if isinstance(c.spec, MatmulSpec)),
           next(c for c in cases if isinstance(c.spec, DepthwiseSpec))] + [c for c in cases if c.spec == winograd_layer]
    monkeypatch.setattr(calibrate, "training_cases", lambda winograd=True: few if winograd else few[:2])
    db, saved = tmp_path / "cal.sqlite", tmp_path / "measured.json"
    assert main(["tiledb", "calibrate", "--threads", "1", "--repeats", "3", "--quiet", "--db", str(db),
                 "--winograd", "--save-measurements", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "mean |error|" in out and "fitted: compute_efficiency=" in out and f"({len(few)} timed operators" in out
    assert out.count("depthwise N=1") == 1 and out.count("matmul M=") == 1
    assert out.count("winograd m=") == len(few) - 3 >= 1
    with TileDb.open(db, readonly=True) as handle:
        names = {r.name for r in handle.rows("calibration") if r.name.startswith("cost.")}
    assert names == {f"cost.{k}" for k in DEFAULT_CONSTANTS.as_dict()}
    # refit from the saved measurements, timing nothing, into a database that does not exist: the same
    # fit (no stored start there), and --dry-run creates nothing
    fresh = tmp_path / "fresh.sqlite"
    assert main(["tiledb", "calibrate", "--winograd", "--from-measurements", str(saved), "--dry-run",
                 "--db", str(fresh)]) == 0
    refit = capsys.readouterr().out
    assert not fresh.exists() and "--dry-run: nothing stored" in refit and "timed nothing" in refit
    fitted = [line for line in out.splitlines() if line.startswith("fitted:")]
    assert fitted and fitted == [line for line in refit.splitlines() if line.startswith("fitted:")]
    # without --winograd the same file fits the direct plans' constants and leaves the Winograd ones static
    assert main(["tiledb", "calibrate", "--from-measurements", str(saved), "--dry-run", "--db", str(fresh)]) == 0
    direct_only = capsys.readouterr().out
    assert "Winograd constants: static" in direct_only
    values = dict(item.split("=") for item in next(line for line in direct_only.splitlines()
                                                   if line.startswith("fitted:"))[len("fitted: "):].split(", "))
    assert all(float(values[f]) == getattr(DEFAULT_CONSTANTS, f) for f in values if f.startswith("winograd_"))
    # the file is xfc's own: written again in place; a file xfc did not write is refused before any timing
    foreign = tmp_path / "notes.json"
    foreign.write_text('{"mine": true}')
    assert main(["tiledb", "calibrate", "--save-measurements", str(foreign), "--db", str(db)]) == 2
    assert foreign.read_text() == '{"mine": true}' and "not written by xfc" in capsys.readouterr().err


@pytest.mark.host
def test_synth_reads_calibrated_constants_from_the_tile_db_and_survives_a_broken_one(tmp_path):
    """--tile-db auto picks up this machine's calibration (per-user database); off ignores it; a
    corrupt database costs one warning line and the static model. Every kernel still verifies."""
    import json
    from xfc.tiledb.hostdesc import load_hardware
    env_cache = tmp_path / "cache"
    environ = {**os.environ, "XFC_CACHE_DIR": str(env_cache)}
    hw = load_hardware("host", environ)          # probes once and caches, as the CLI will read it
    cluster = hw.cluster()
    truth = replace(DEFAULT_CONSTANTS, depthwise_efficiency=0.3, dram_efficiency=4.0)
    items = []
    for spec in training_specs()[-4:]:
        plan = synthesize_cpu(spec, hw, cluster.role, 1).plan
        item = Measured(spec=spec, threads=1, plan=plan, measured_s=1.0, spread=0.0)
        items.append(replace(item, measured_s=predicted_s(item, hw, cluster, truth)))
    with TileDb.open(env_cache / "tile-db.sqlite") as db:
        store_fit(db, hw, cluster, fit(items, hw, cluster), (1,))
    argv = ["synth", "depthwise", "--hw", "host", "--shape", "c=19,h=23,w=17,r=3,s=3", "--pad", "1",
            "--threads", "1", "--verify", "--json"]
    reports = {}
    for choice in ("auto", "off"):
        proc = _xfc(*argv, "--tile-db", choice, "-o", str(tmp_path / choice), tmp_path=tmp_path)
        assert proc.returncode == 0, proc.stderr
        reports[choice] = json.loads(proc.stdout)
        assert reports[choice]["verified"] is True
    assert reports["auto"]["tile_db"]["constants"] == "calibrated"
    assert reports["off"]["tile_db"]["constants"] == "static"
    assert reports["auto"]["predicted_seconds"] != reports["off"]["predicted_seconds"]
    broken = tmp_path / "broken.sqlite"      # an SQLite header, then garbage: a damaged database warns
    broken.write_bytes(b"SQLite format 3\x00" + b"this is not a database" * 100)
    proc = _xfc(*argv, "--tile-db", str(broken), "-o", str(tmp_path / "broken-out"), tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and str(broken) in warnings[0] and "static model" in warnings[0]
    assert json.loads(proc.stdout)["verified"] is True and "Traceback" not in proc.stderr
    # `calibrate --forget` removes this machine's fitted constants (measuring nothing): auto is static again
    proc = _xfc("tiledb", "calibrate", "--forget", tmp_path=tmp_path)
    n_constants = len(DEFAULT_CONSTANTS.as_dict())
    assert proc.returncode == 0 and f"removed {n_constants} fitted constants of host" in proc.stdout, proc.stderr
    with TileDb.open(env_cache / "tile-db.sqlite", readonly=True) as db:
        assert calibrated_constants(db, hw, cluster) is None
    proc = _xfc(*argv, "--tile-db", "auto", "-o", str(tmp_path / "forgotten"), tmp_path=tmp_path)
    assert proc.returncode == 0 and json.loads(proc.stdout)["tile_db"]["constants"] == "static", proc.stderr
    proc = _xfc("tiledb", "calibrate", "--forget", tmp_path=tmp_path)
    assert proc.returncode == 0 and "nothing removed" in proc.stdout
