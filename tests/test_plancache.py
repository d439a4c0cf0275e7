"""Warm synthesis (issue 11): the operator table as a plan cache (xfc/tiledb/plancache.py).

A recorded plan read back must equal the synthesized one for every suite workload, on the host
(a recorded x86-64 host and this machine's description) and on a shipped ARM core; an altered or
unreadable row is ignored with one warning line and synthesized again; other inputs (constants,
the description) make a row stale. No timing here: benchmarks/synth_time.py times it."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from dataclasses import replace

import pytest

from xfc.hardware.host import X86_64_V4_FLAGS
from xfc.cpu.cost_model import DEFAULT_CONSTANTS
from xfc.cpu.synth import synthesize_cpu
from xfc.hardware import load
from xfc.hardware.host import HostMeasurement, describe_host
from xfc.ops.workloads import SUITE, suite_spec
from xfc.tiledb import plancache
from xfc.tiledb.fingerprint import fingerprint
from xfc.tiledb.plancache import PlanCache, cached_synthesis, payload_digest

FACTS = {"flags": set(X86_64_V4_FLAGS), "model name": "Recorded CPU", "cpu MHz": "3000.000"}
RECORDED_HOST = describe_host(FACTS, {"L3": {"size_kib": 32768, "line_bytes": 64, "ways": 16, "shared_by_cores": 2}},
                              2, "x86_64", measured=HostMeasurement(3.0, ((256, 2.0), (512, 1.0)), 4.0,
                                                                    "2026-01-01T00:00:00Z", True))


def _synth(cache, spec, hw, threads, constants=DEFAULT_CONSTANTS):
    return cached_synthesis(cache, spec, hw, fingerprint=fingerprint(hw, hw.cluster()), tile_state="none",
                            threads=threads, constants=constants)


def _no_enumeration(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a cache hit must not run synthesis")
    monkeypatch.setattr(plancache, "synthesize_cpu", refuse)


@pytest.mark.unit
@pytest.mark.parametrize("hw_name", ["recorded-host", "cortex-a76"])
def test_every_suite_plan_reads_back_identical(tmp_path, monkeypatch, hw_name):
    hw = RECORDED_HOST if hw_name == "recorded-host" else load(hw_name)
    db = tmp_path / "cache.sqlite"
    warnings: list[str] = []
    requests = [(suite_spec(name), t) for name in SUITE for t in sorted({1, hw.cluster().count})]
    cold = {}
    cache = PlanCache(db, warnings.append).prepare()
    for spec, t in requests:
        cold[spec.key(), t] = _synth(cache, spec, hw, t)
        assert cache.status == "miss"
        assert cold[spec.key(), t] == synthesize_cpu(spec, hw, None, t)   # the cache changes nothing
    cache.close()
    _no_enumeration(monkeypatch)
    cache = PlanCache(db, warnings.append).prepare()
    for spec, t in requests:
        warm = _synth(cache, spec, hw, t)
        assert cache.status == "hit"
        assert warm.plan == cold[spec.key(), t].plan        # dataclass equality, every field
        assert warm == cold[spec.key(), t]                  # levels, estimate, runners-up too
        assert warm.explain() == cold[spec.key(), t].explain() and warm.report() == cold[spec.key(), t].report()
    cache.close()
    assert warnings == []


@pytest.mark.unit
def test_this_hosts_description_reads_back_identical(tmp_path):
    from xfc.tiledb.hostdesc import load_hardware
    hw = load_hardware("host", {**os.environ, "XFC_CACHE_DIR": str(tmp_path / "probe"), "XFC_HOST_PROBE": "off"})
    for name in SUITE:
        spec = suite_spec(name)
        cache = PlanCache(tmp_path / "c.sqlite", lambda m: None).prepare()
        cold = _synth(cache, spec, hw, 1)
        cache.close()
        cache = PlanCache(tmp_path / "c.sqlite", lambda m: None).prepare()
        assert _synth(cache, spec, hw, 1).plan == cold.plan and cache.status == "hit"
        cache.close()


def _rewrite_plan(db, mutate, keep_checksum: bool) -> None:
    conn = sqlite3.connect(db)
    (rowid, plan, conditions), = conn.execute("SELECT id, plan, conditions FROM operator WHERE source = 'synth'")
    new_plan = mutate(plan)
    cond = json.loads(conditions)
    if keep_checksum:
        cond["payload"] = payload_digest(new_plan)
    conn.execute("UPDATE operator SET plan = ?, conditions = ? WHERE id = ?",
                 (new_plan, json.dumps(cond, sort_keys=True, separators=(",", ":")), rowid))
    conn.commit()
    conn.close()


@pytest.mark.unit
@pytest.mark.parametrize("damage", ["tampered", "garbage", "wrong-shape"])
def test_an_altered_row_is_ignored_with_one_warning_then_synthesized_and_replaced(tmp_path, damage):
    hw = load("cortex-a76")
    spec = suite_spec("conv_s2")
    db = tmp_path / "cache.sqlite"
    cache = PlanCache(db, lambda m: None).prepare()
    cold = _synth(cache, spec, hw, 1)
    cache.close()
    if damage == "tampered":       # a tile size edited by hand: the checksum no longer matches
        _rewrite_plan(db, lambda p: p.replace('"mr":', '"mr":1', 1), keep_checksum=False)
    elif damage == "garbage":      # not JSON, checksum made to match
        _rewrite_plan(db, lambda p: "{not json", keep_checksum=True)
    else:                          # JSON of the wrong shape, checksum made to match
        _rewrite_plan(db, lambda p: json.dumps({"plan": {"isa": 7}}), keep_checksum=True)
    warnings: list[str] = []
    cache = PlanCache(db, warnings.append).prepare()
    again = _synth(cache, spec, hw, 1)
    assert cache.status == "ignored" and again.plan == cold.plan
    assert len(warnings) == 1 and str(db) in warnings[0] and spec.key() in warnings[0]
    cache.close()                  # the row is written again
    cache = PlanCache(db, warnings.append).prepare()
    assert _synth(cache, spec, hw, 1).plan == cold.plan and cache.status == "hit"
    cache.close()
    assert len(warnings) == 1


@pytest.mark.unit
def test_other_constants_or_an_edited_description_do_not_answer(tmp_path):
    hw = load("cortex-a76")
    spec = suite_spec("dw_mbv2_s1")
    db = tmp_path / "cache.sqlite"
    cache = PlanCache(db, lambda m: None).prepare()
    _synth(cache, spec, hw, 1)
    cache.close()
    cache = PlanCache(db, lambda m: None).prepare()
    calibrated = replace(DEFAULT_CONSTANTS, depthwise_efficiency=0.5)
    result = _synth(cache, spec, hw, 1, constants=calibrated)
    assert cache.status == "stale"
    assert result.estimate == synthesize_cpu(spec, hw, None, 1, constants=calibrated).estimate
    cluster = hw.clusters[0]
    edited = replace(hw, clusters=(replace(cluster, clock_ghz=cluster.clock_ghz + 0.1),))
    assert _synth(cache, spec, edited, 1).plan == synthesize_cpu(spec, edited, None, 1).plan
    assert cache.status == "miss"          # another fingerprint: no row
    cache.close()


@pytest.mark.unit
def test_an_unusable_cache_file_costs_one_warning(tmp_path):
    db = tmp_path / "cache.sqlite"
    db.write_bytes(b"not a database" * 50)
    warnings: list[str] = []
    cache = PlanCache(db, warnings.append).prepare()
    hw = load("cortex-a76")
    for name in ("mm_512", "conv_pw"):
        assert _synth(cache, suite_spec(name), hw, 1).plan == synthesize_cpu(suite_spec(name), hw, None, 1).plan
        assert cache.status == "unavailable"
    cache.close()
    assert len(warnings) == 1 and str(db) in warnings[0]
    assert db.read_bytes() == b"not a database" * 50      # never replaced


@pytest.mark.host
def test_synth_twice_is_a_lookup_the_second_time_and_still_verifies(tmp_path):
    env = {**os.environ, "XFC_CACHE_DIR": str(tmp_path / "cache")}
    argv = [sys.executable, "-m", "xfc", "synth", "depthwise", "--hw", "host", "--shape", "c=19,h=23,w=17,r=3,s=3",
            "--pad", "1", "--stride", "2", "--threads", "1", "--verify", "--json"]
    reports = []
    for run in range(2):
        proc = subprocess.run([*argv, "-o", str(tmp_path / f"out{run}")], capture_output=True, text=True, env=env,
                              timeout=600)
        assert proc.returncode == 0, proc.stderr
        reports.append(json.loads(proc.stdout))
    assert [r["tile_db"]["plan_cache"]["status"] for r in reports] == ["miss", "hit"]
    assert all(r["verified"] is True for r in reports)
    assert reports[0]["tiles"] == reports[1]["tiles"] and reports[0]["code_shape"] == reports[1]["code_shape"]
    kernels = [(tmp_path / f"out{run}" / "xfc_depthwise.c").read_text() for run in range(2)]
    assert kernels[0] == kernels[1]


@pytest.mark.unit
def test_recorded_plans_name_their_hardware_so_gc_finds_stale_ones(tmp_path):
    from xfc.tiledb.store import TileDb
    hw = load("cortex-a76")
    db = tmp_path / "cache.sqlite"
    cache = PlanCache(db, lambda m: None).prepare()
    _synth(cache, suite_spec("conv_pw"), hw, 1)
    cache.close()
    with TileDb.open(db, readonly=True) as handle:
        assert handle.labels() == {fingerprint(hw, hw.cluster()): [f"{hw.name}:{hw.cluster().role}"]}
        (row,) = handle.rows("operator")
    assert row.source == "synth" and row.origin == "" and row.measured_s is None
    assert row.predicted_s == synthesize_cpu(suite_spec("conv_pw"), hw, None, 1).estimate.predicted_s


@pytest.mark.unit
def test_recorded_plans_pass_the_import_checks_and_answer_from_a_merged_copy(tmp_path):
    from xfc.tiledb.exchange import merge_records, read_export_file, write_export
    from xfc.tiledb.store import TileDb
    hw = load("cortex-a76")
    cache = PlanCache(tmp_path / "a.sqlite", lambda m: None).prepare()
    cold = _synth(cache, suite_spec("mm_bert"), hw, 1)
    cache.close()
    with TileDb.open(tmp_path / "a.sqlite", readonly=True) as handle:
        write_export(handle, tmp_path / "a.jsonl")
    records = read_export_file(tmp_path / "a.jsonl")        # every field checked as for foreign data
    with TileDb.open(tmp_path / "b.sqlite") as handle:
        merge_records(handle, records)
    cache = PlanCache(tmp_path / "b.sqlite", lambda m: None).prepare()
    assert _synth(cache, suite_spec("mm_bert"), hw, 1).plan == cold.plan and cache.status == "hit"
    cache.close()
