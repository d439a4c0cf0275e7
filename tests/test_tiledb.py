"""The tile database without a compiler: schema and versions, refusing files that are not ours,
fingerprints, the static build, ranking of sources, export / import / merge with provenance,
concurrent builders in two processes, and the CLI's one-line errors."""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from xfc.hardware.host import X86_64_V4_FLAGS
from xfc.errors import OperatorError, XfcError
from xfc.hardware.load import load, validate_file
from xfc.ops.spec import make_spec
from xfc.cpu.cost_model import StaticEvaluator
from xfc.cpu.tiles import enumerate_micro_tiles
from xfc.cpu.isa import isa_for
from xfc.cpu.synth import synthesize_cpu
from xfc.tiledb import schema
from xfc.tiledb.build import plan_tasks, register_hardware, run_build
from xfc.tiledb.evaluators import StaticDbEvaluator, TileDbEvaluator, open_for_synthesis, tile_params
from xfc.tiledb.exchange import export_lines, merge_records, read_export_file, rows_of_database, write_export
from xfc.tiledb.fingerprint import cluster_facts, fingerprint
from xfc.tiledb.records import RecordError, TileRow, as_dict, canonical_json, check_record
from xfc.tiledb.store import TileDb, TileDbError, best_of, insert_row

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent
CORES = REPO / "hardware_descriptions" / "cpu"
FIXED = "2024-01-02T03:04:05Z"


def stamp() -> str:
    return FIXED


def run_xfc(*args, cwd=None, env_extra=None, timeout=300):
    env = {k: v for k, v in os.environ.items() if k != "XFC_DEBUG"}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "xfc", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd, env=env)


def assert_one_line_error(proc, contains: str, code: int = 2):
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("xfc: error")]
    assert len(errors) == 1, proc.stderr
    assert contains in errors[0], errors[0]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def static_build(db: TileDb, hw, cluster=None) -> int:
    ev = StaticDbEvaluator()
    register_hardware(db, hw, cluster)
    tasks = plan_tasks(db, hw, [ev], ["gemm"], cluster)
    return run_build(db, tasks, progress=None, created_at=stamp).evaluated


def measured_row(db: TileDb, fp: str, tile_json: str, cycles: float, source: str = "host",
                 emulated: bool = False, isa: str = "neon") -> TileRow:
    return TileRow(fingerprint=fp, op_class="gemm_ukernel", dtype="fp32", isa=isa, params=tile_json,
                   source=source, origin=db.origin_for(source), cycles_per_k=cycles, seconds=None, gflops=10.0,
                   efficiency=0.5, bound="measured", repeats=5, spread=0.01,
                   conditions=canonical_json({"governor": "performance", "throttled": False}), emulated=emulated,
                   compiler="gcc 12", xfc_version="0.1.0", created_at=FIXED)


# ---------------------------------------------------------------------------------------------
# Schema, versions and files that are not ours.
# ---------------------------------------------------------------------------------------------

def test_new_database_is_marked_and_current(tmp_path):
    path = tmp_path / "sub" / "t.sqlite"
    with TileDb.open(path) as db:
        assert schema.application_id(db.conn) == schema.APPLICATION_ID
        assert schema.user_version(db.conn) == schema.SCHEMA_VERSION
        assert db.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert len(db.db_id) == 16 and db.migrated_from is None
    assert not list(path.parent.glob(".*.tmp")), "the temporary creation file must be gone"


def _old_database(path: Path, version: int) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA application_id = {schema.APPLICATION_ID}")
    schema.migrate(conn, target=version)
    conn.executemany("INSERT INTO meta VALUES (?, ?)", [("format", schema.FORMAT_NAME), ("db_id", "0123456789abcdef")])
    conn.close()


def test_older_schema_is_migrated_and_keeps_rows(tmp_path):
    path = tmp_path / "old.sqlite"
    _old_database(path, 1)                     # as the first schema version wrote it
    row = TileRow(fingerprint="a" * 32, op_class="gemm_ukernel", dtype="fp32", isa="neon",
                  params=canonical_json({"mr": 4}), source="static", origin="", cycles_per_k=3.0, seconds=None,
                  gflops=1.0, efficiency=0.5, bound="fma", repeats=1, spread=0.0, conditions="{}", emulated=False,
                  compiler="", xfc_version="0.1.0", created_at=FIXED)
    conn = sqlite3.connect(path)
    insert_row(conn, "tile", row)
    conn.commit()
    assert {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")} == \
        {"meta", "hardware", "tile"}
    conn.close()
    with pytest.raises(TileDbError, match="older xfc"):
        TileDb.open(path, readonly=True)        # read-only cannot migrate: says so
    with TileDb.open(path) as db:
        assert db.migrated_from == 1
        assert schema.user_version(db.conn) == schema.SCHEMA_VERSION
        assert db.rows("tile") == [row]
        assert db.count("operator") == 0 and db.count("calibration") == 0 and db.count("claim") == 0
    with TileDb.open(path) as db:
        assert db.migrated_from is None


@pytest.mark.subprocess
def test_newer_schema_is_refused_and_untouched(tmp_path):
    path = tmp_path / "new.sqlite"
    TileDb.open(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {schema.SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    before = sha(path)
    for readonly in (False, True):
        with pytest.raises(TileDbError, match="newer xfc"):
            TileDb.open(path, readonly=readonly)
    assert sha(path) == before
    assert_one_line_error(run_xfc("tiledb", "build", "--hw", "cortex-a53", "--db", str(path)), "newer xfc")
    assert sha(path) == before


@pytest.mark.subprocess
@pytest.mark.parametrize("kind", ["text", "empty", "other-sqlite"])
def test_foreign_files_are_refused_and_never_overwritten(tmp_path, kind):
    path = tmp_path / "x.sqlite"
    if kind == "text":
        path.write_text("not a database\n")
    elif kind == "empty":
        path.write_bytes(b"")
    else:
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE t (x)")
        conn.commit()
        conn.close()
    before = sha(path)
    with pytest.raises(TileDbError, match="refusing"):
        TileDb.open(path)
    for argv in (["build", "--hw", "cortex-a53"], ["stats"], ["verify"], ["import", str(tmp_path / "none.jsonl")]):
        proc = run_xfc("tiledb", *argv, "--db", str(path))
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert_one_line_error(run_xfc("tiledb", "build", "--hw", "cortex-a53", "--db", str(path)), "refusing")
    assert sha(path) == before


@pytest.mark.subprocess
def test_corrupt_file_is_one_line_and_synthesis_falls_back(tmp_path):
    path = tmp_path / "c.sqlite"
    hw = load("cortex-a76")
    with TileDb.open(path) as db:
        static_build(db, hw)
        db.compact(journal="delete")
    data = bytearray(path.read_bytes())
    for offset in range(4096, len(data), 97):   # every page after the first, header intact
        data[offset] ^= 0x5A
    path.write_bytes(bytes(data))
    before = sha(path)
    assert_one_line_error(run_xfc("tiledb", "stats", "--db", str(path)), "corrupt")
    assert_one_line_error(run_xfc("tiledb", "verify", "--db", str(path)), "")
    warnings = []
    db = open_for_synthesis(path, warnings.append)
    ev = TileDbEvaluator(db, hw, warn=warnings.append)
    spec = make_spec("matmul", dict(m=50, n=70, k=33))
    assert synthesize_cpu(spec, hw, evaluator=ev).plan == synthesize_cpu(spec, hw).plan
    assert len(warnings) == 1 and "corrupt" in warnings[0], warnings
    assert sha(path) == before


def test_missing_or_newer_database_never_breaks_synthesis(tmp_path):
    hw = load("cortex-a55")
    warnings = []
    assert open_for_synthesis(tmp_path / "none.sqlite", warnings.append) is None
    assert open_for_synthesis(tmp_path / "none.sqlite", warnings.append, quiet_if_missing=True) is None
    assert len(warnings) == 1 and "no such file" in warnings[0]
    path = tmp_path / "new.sqlite"
    TileDb.open(path).close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.commit()
    conn.close()
    assert open_for_synthesis(path, warnings.append) is None and "newer" in warnings[-1]
    spec = make_spec("conv2d", dict(c=8, h=9, w=9, k=16, r=3, s=3), pad=1)
    ev = TileDbEvaluator(None, hw)
    assert synthesize_cpu(spec, hw, evaluator=ev).plan == synthesize_cpu(spec, hw).plan


@pytest.mark.subprocess
def test_unwritable_location_and_full_disk_are_one_line(tmp_path):
    target = "/sys/xfc-tiledb-test.sqlite" if Path("/sys").is_dir() else "/proc/xfc-tiledb-test.sqlite"
    assert_one_line_error(run_xfc("tiledb", "build", "--hw", "cortex-a53", "--db", target), "cannot create")
    if os.geteuid() != 0:   # permissions bind everyone but root
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        try:
            assert_one_line_error(run_xfc("tiledb", "build", "--hw", "cortex-a53", "--db", str(ro / "x.sqlite")),
                                  "cannot create")
        finally:
            ro.chmod(0o755)
    # SQLite reports a full disk and an exhausted page budget with the same error (SQLITE_FULL).
    with TileDb.open(tmp_path / "full.sqlite") as db:
        db.conn.execute("PRAGMA max_page_count = 8")
        with pytest.raises(TileDbError, match="disk full") as info:
            static_build(db, load("snapdragon-865"))
        assert "\n" not in str(info.value)
        rows = db.rows("tile")
    for row in rows:   # what was committed before the disk filled is whole
        check_record("tile", as_dict(row), "row")


# ---------------------------------------------------------------------------------------------
# Fingerprints.
# ---------------------------------------------------------------------------------------------

def test_fingerprint_is_stable_and_follows_the_description(tmp_path):
    a76 = load("cortex-a76")
    assert fingerprint(a76, a76.cluster()) == fingerprint(load("cortex-a76"), load("cortex-a76").cluster())
    soc = load("snapdragon-865")
    fps = {fingerprint(soc, c) for c in soc.clusters}
    assert len(fps) == len(soc.clusters)
    assert fingerprint(a76, a76.cluster()) not in fps   # same core, other clock and caches
    text = (CORES / "cortex-a76.yaml").read_text()
    copy = tmp_path / "cortex-a76.yaml"
    copy.write_text(text)
    same = validate_file(copy)
    assert fingerprint(same, same.cluster()) == fingerprint(a76, a76.cluster())
    assert "fma_latency_cycles: 4" in text
    copy.write_text(text.replace("fma_latency_cycles: 4", "fma_latency_cycles: 5"))
    edited = validate_file(copy)
    assert fingerprint(edited, edited.cluster()) != fingerprint(a76, a76.cluster())
    copy.write_text(text.replace("notes:", "notes: an edited note.", 1) if "notes:" in text else text + "notes: x\n")
    noted = validate_file(copy)
    assert fingerprint(noted, noted.cluster()) == fingerprint(a76, a76.cluster())
    facts = cluster_facts(a76, a76.cluster())
    assert facts["clock_ghz"] == a76.cluster().clock_ghz and facts["core"]["name"] == "cortex-a76"


def test_edited_description_ignores_stale_rows_with_a_note(tmp_path):
    text = (CORES / "cortex-a76.yaml").read_text()
    copy = tmp_path / "cortex-a76.yaml"
    copy.write_text(text)
    hw = validate_file(copy)
    path = tmp_path / "t.sqlite"
    tile = enumerate_micro_tiles(hw.cluster().core, "neon")[20]
    with TileDb.open(path) as db:
        register_hardware(db, hw)
        db.put("tile", measured_row(db, fingerprint(hw, hw.cluster()), tile_params(tile), 1.0, "llvm-mca:cortex-a76"))
    copy.write_text(text.replace("fma_latency_cycles: 4", "fma_latency_cycles: 5"))
    edited = validate_file(copy)
    notes = []
    with TileDb.open(path, readonly=True) as db:
        fresh = TileDbEvaluator(db, hw, warn=notes.append).evaluate(tile, hw.cluster().core, "neon")
        assert fresh.source == "tile_db:llvm-mca:cortex-a76" and not notes
        ev = TileDbEvaluator(db, edited, warn=notes.append)
        score = ev.evaluate(tile, edited.cluster().core, "neon")
    assert score == StaticEvaluator().evaluate(tile, edited.cluster().core, "neon")
    assert len(notes) == 1 and "different description" in notes[0] and "cortex-a76:big" in notes[0]


# ---------------------------------------------------------------------------------------------
# Static build, ranking, records.
# ---------------------------------------------------------------------------------------------

def test_static_build_of_one_core_matches_the_model_and_resumes(tmp_path):
    hw = load("cortex-a55")
    core = hw.cluster().core
    tiles = enumerate_micro_tiles(core, isa_for(core))
    with TileDb.open(tmp_path / "a55.sqlite") as db:
        assert static_build(db, hw) == len(tiles)
        rows = {r.params: r for r in db.rows("tile")}
        assert len(rows) == len(tiles)
        for tile in tiles:
            row, score = rows[tile_params(tile)], StaticEvaluator().evaluate(tile, core, "neon")
            assert (row.cycles_per_k, row.efficiency, row.bound, row.source, row.origin) == \
                (score.cycles_per_k, score.efficiency, score.bound, "static", "")
            assert row.gflops == pytest.approx(score.efficiency * hw.cluster().peak_gflops_per_core)
        assert static_build(db, hw) == 0            # a re-run evaluates nothing
        assert db.count("tile") == len(tiles) and db.count("claim") == 0
        assert db.labels() == {fingerprint(hw, hw.cluster()): ["cortex-a55:big"]}


def test_sources_rank_measured_over_published_over_llvm_mca_over_static(tmp_path):
    hw = load("cortex-a76")
    core = hw.cluster().core
    tile = enumerate_micro_tiles(core, "neon")[30]
    fp, key = fingerprint(hw, hw.cluster()), tile_params(tile)
    with TileDb.open(tmp_path / "r.sqlite") as db:
        static_build(db, hw)
        ev = lambda: TileDbEvaluator(db, hw).evaluate(tile, core, "neon")  # noqa: E731
        assert ev().source == "static"
        db.put("tile", measured_row(db, fp, key, 7.0, "adb:emulator-5554", emulated=True))
        assert ev().source == "static"                            # emulated timings never rank
        db.put("tile", measured_row(db, fp, key, 9.0, "llvm-mca:cortex-a76"))
        assert ev().source == "tile_db:llvm-mca:cortex-a76" and ev().cycles_per_k == 9.0
        db.put("tile", measured_row(db, fp, key, 8.0, "published:test-ref"))
        assert ev().source == "tile_db:published:test-ref"
        db.put("tile", measured_row(db, fp, key, 11.0, "adb:R5CT1234"))
        score = ev()
        assert score.source == "tile_db:adb:R5CT1234" and score.cycles_per_k == 11.0
        assert score.efficiency == pytest.approx(tile.accumulator_registers / core.fma_per_cycle / 11.0)
    rows = [measured_row(db, fp, key, c, "host") for c in (5.0, 6.0, 30.0)]
    rows = [TileRow(**{**as_dict(r), "origin": f"{i:016x}"}) for i, r in enumerate(rows)]
    assert best_of(rows).cycles_per_k == 6.0                    # the median of one rank answers


@pytest.mark.parametrize("field,value,message", [
    ("source", "magic", "invalid value"), ("params", '{"b": 1, "a": 2}', "canonical"),
    ("cycles_per_k", float("nan"), "finite"), ("origin", "", "origin"), ("repeats", 0, "repeats"),
    ("op_class", "gemm", "op_class"), ("created_at", "yesterday", "created_at")])
def test_records_from_outside_are_checked(field, value, message):
    good = as_dict(TileRow(fingerprint="b" * 32, op_class="gemm_ukernel", dtype="fp32", isa="neon",
                           params=canonical_json({"mr": 4}), source="host", origin="0" * 16, cycles_per_k=2.0,
                           seconds=None, gflops=1.0, efficiency=0.5, bound="measured", repeats=3, spread=0.1,
                           conditions="{}", emulated=False, compiler="", xfc_version="0.1.0", created_at=FIXED))
    check_record("tile", good, "x")
    with pytest.raises(RecordError, match=message):
        check_record("tile", {**good, field: value}, "x")


# ---------------------------------------------------------------------------------------------
# Export, import, merge.
# ---------------------------------------------------------------------------------------------

@pytest.mark.subprocess
def test_export_is_deterministic_and_round_trips(tmp_path):
    exports = []
    for name in ("one", "two"):
        with TileDb.open(tmp_path / f"{name}.sqlite") as db:
            static_build(db, load("snapdragon-865"), "little")
            static_build(db, load("cortex-a53"))
            exports.append(list(export_lines(db)))
    assert exports[0] == exports[1]
    lines = exports[0]
    assert json.loads(lines[0])["format"] == "xfc-tile-db-export"
    assert [json.loads(x)["kind"] for x in lines[1:]] == sorted((json.loads(x)["kind"] for x in lines[1:]),
                                                              key=["hardware", "tile", "operator", "calibration"].index)
    with TileDb.open(tmp_path / "one.sqlite", readonly=True) as db:
        assert write_export(db, tmp_path / "one.jsonl") == len(lines) - 1
    third = tmp_path / "three.sqlite"
    proc = run_xfc("tiledb", "import", str(tmp_path / "one.jsonl"), "--db", str(third))
    assert proc.returncode == 0, proc.stderr
    with TileDb.open(third, readonly=True) as db:
        assert list(export_lines(db)) == lines
    out = run_xfc("tiledb", "export", "--db", str(third))
    assert out.stdout.splitlines() == lines
    foreign = tmp_path / "notes.txt"
    foreign.write_text("mine\n")
    assert_one_line_error(run_xfc("tiledb", "export", "--db", str(third), "-o", str(foreign)), "refusing")
    assert foreign.read_text() == "mine\n"


@pytest.mark.subprocess
def test_merge_of_two_machines_keeps_both_measurements(tmp_path):
    hw = load("cortex-a76")
    fp = fingerprint(hw, hw.cluster())
    tile = tile_params(enumerate_micro_tiles(hw.cluster().core, "neon")[10])
    ids = []
    for name, cycles in (("a", 5.0), ("b", 6.5)):
        with TileDb.open(tmp_path / f"{name}.sqlite") as db:
            static_build(db, hw)
            db.put("tile", measured_row(db, fp, tile, cycles))
            ids.append(db.db_id)
        proc = run_xfc("tiledb", "export", "--db", str(tmp_path / f"{name}.sqlite"), "-o", str(tmp_path / f"{name}.jsonl"))
        assert proc.returncode == 0, proc.stderr
    assert ids[0] != ids[1]
    merged = tmp_path / "merged.sqlite"
    proc = run_xfc("tiledb", "import", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "--db", str(merged))
    assert proc.returncode == 0 and "0 conflict" in proc.stdout, proc.stdout + proc.stderr
    proc = run_xfc("tiledb", "merge", str(tmp_path / "a.sqlite"), str(tmp_path / "b.sqlite"), "--db",
                   str(tmp_path / "merged2.sqlite"))
    assert proc.returncode == 0, proc.stderr
    for path in (merged, tmp_path / "merged2.sqlite"):
        with TileDb.open(path, readonly=True) as db:
            host = db.rows("tile", "source = 'host'")
            assert sorted((r.origin, r.cycles_per_k) for r in host) == sorted(zip(ids, (5.0, 6.5)))
            assert db.count("tile") == len(enumerate_micro_tiles(hw.cluster().core, "neon")) + 2
            assert db.db_id not in ids
    # The same key with another value is a conflict: reported, the existing row kept.
    lines = (tmp_path / "a.jsonl").read_text().splitlines()
    changed = [json.dumps({**json.loads(x), "cycles_per_k": 99.0}, sort_keys=True, separators=(",", ":"))
               if '"source":"host"' in x else x for x in lines]
    (tmp_path / "a2.jsonl").write_text("\n".join(changed) + "\n")
    proc = run_xfc("tiledb", "import", str(tmp_path / "a2.jsonl"), "--db", str(merged))
    assert proc.returncode == 0 and "1 conflict" in proc.stdout and "existing row kept" in proc.stderr
    with TileDb.open(merged, readonly=True) as db:
        assert sorted(r.cycles_per_k for r in db.rows("tile", "source = 'host'")) == [5.0, 6.5]


@pytest.mark.subprocess
def test_import_is_all_or_nothing(tmp_path):
    with TileDb.open(tmp_path / "a.sqlite") as db:
        static_build(db, load("cortex-a53"))
        write_export(db, tmp_path / "a.jsonl")
    lines = (tmp_path / "a.jsonl").read_text().splitlines()
    lines[-1] = lines[-1].replace('"source":"static"', '"source":"guess"')
    (tmp_path / "bad.jsonl").write_text("\n".join(lines) + "\n")
    dest = tmp_path / "dest.sqlite"
    assert_one_line_error(run_xfc("tiledb", "import", str(tmp_path / "bad.jsonl"), "--db", str(dest)), "bad.jsonl:")
    with pytest.raises(RecordError):
        read_export_file(tmp_path / "bad.jsonl")
    assert not dest.exists() or TileDb.open(dest, readonly=True).count("tile") == 0
    newer = [json.dumps({"format": "xfc-tile-db-export", "export_version": 1, "schema_version": 999})] + lines[1:]
    (tmp_path / "newer.jsonl").write_text("\n".join(newer) + "\n")
    assert_one_line_error(run_xfc("tiledb", "import", str(tmp_path / "newer.jsonl"), "--db", str(dest)), "newer")
    with TileDb.open(tmp_path / "b.sqlite") as db:
        report = merge_records(db, rows_of_database(tmp_path / "a.sqlite"))
        assert report.total_inserted == len(lines) - 1 and not report.conflicts


# ---------------------------------------------------------------------------------------------
# Concurrency.
# ---------------------------------------------------------------------------------------------

BUILDER = """
import sys
from xfc.cli import main
for hw in sys.argv[2:]:
    code = main(["tiledb", "build", "--hw", hw, "--db", sys.argv[1], "--quiet"])
    if code:
        sys.exit(code)
"""


@pytest.mark.subprocess
def test_two_concurrent_builders_lose_nothing_and_never_fail(tmp_path):
    socs = ["snapdragon-865", "snapdragon-888", "snapdragon-8-gen-1", "snapdragon-8-gen-2", "dimensity-9000"]
    path = tmp_path / "shared.sqlite"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", BUILDER, str(path), *order], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env)
             for order in (socs, socs)]   # the same order: both want the same tasks at the same time
    seen = 0
    while any(p.poll() is None for p in procs):   # a reader meanwhile: only whole rows, never fewer
        if path.exists():
            try:
                with TileDb.open(path, readonly=True, busy_timeout_s=5) as db:
                    rows = db.rows("tile")
            except TileDbError as exc:   # only while the file is being created and marked
                assert "locked" not in str(exc), exc
                continue
            for row in rows:
                check_record("tile", as_dict(row), "live row")
            assert len(rows) >= seen
            seen = len(rows)
        time.sleep(0.05)
    outputs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, err
        assert "locked" not in err and "Traceback" not in err, err
    expected = {}
    for soc in socs:
        hw = load(soc)
        expected[soc] = sum(len(enumerate_micro_tiles(c.core, isa_for(c.core))) for c in hw.clusters)
    evaluated = {soc: 0 for soc in socs}
    for out, _ in outputs:
        for line in out.splitlines():
            soc = line.split(" for ")[1].split(":")[0]
            evaluated[soc] += int(line.split(": ")[2].split(" evaluated")[0])
    assert evaluated == expected, "every row evaluated exactly once across both builders"
    with TileDb.open(path, readonly=True) as db:
        assert db.count("tile") == sum(expected.values())
        assert db.query("SELECT COUNT(*) FROM (SELECT DISTINCT fingerprint, isa, params, source FROM tile)")[0][0] \
            == sum(expected.values())
        assert db.count("claim") == 0


# ---------------------------------------------------------------------------------------------
# CLI.
# ---------------------------------------------------------------------------------------------

@pytest.mark.subprocess
def test_cli_build_show_stats_verify_gc(tmp_path):
    db = str(tmp_path / "c.sqlite")
    proc = run_xfc("tiledb", "build", "--hw", "snapdragon-865", "--cluster", "little", "--tiles", "4x8,8x4",
                   "--db", db)
    assert proc.returncode == 0, proc.stderr
    assert "ETA" in proc.stderr and "evaluated" in proc.stdout
    show = run_xfc("tiledb", "show", "--db", db, "--hw", "snapdragon-865")
    assert show.returncode == 0 and "snapdragon-865:little" in show.stdout and "static" in show.stdout
    stats = json.loads(run_xfc("tiledb", "stats", "--db", db, "--json").stdout)
    assert stats["counts"]["tile"] == 4 and stats["measured_hardware"] == []   # 4x8 and 8x4, two A widths
    assert run_xfc("tiledb", "verify", "--db", db).returncode == 0
    gc = run_xfc("tiledb", "gc", "--db", db, "--stale")
    assert gc.returncode == 0 and "dead build claim" in gc.stdout and "compacted" in gc.stdout, gc.stdout
    assert_one_line_error(run_xfc("tiledb", "build", "--hw", "host", "--evaluators", "llvm-mca",
                                  "--db", db), "llvm-mca")
    assert_one_line_error(run_xfc("tiledb", "build", "--hw", "cortex-a53", "--evaluators", "host",
                                  "--db", db), "--hw host")
    assert_one_line_error(run_xfc("tiledb", "build", "--hw", "host", "--evaluators", "host", "--db",
                                  str(REPO / "tile_db" / "host.sqlite")), "per-user")
    assert not (REPO / "tile_db" / "host.sqlite").exists()
    assert_one_line_error(run_xfc("tiledb", "build", "--hw", "cortex-a53", "--tiles", "4by8", "--db", db), "MRxNR")
    assert_one_line_error(run_xfc("tiledb", "calibrate", "--hw", "host", "--db", str(REPO / "tile_db" / "host.sqlite")),
                          "shipped databases hold computed rows only")
    assert not (REPO / "tile_db" / "host.sqlite").exists()


@pytest.mark.subprocess
@pytest.mark.parametrize("sub", ["", "build", "show", "stats", "export", "import", "merge", "verify", "gc",
                                 "calibrate"])
def test_help_on_every_tiledb_command(sub):
    proc = run_xfc("tiledb", *([sub] if sub else []), "--help")
    assert proc.returncode == 0 and "usage:" in proc.stdout, proc.stderr


@pytest.mark.subprocess
def test_default_database_is_the_per_user_cache(tmp_path):
    proc = run_xfc("tiledb", "build", "--hw", "cortex-a53", "--tiles", "4x4", "--quiet",
                   env_extra={"XDG_CACHE_HOME": str(tmp_path), "XFC_CACHE_DIR": ""})
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "xfc" / "tile-db.sqlite").is_file()


# ---------------------------------------------------------------------------------------------
# The host probe's arithmetic (its measurement is in test_tiledb_host.py).
# ---------------------------------------------------------------------------------------------

def test_probe_analysis_of_recorded_output():
    from xfc.tiledb.probe import HostProbe, analyse, widths_for
    from xfc.hardware.host import describe_host
    # A 3 GHz core, 4-cycle FMA latency, two 256-bit FMAs per cycle but one 512-bit (split) FMA.
    clock = 3e9
    text = "\n".join([
        f"add 12000000 {12e6 / clock:.9e}", f"add 12000000 {1.5 * 12e6 / clock:.9e}",
        f"lat 1500000 {4 * 1.5e6 / clock:.9e}", f"lat 1500000 {4 * 1.5e6 / clock:.9e}",
        f"fma256 12000000 {12e6 / 2 / clock:.9e}", f"fma256 12000000 {12e6 / 2 / clock:.9e}",
        f"fma512 12000000 {12e6 / 1 / clock:.9e}", f"fma512 12000000 {12e6 / 1 / clock:.9e}"])
    ghz, fma, latency, repeats, spread = analyse(text, (256, 512))
    assert ghz == pytest.approx(3.0, rel=1e-6) and latency == pytest.approx(4.0, rel=1e-6)
    assert fma == {256: pytest.approx(2.0, rel=1e-6), 512: pytest.approx(1.0, rel=1e-6)}
    assert repeats == 2 and spread == pytest.approx(0.5 / 1.25)
    assert widths_for({"fma", "avx", "avx2"}) == (128, 256) and widths_for({"sse2"}) == ()
    assert widths_for({"fma", "avx", "avx512f"}) == (128, 256, 512)
    probe = HostProbe(cpu_key="0" * 32, cpu_model="x", clock_ghz=3.0, fma_per_cycle=((256, 1.93), (512, 0.97)),
                      fma_latency_cycles=4.2, method="m", repeats=2, spread=0.1, measured_at=FIXED)
    # The description takes the figures quantized: rate to half an FMA, latency to a cycle, clock to 0.05 GHz.
    facts = dict(flags=set(X86_64_V4_FLAGS), **{"model name": "x", "cpu MHz": "2100.0"})
    for isa, want_rate in (("avx512", 1.0), ("avx2", 2.0)):
        core = describe_host(facts, {}, 2, "x86_64", isa=isa, measured=probe.measurement()).cluster().core
        assert (core.fma_per_cycle, core.fma_latency_cycles) == (want_rate, 4)
    hw = describe_host(facts, {}, 2, "x86_64", isa="generic", measured=probe.measurement())
    assert hw.cluster().core.fma_per_cycle == 2.0, "no 128-bit figure measured: the assumption stays"
    assert "host:fma_per_cycle" in hw.uncertain and "host:fma_latency_cycles" not in hw.uncertain
    assert hw.cluster().clock_ghz == 3.0 and "measured by the host FMA probe" in hw.notes
    with pytest.raises(XfcError):
        analyse("add 1 0.5\n", (256,))


# ---------------------------------------------------------------------------------------------
# Operator rows, the synthesis entry point, shipped databases.
# ---------------------------------------------------------------------------------------------

def test_operator_rows_hold_the_synthesized_plan_and_rank_measured_first(tmp_path):
    from xfc.tiledb.operators import best_operator, plan_json
    from xfc.tiledb.records import OperatorRow
    from xfc.ops.workloads import SUITE, suite_spec
    hw = load("snapdragon-865")
    ev = StaticDbEvaluator()
    with TileDb.open(tmp_path / "o.sqlite") as db:
        register_hardware(db, hw, "big")
        tasks = plan_tasks(db, hw, [ev], ["operators"], "big")
        assert len(tasks) == len(SUITE) * 2                  # 1 thread and every core of the cluster
        assert run_build(db, tasks, progress=None, created_at=stamp).evaluated == len(tasks)
        fp = fingerprint(hw, hw.cluster("big"))
        spec = suite_spec("conv_r18_l1")
        cores = hw.cluster("big").count
        synth = synthesize_cpu(spec, hw, "big", cores)
        row = best_operator(db, fp, spec.key(), "big", cores)
        assert row.plan == plan_json(synth.plan) and row.predicted_s == synth.estimate.predicted_s
        assert row.source == "static" and row.measured_s is None
        measured = OperatorRow(**{**as_dict(row), "source": "host", "origin": db.db_id, "measured_s": 0.5,
                                  "repeats": 7})
        db.put("operator", measured)
        assert best_operator(db, fp, spec.key(), "big", cores) == measured
        assert best_operator(db, fp, spec.key(), "big", cores + 1) is None


def test_synthesis_evaluator_choices(tmp_path):
    from xfc.tiledb.evaluators import synthesis_evaluator
    hw = load("cortex-a53")
    environ = {"XFC_CACHE_DIR": str(tmp_path / "cache")}
    warnings = []
    assert synthesis_evaluator("off", hw, None, environ, warnings.append) is None
    ev = synthesis_evaluator("auto", load("host"), None, environ, warnings.append)
    assert ev is not None and ev.db is None and warnings == []      # nothing measured yet: quiet
    with pytest.raises(OperatorError, match="missing.sqlite: no such file"):   # an explicit path must exist
        synthesis_evaluator(str(tmp_path / "missing.sqlite"), hw, None, environ, warnings.append)
    assert warnings == []
    path = tmp_path / "a53.sqlite"
    with TileDb.open(path) as db:
        static_build(db, hw)
    ev = synthesis_evaluator(str(path), hw, None, environ, warnings.append)
    spec = make_spec("matmul", dict(m=33, n=20, k=9))
    assert synthesize_cpu(spec, hw, evaluator=ev).plan == synthesize_cpu(spec, hw).plan
    ev.close()
    assert warnings == []


def test_shipped_build_is_reproducible_and_replaces_only_its_own_files(tmp_path):
    from xfc.tiledb.shipped import build_all, shipped_descriptions
    names = {p.stem for p in shipped_descriptions()}
    assert {"snapdragon-865", "cortex-a55"} <= names and "snapdragon" not in names
    for out in ("a", "b"):
        build_all(tmp_path / out, stamp, ["cortex-a55"], log=None)
    first, second = (tmp_path / d / "cortex-a55.jsonl" for d in ("a", "b"))
    assert first.read_bytes() == second.read_bytes()
    with TileDb.open(tmp_path / "a" / "cortex-a55.sqlite", readonly=True) as db:
        assert db.conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        assert {r.source for r in db.rows("tile")} == {"static"} and db.count("operator") > 0
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["cortex-a55.jsonl", "cortex-a55.sqlite"]
    build_all(tmp_path / "a", stamp, ["cortex-a55"], log=None)          # rebuilding replaces our own file
    assert first.read_bytes() == second.read_bytes()
    (tmp_path / "c").mkdir()
    foreign = tmp_path / "c" / "cortex-a55.sqlite"
    foreign.write_text("someone else's file\n")
    with pytest.raises(TileDbError, match="refusing"):
        build_all(tmp_path / "c", stamp, ["cortex-a55"], log=None)
    assert foreign.read_text() == "someone else's file\n"
