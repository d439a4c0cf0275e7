"""Hardware descriptions field by field: every field of one shipped file of each kind, replaced by
wrong types, zero, negative, huge, NaN and infinite values or deleted, gives exit status 2 and
one line naming the file and the field (never a traceback or an internal error); the cross-field
rules each fire on a minimal edit; values at the edges of the plausible ranges crash nothing
downstream (peaks, `xfc hw show`, CPU and GPU synthesis and rendering).
"""
from __future__ import annotations

import copy
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from xfc.cli import hardware_summary, main
from xfc.errors import XfcError
from xfc.hardware.schema import SCHEMAS
from xfc.hardware.load import SHIPPED_ROOT, validate_file
from xfc.hardware.figures import derived_figures
from xfc.hardware.ranges import PLAUSIBLE, SCHEMA_MD, schema_md_with_table

pytestmark = pytest.mark.unit

XFC = shutil.which("xfc", path=str(Path(sys.executable).parent)) or "xfc"

# One shipped file of each kind (two GPUs: Adreno has every optional GPU field filled, Mali has
# the nulls); every field of each is swept.
SWEPT = ("cpu/cortex-x3.yaml", "gpu/adreno-740.yaml", "gpu/mali-g710.yaml", "soc/snapdragon-8-gen-2.yaml",
         "snapdragon.yaml")

DELETE = object()
WRONG_TYPES = (("string", "wide"), ("list", [1, 2]), ("mapping", {"a": 1}), ("bool", True), ("null", None))
BAD_VALUES = (("zero", 0), ("negative", -1), ("huge-float", 1e12), ("huge-int", 10 ** 30), ("nan", math.nan),
              ("inf", math.inf), ("minus-inf", -math.inf))
STRING_TYPE_CASES = tuple(c for c in WRONG_TYPES if c[0] != "string") + (("int", 7),)

# The replacements that are legitimately valid: nullable fields and optional keys. Everything
# else in the sweep must be refused.
ACCEPTED = {
    "gpu/adreno-740.yaml": {("half_warp_width", "null"), ("fp16_flop_per_clock_per_cu", "null"),
                            ("register_file_bytes_per_cu", "null"), ("max_waves_per_cu", "null"),
                            ("uncertain", "deleted"), ("notes", "deleted")},
    "gpu/mali-g710.yaml": {("fp16_flop_per_clock_per_cu", "null"), ("max_waves_per_cu", "null"),
                           ("uncertain", "deleted"), ("notes", "deleted")},
    "cpu/cortex-x3.yaml": {("uncertain", "deleted"), ("notes", "deleted"), ("cpuinfo", "deleted")},
    # (gpu: null is valid too, but this file's `uncertain` then names a missing gpu.clock_mhz)
    "soc/snapdragon-8-gen-2.yaml": {("l3_kib", "null"), ("slc_kib", "null"), ("uncertain", "deleted"),
                                    ("notes", "deleted")},
    "snapdragon.yaml": {("notes", "deleted")},
}


def _path_text(path: tuple) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _field_paths(node, prefix=()):
    """Every field path of a YAML document: mapping keys and list items, containers included."""
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for key, value in items:
        path = prefix + (key,)
        yield path, value
        if isinstance(value, (dict, list)):
            yield from _field_paths(value, path)


def _cases(value, deletable: bool):
    cases = STRING_TYPE_CASES if isinstance(value, str) else WRONG_TYPES + BAD_VALUES
    for label, new in cases:
        if type(new) is type(value) and new == value:
            continue  # not a change (e.g. true for a field that is already true)
        yield label, new
    if deletable:
        yield "deleted", DELETE


def _sweep_params():
    for rel in SWEPT:
        data = yaml.safe_load((SHIPPED_ROOT / rel).read_text())
        for path, _ in _field_paths(data):
            yield pytest.param(rel, path, id=f"{rel}:{_path_text(path)}")


def _replaced(data: dict, path: tuple, new) -> dict:
    out = copy.deepcopy(data)
    node = out
    for part in path[:-1]:
        node = node[part]
    if new is DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = copy.deepcopy(new)
    return out


def _write(tmp_path: Path, rel: str, data) -> Path:
    """A copy under the same relative name (names must match file names); references to other
    descriptions resolve to the shipped files."""
    path = tmp_path / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    # libyaml's emitter when PyYAML has it (a third of the sweep's time went to the pure-Python one);
    # xfc reads the file back with yaml.safe_load as always
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    path.write_text(data if isinstance(data, str) else yaml.dump(data, Dumper=dumper, sort_keys=False))
    return path


def _run(capsys, *argv) -> tuple[int, list[str]]:
    """xfc.cli.main in-process: exit status and the non-empty lines of stdout + stderr."""
    env_debug = os.environ.pop("XFC_DEBUG", None)
    try:
        status = main(list(argv))
    finally:
        if env_debug is not None:
            os.environ["XFC_DEBUG"] = env_debug
    out = capsys.readouterr()
    return status, [ln for ln in (out.out + out.err).splitlines() if ln.strip()]


def _clean_error_problem(status: int, lines: list[str], file_name: str, field: str) -> str | None:
    """Why (status, lines) is not 'exit 2, one line naming the file and the field', or None."""
    if status != 2:
        return f"exit {status}: {lines}"
    if len(lines) != 1:
        return f"{len(lines)} lines: {lines}"
    line = lines[0]
    if "Traceback" in line or "internal error" in line:
        return f"not a clean error: {line}"
    if file_name not in line:
        return f"file {file_name} not named: {line}"
    if field not in line:
        return f"field {field} not named: {line}"
    return None


@pytest.mark.sweep
@pytest.mark.matrix(every=2, cover=("rel",))   # every description file stays in the sample; test-matrices: all
@pytest.mark.parametrize("rel,path", list(_sweep_params()))
def test_every_field_swept_gives_exit_2_and_one_line(tmp_path, capsys, rel, path):
    data = yaml.safe_load((SHIPPED_ROOT / rel).read_text())
    node = data
    for part in path[:-1]:
        node = node[part]
    value = node[path[-1]]
    field = _path_text(path)
    problems = []
    for label, new in _cases(value, deletable=isinstance(node, dict)):
        target = _write(tmp_path / label, rel, _replaced(data, path, new))
        status, lines = _run(capsys, "hw", "validate", str(target))
        if (field, label) in ACCEPTED[rel]:
            if status != 0 or not lines[0].startswith("OK"):
                problems.append(f"{label}: should be accepted, got exit {status}: {lines}")
            continue
        named = field
        if label == "deleted" and lines and "does not name a field of this file" in lines[0]:
            # deleting a field that `uncertain` lists is reported at that uncertain entry,
            # which spells the path by role ('clusters.prime.l2_kib')
            named = path[-1]
        problem = _clean_error_problem(status, lines, Path(rel).name, named)
        if problem:
            problems.append(f"{label} ({new!r}): {problem}")
    assert not problems, f"{rel} field '{field}':\n" + "\n".join(problems)


def test_sweep_covers_every_numeric_field_of_the_swept_files():
    """The walk is not hand-listed: it reaches every ranged field of each kind it sweeps."""
    swept_keys = set()
    for rel in SWEPT:
        data = yaml.safe_load((SHIPPED_ROOT / rel).read_text())
        kind = data["kind"]
        for path, _ in _field_paths(data):
            key = kind + "." + ".".join("[]" if isinstance(p, int) else p for p in path).replace(".[]", "[]")
            swept_keys.add(key)
    assert set(PLAUSIBLE) <= swept_keys, set(PLAUSIBLE) - swept_keys


# ---------------------------------------------------------------------------------------------
# The three reported cases, as named regressions (in-process and through the console script).
# ---------------------------------------------------------------------------------------------

def _shipped_with(tmp_path, rel, path, new) -> Path:
    data = yaml.safe_load((SHIPPED_ROOT / rel).read_text())
    return _write(tmp_path, rel, _replaced(data, path, new))


REPORTED = [
    ("vector_bits-100", "cpu/cortex-x3.yaml", ("vector_bits",), 100, "vector_bits", "from 128 to 512"),
    ("vector_registers-100000000", "cpu/cortex-x3.yaml", ("vector_registers",), 100000000, "vector_registers",
     "from 8 to 64"),
    ("cluster-clock-180-ghz", "soc/snapdragon-8-gen-2.yaml", ("clusters", 0, "max_clock_ghz"), 180.0,
     "clusters[0].max_clock_ghz", "from 0.2 to 5 GHz"),
]


@pytest.mark.parametrize("rel,path,new,field,accepted", [r[1:] for r in REPORTED], ids=[r[0] for r in REPORTED])
def test_reported_case_is_one_line_with_file_field_value_and_range(tmp_path, capsys, rel, path, new, field, accepted):
    target = _shipped_with(tmp_path, rel, path, new)
    status, lines = _run(capsys, "hw", "validate", str(target))
    assert _clean_error_problem(status, lines, Path(rel).name, f"field '{field}'") is None, lines
    assert accepted in lines[0] and f"got {new}" in lines[0], lines[0]


@pytest.mark.subprocess
@pytest.mark.parametrize("rel,path,new,field,accepted", [r[1:] for r in REPORTED], ids=[r[0] for r in REPORTED])
def test_reported_case_through_the_console_script(tmp_path, rel, path, new, field, accepted):
    target = _shipped_with(tmp_path, rel, path, new)
    env = {k: v for k, v in os.environ.items() if k != "XFC_DEBUG"}
    for argv in (["hw", "validate", str(target)], ["hw", "show", str(target)]):
        proc = subprocess.run([XFC, *argv], capture_output=True, text=True, timeout=120, env=env)
        lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
        assert _clean_error_problem(proc.returncode, lines, Path(rel).name, f"field '{field}'") is None, \
            (argv, proc.stdout, proc.stderr)
        assert accepted in lines[0]


@pytest.mark.subprocess
def test_synth_with_a_bad_description_is_one_line_and_writes_nothing(tmp_path):
    target = _shipped_with(tmp_path, "soc/snapdragon-8-gen-2.yaml", ("clusters", 0, "max_clock_ghz"), 180.0)
    out_dir = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "XFC_DEBUG"}
    proc = subprocess.run([XFC, "synth", "matmul", "--hw", str(target), "--shape", "m=8,n=8,k=8", "-o", str(out_dir)],
                          capture_output=True, text=True, timeout=120, env=env)
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    assert _clean_error_problem(proc.returncode, lines, "snapdragon-8-gen-2.yaml",
                                "field 'clusters[0].max_clock_ghz'") is None, (proc.stdout, proc.stderr)
    assert not out_dir.exists() and not list(tmp_path.glob(".out*"))


# Every command that takes a description loads it through the same checks.
THROUGH_COMMANDS = [
    ("cpu/cortex-x3.yaml", ("fma_latency_cycles",), math.nan, "fma_latency_cycles"),
    ("cpu/cortex-x3.yaml", ("l1d",), [64], "l1d"),
    ("gpu/adreno-740.yaml", ("max_clock_mhz",), 10 ** 30, "max_clock_mhz"),
    ("gpu/mali-g710.yaml", ("local_memory", "size_kib"), -1, "local_memory.size_kib"),
    ("soc/snapdragon-8-gen-2.yaml", ("memory", "peak_bandwidth_gbps"), math.inf, "memory.peak_bandwidth_gbps"),
    ("soc/snapdragon-8-gen-2.yaml", ("clusters", 3, "cpu_ids", 0), "zero", "clusters[3].cpu_ids[0]"),
    ("snapdragon.yaml", ("ref",), {"a": 1}, "ref"),
]


@pytest.mark.parametrize("rel,path,new,field", THROUGH_COMMANDS, ids=[f"{c[0]}:{c[3]}" for c in THROUGH_COMMANDS])
def test_show_and_synth_refuse_bad_files_the_same_way(tmp_path, capsys, rel, path, new, field):
    target = _shipped_with(tmp_path, rel, path, new)
    target_kind = "gpu" if rel.startswith("gpu/") else "cpu"
    for argv in (["hw", "show", str(target)], ["hw", "show", str(target), "--json"],
                 ["synth", "matmul", "--hw", str(target), "--shape", "m=8,n=8,k=8", "--target", target_kind,
                  "-o", str(tmp_path / "out")]):
        status, lines = _run(capsys, *argv)
        assert _clean_error_problem(status, lines, Path(rel).name, f"field '{field}'") is None, (argv, lines)
        assert lines[0].startswith("xfc: error: ")
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------
# Values YAML can produce beyond JSON's: dates, binary, sets, pairs, sexagesimal and hex ints,
# integers too long for Python, and scalars PyYAML itself cannot construct.
# ---------------------------------------------------------------------------------------------

ODD_SCALARS = [
    ("date", "2001-12-14"), ("timestamp", "2001-12-14t21:59:43.10-05:00"), ("binary", "!!binary aGVsbG8="),
    ("set", "!!set {a, b}"), ("omap", "!!omap [{a: 1}]"), ("pairs", "!!pairs [{a: 1}]"),
    ("sexagesimal", "190:20:30"), ("hex", "0x1000"), ("octal-like", "0o17"), ("float-for-int", "6.0"),
    ("quoted-number", "'6'"), ("yes", "yes"), ("tilde", "~"), ("empty", ""), ("dot-nan", ".NaN"),
    ("minus-inf", "-.inf"), ("overflowing-float", "1.0e+400"), ("5000-digit-int", "9" * 5000),
    ("long-hex-int", "0x" + "f" * 5000), ("long-string", "x" * 100_000), ("nested", "[[[[[[1]]]]]]"),
    ("flow-mapping", "{decode_width: 6}"),
]
UNREADABLE_SCALARS = [("bad-date", "2001-13-45"), ("bad-int", "!!int abc"), ("bad-bool", "!!bool maybe"),
                      ("bad-float", "!!float abc"), ("bad-timestamp", "!!timestamp xyz")]


def _core_text_with(line: str) -> str:
    text = (SHIPPED_ROOT / "cpu/cortex-x3.yaml").read_text()
    assert "\ndecode_width: 6\n" in text
    return text.replace("\ndecode_width: 6\n", f"\n{line}\n")


@pytest.mark.parametrize("label,scalar", ODD_SCALARS, ids=[c[0] for c in ODD_SCALARS])
def test_odd_yaml_values_name_the_field(tmp_path, capsys, label, scalar):
    target = _write(tmp_path, "cpu/cortex-x3.yaml", _core_text_with(f"decode_width: {scalar}"))
    status, lines = _run(capsys, "hw", "validate", str(target))
    assert _clean_error_problem(status, lines, "cortex-x3.yaml", "field 'decode_width'") is None, lines
    assert len(lines[0]) < 600, lines[0]   # a huge value is summarized, not printed


@pytest.mark.parametrize("label,scalar", UNREADABLE_SCALARS, ids=[c[0] for c in UNREADABLE_SCALARS])
def test_scalars_yaml_cannot_construct_name_the_line(tmp_path, capsys, label, scalar):
    target = _write(tmp_path, "cpu/cortex-x3.yaml", _core_text_with(f"decode_width: {scalar}"))
    status, lines = _run(capsys, "hw", "validate", str(target))
    line_no = _core_text_with("decode_width: X").splitlines().index("decode_width: X") + 1
    assert _clean_error_problem(status, lines, "cortex-x3.yaml", f"line {line_no}") is None, lines


@pytest.mark.parametrize("label,text", [
    ("list-key", "? [a]\n: 1"), ("mapping-key", "? {a: 1}\n: 1"), ("int-key", "7: 1"), ("null-key", "~: 1"),
    ("date-key", "2001-12-14: 1"), ("huge-int-key", "9" * 5000 + ": 1"), ("long-key", "k" * 5000 + ": 1"),
])
def test_odd_keys_are_one_line(tmp_path, capsys, label, text):
    target = _write(tmp_path, "cpu/cortex-x3.yaml", _core_text_with("decode_width: 6\n" + text))
    status, lines = _run(capsys, "hw", "validate", str(target))
    assert _clean_error_problem(status, lines, "cortex-x3.yaml", "") is None, lines
    assert "unknown key" in lines[0] or "not valid YAML" in lines[0], lines[0]
    assert len(lines[0]) < 600


@pytest.mark.parametrize("kind_text", ["[cpu_core]", "{a: 1}", "7", "true", "~", "toaster", "!!binary aGVsbG8="])
def test_bad_kind_is_one_line(tmp_path, capsys, kind_text):
    text = (SHIPPED_ROOT / "cpu/cortex-x3.yaml").read_text().replace("kind: cpu_core\n", f"kind: {kind_text}\n")
    status, lines = _run(capsys, "hw", "validate", str(_write(tmp_path, "cpu/cortex-x3.yaml", text)))
    assert _clean_error_problem(status, lines, "cortex-x3.yaml", "'kind'") is None, lines


def test_deep_nesting_and_overlong_reference_names(tmp_path, capsys):
    deep = _core_text_with("decode_width: " + "[" * 5000 + "]" * 5000)
    status, lines = _run(capsys, "hw", "validate", str(_write(tmp_path / "a", "cpu/cortex-x3.yaml", deep)))
    assert _clean_error_problem(status, lines, "cortex-x3.yaml", "") is None, lines
    # a reference name longer than the file system allows must not raise OSError
    soc = yaml.safe_load((SHIPPED_ROOT / "soc/snapdragon-8-gen-2.yaml").read_text())
    soc["clusters"][0]["core"] = "a" * 5000
    status, lines = _run(capsys, "hw", "validate", str(_write(tmp_path / "b", "soc/snapdragon-8-gen-2.yaml", soc)))
    assert _clean_error_problem(status, lines, "snapdragon-8-gen-2.yaml", "field 'clusters[0].core'") is None, lines
    status, lines = _run(capsys, "hw", "show", "x" * 5000)
    assert status == 2 and len(lines) == 1 and "internal error" not in lines[0], lines


# ---------------------------------------------------------------------------------------------
# Cross-field rules: each fires on a minimal edit of a shipped file and names the values.
# ---------------------------------------------------------------------------------------------

def _edit(rel: str, **changes) -> dict:
    data = yaml.safe_load((SHIPPED_ROOT / rel).read_text())
    for dotted, value in changes.items():
        node = data
        parts = [int(p) if p.isdigit() else p for p in dotted.split("__")]
        for part in parts[:-1]:
            node = node[part]
        node[parts[-1]] = value
    return data


X3, A740, SD = "cpu/cortex-x3.yaml", "gpu/adreno-740.yaml", "soc/snapdragon-8-gen-2.yaml"
RULES = [
    ("neon-and-avx", X3, {"features": ["neon", "avx2"]}, "features", "x86 feature avx2"),
    ("arm-without-neon", X3, {"features": ["fp16"]}, "features", "always has 'neon'"),
    ("x86-with-neon", X3, {"isa": "x86-64", "vendor": "x86", "features": ["neon"]}, "features", "cannot list 'neon'"),
    ("v80-with-dotprod", X3, {"isa": "armv8.0-a", "features": ["neon", "dotprod"]}, "features", "Armv8.2-A"),
    ("neon-256-bits", X3, {"vector_bits": 256}, "vector_bits", "128-bit registers of neon"),
    ("neon-16-registers", X3, {"vector_registers": 16}, "vector_registers", "32 architectural registers"),
    ("avx2-32-registers", X3, {"isa": "x86-64", "vendor": "x86", "features": ["avx2", "fma"], "vector_bits": 256},
     "vector_registers", "16 architectural registers"),
    ("fma-over-decode", X3, {"fma_per_cycle": 7}, "fma_per_cycle", "exceeds decode_width 6"),
    ("l1-not-whole-sets", X3, {"l1d__ways": 3}, "l1d.size_kib", "not a whole number of sets"),
    ("l1-sets-not-power-of-two", X3, {"l1d__size_kib": 48}, "l1d.size_kib", "192 sets"),
    ("l2-below-l1", X3, {"l2__size_kib": 32}, "l2.size_kib", "smaller than l1d.size_kib"),
    ("vendor-family", A740, {"vendor": "arm"}, "family", "does not match vendor 'arm'"),
    ("half-wave", A740, {"half_warp_width": 32}, "half_warp_width", "not half of warp_width 128"),
    ("work-group-below-warp", A740, {"max_work_group_size": 64}, "max_work_group_size", "smaller than one warp"),
    ("preferred-over-max", A740, {"preferred_work_group_size": 2048}, "preferred_work_group_size", "exceeds"),
    ("fp16-below-fp32", A740, {"fp16_flop_per_clock_per_cu": 512}, "fp16_flop_per_clock_per_cu", "below"),
    ("coalescing-over-warp", A740, {"coalescing_threads": 256}, "coalescing_threads", "exceeds warp_width"),
    ("l1-over-l2", A740, {"l1_kib_per_cu": 200, "l2_kib": 128}, "l1_kib_per_cu", "exceeds l2_kib"),
    ("occupancy-over-register-file", A740, {"registers_per_thread_full_occupancy": 32},
     "registers_per_thread_full_occupancy", "exceeds register_file_bytes_per_cu 196608"),
    ("adreno-local-not-on-chip", A740, {"local_memory__on_chip": False}, "local_memory.on_chip", "adreno"),
    ("mali-local-on-chip", "gpu/mali-g710.yaml", {"local_memory__on_chip": True}, "local_memory.on_chip", "mali"),
    ("duplicate-role", SD, {"clusters__1__role": "prime", "uncertain": []}, "clusters[1].role", "more than once"),
    ("cpu-in-two-clusters", SD, {"clusters__0__cpu_ids": [0]}, "clusters[3].cpu_ids[0]", "also listed at"),
    ("cpu-id-gap", SD, {"clusters__0__cpu_ids": [9]}, "clusters[0].cpu_ids[0]", "leaves CPU 7 unused"),
    ("l2-override-sets", SD, {"clusters__1__l2_kib": 384}, "clusters[1].l2_kib", "768 sets"),
    ("l2-override-below-l1", SD, {"clusters__0__l2_kib": 32}, "clusters[0].l2_kib", "smaller than the cortex-x3 L1d"),
    ("l3-below-l2", SD, {"l3_kib": 512}, "l3_kib", "smaller than the 1024 KiB L2"),
    ("cluster-clock-factor", SD, {"clusters__0__max_clock_ghz": 0.9}, "clusters[0].max_clock_ghz", "typical clock"),
    ("qualcomm-with-mali", SD, {"gpu__ref": "mali-g710", "gpu__compute_units": 10, "gpu__clock_mhz": 850},
     "gpu.ref", "mali GPU"),
    ("adreno-outside-qualcomm", SD, {"vendor": "mediatek"}, "gpu.ref", "mediatek SoC does not use"),
    ("adreno-configuration", SD, {"gpu__compute_units": 8}, "gpu.compute_units", "differs from the 6"),
    ("gpu-clock-factor", SD, {"gpu__clock_mhz": 1500}, "gpu.clock_mhz", "2.21x"),
]


@pytest.mark.parametrize("rel,changes,field,fragment", [r[1:] for r in RULES], ids=[r[0] for r in RULES])
def test_cross_field_rule(tmp_path, rel, changes, field, fragment):
    target = _write(tmp_path, rel, _edit(rel, **changes))
    with pytest.raises(XfcError) as info:
        validate_file(target)
    message = str(info.value)
    assert f"field '{field}'" in message and fragment in message, message
    assert Path(rel).name in message and "\n" not in message


def test_soc_rules_against_local_core_files(tmp_path):
    # an x86 core in a SoC; an L2 shared by more cores than the cluster has
    x86 = _edit(X3, name="x86core", isa="x86-64", vendor="x86", features=["avx2", "fma"], vector_bits=256,
                vector_registers=16, qemu_cpu="")
    for arm_only in ("sdot_per_cycle", "smmla_per_cycle"):   # int8 dot-product rates need dotprod / i8mm
        x86.pop(arm_only, None)
        x86["uncertain"] = [u for u in x86.get("uncertain", []) if u != arm_only]
    _write(tmp_path / "a", "cpu/x86core.yaml", x86)
    soc = _write(tmp_path / "a", SD, _edit(SD, clusters__0__core="x86core"))
    with pytest.raises(XfcError, match=r"field 'clusters\[0\]\.core': 'x86core' is an x86-64 core"):
        validate_file(soc)
    _write(tmp_path / "b", "cpu/cortex-a510.yaml", _edit("cpu/cortex-a510.yaml", l2__shared_by_cores=4))
    soc = _write(tmp_path / "b", SD, yaml.safe_load((SHIPPED_ROOT / SD).read_text()))
    with pytest.raises(XfcError, match=r"field 'clusters\[3\]\.count': 3 is fewer than the 4 cores that share"):
        validate_file(soc)


# ---------------------------------------------------------------------------------------------
# Accepted extremes: nothing downstream crashes on a value the loader lets through.
# ---------------------------------------------------------------------------------------------

EXTREME_FILES = ("cpu/cortex-x3.yaml", "cpu/cortex-a55.yaml", "gpu/adreno-740.yaml", "gpu/mali-g710.yaml",
                 "soc/snapdragon-8-gen-2.yaml", "soc/kirin-980.yaml")


def _ranged_paths(data: dict):
    kind = data["kind"]
    for key in PLAUSIBLE:
        k, field = key.split(".", 1)
        if k != kind or field.endswith("[]"):
            continue  # cpu ids are covered by the cross-field tests (they must stay 0..N-1)
        if field.startswith("clusters[]."):
            for i in range(len(data["clusters"])):
                yield key, ("clusters", i, *field[len("clusters[]."):].split("."))
        else:
            yield key, tuple(field.split("."))


def _extreme_params():
    for rel in EXTREME_FILES:
        data = yaml.safe_load((SHIPPED_ROOT / rel).read_text())
        for key, path in _ranged_paths(data):
            yield pytest.param(rel, key, path, id=f"{rel}:{_path_text(path)}")


@pytest.mark.sweep
@pytest.mark.matrix(every=2, cover=("rel", "key"))   # every file and range kind stays in the sample
@pytest.mark.parametrize("rel,key,path", list(_extreme_params()))
def test_accepted_extremes_crash_nothing_downstream(tmp_path, capsys, rel, key, path):
    from xfc.cpu.codegen import render_cpu_kernel
    from xfc.gpu.codegen import render_kernel
    from xfc.gpu.synth import synthesize_gpu
    from xfc.ops.spec import make_spec
    from xfc.cpu.synth import synthesize_cpu

    specs = (make_spec("matmul", {"m": 13, "n": 17, "k": 9}),
             make_spec("conv2d", {"n": 1, "h": 9, "w": 7, "c": 5, "k": 6, "r": 3, "s": 3}, pad=1),
             make_spec("depthwise", {"n": 1, "h": 9, "w": 11, "c": 5, "r": 3, "s": 3}))
    data = yaml.safe_load((SHIPPED_ROOT / rel).read_text())
    rng = PLAUSIBLE[key]
    for bound in (rng.low, rng.high):
        target = _write(tmp_path / str(bound), rel, _replaced(data, path, bound))
        try:
            hw = validate_file(target)
        except XfcError as exc:   # a cross-field rule may refuse the extreme: still one clean line
            assert "\n" not in str(exc) and Path(rel).name in str(exc)
            continue
        figs = derived_figures(hw)
        assert all(v is None or math.isfinite(v) for v in figs.values() if isinstance(v, float))
        json.dumps(hardware_summary(hw))
        for argv in (["hw", "show", str(target)], ["hw", "show", str(target), "--json"]):
            status, lines = _run(capsys, *argv)
            assert status == 0, (argv, lines)
        for spec in specs:
            try:
                if hw.clusters:
                    render_cpu_kernel(synthesize_cpu(spec, hw).plan)
                if hw.gpu:
                    for dtype in ("fp32", "fp16"):
                        render_kernel(synthesize_gpu(spec, hw, dtype=dtype).plan)
            except XfcError as exc:  # e.g. no GPU tile fits 8 registers: a clean refusal is fine
                assert "\n" not in str(exc)


# ---------------------------------------------------------------------------------------------
# The range table, the schema and SCHEMA.md agree.
# ---------------------------------------------------------------------------------------------

def _schema_plausible_keys(checker, found: list):
    key = getattr(checker, "plausible_key", None)
    if key:
        found.append(key)
    for sub in getattr(checker, "schema", {}).values():
        _schema_plausible_keys(sub[1], found)
    if getattr(checker, "item", None) is not None:
        _schema_plausible_keys(checker.item, found)


def test_every_range_is_used_once_by_the_schema():
    found: list[str] = []
    for schema in SCHEMAS.values():
        for _, check in schema.values():
            _schema_plausible_keys(check, found)
    assert sorted(found) == sorted(PLAUSIBLE)


def test_schema_md_carries_the_current_range_table():
    text = SCHEMA_MD.read_text()
    assert schema_md_with_table(text) == text, (
        "hardware_descriptions/SCHEMA.md is out of date; run "
        "python -c 'import xfc.hardware.ranges as r; r.write_schema_md()'")
