"""Hardware descriptions: every shipped file loads, peaks match hand computation, bad input fails cleanly."""
from __future__ import annotations

import pytest

from xfc.errors import HardwareError
from xfc.hardware.figures import derived_figures
from xfc.hardware.load import load, shipped_files, validate_file
from xfc.hardware.host import (X86_64_V3_FLAGS, X86_64_V4_FLAGS, describe_host, parse_cpuinfo, read_max_clock_ghz,
                               supported_isas)
from xfc.cpu.isa import isa_for

pytestmark = pytest.mark.unit


def test_every_shipped_description_validates():
    files = shipped_files()
    kinds = {"cpu": 0, "gpu": 0, "soc": 0}
    for path in files:
        hw = validate_file(path)
        if path.parent.name in kinds:
            kinds[path.parent.name] += 1
        assert hw.sources, path
    assert kinds["cpu"] >= 10 and kinds["gpu"] >= 7 and kinds["soc"] >= 9, kinds


def test_snapdragon_alias_resolves_to_a_flagship_soc_with_gpu():
    hw = load("snapdragon.yaml")
    assert hw.kind == "soc" and hw.name.startswith("snapdragon-")
    assert hw.gpu is not None and hw.gpu.family == "adreno"
    assert len(hw.clusters) >= 2
    assert load("snapdragon") == hw


def test_names_paths_and_bare_names_resolve_the_same():
    by_name = load("snapdragon-865")
    by_file = load("soc/snapdragon-865.yaml")
    assert by_name == by_file


@pytest.mark.parametrize("name,role,expected_per_core", [
    # peak = vector_bits/32 lanes * 2 FLOP/FMA * FMA per cycle * GHz, computed by hand:
    ("snapdragon-855", "prime", 4 * 2 * 2 * 2.84),   # Cortex-A76 @ 2.84 GHz: 45.44
    ("snapdragon-888", "prime", 4 * 2 * 4 * 2.84),   # Cortex-X1 @ 2.84 GHz: 90.88
    ("snapdragon-855", "little", 4 * 2 * 1 * 1.8),   # Cortex-A55 @ 1.8 GHz: 14.4
])
def test_cpu_peaks_equal_hand_computed_values(name, role, expected_per_core):
    hw = load(name)
    figs = {c["role"]: c for c in derived_figures(hw)["clusters"]}
    assert figs[role]["peak_gflops_per_core"] == pytest.approx(expected_per_core, rel=1e-6)
    cluster = hw.cluster(role)
    assert figs[role]["peak_gflops_cluster"] == pytest.approx(expected_per_core * cluster.count, rel=1e-6)


def test_gpu_peak_and_balance_equal_hand_computed_values():
    hw = load("snapdragon-855")
    g = hw.gpu
    figs = derived_figures(hw)
    assert figs["gpu_peak_fp32_gflops"] == pytest.approx(g.compute_units * g.fp32_flop_per_clock_per_cu
                                                         * g.max_clock_mhz / 1000, rel=1e-6)
    # Adreno 640 @ 585 MHz is specified at 898.5 GFLOP/s.
    assert figs["gpu_peak_fp32_gflops"] == pytest.approx(898.5, rel=0.01)
    cpu_total = sum(c.peak_gflops for c in hw.clusters)
    assert figs["cpu_bytes_per_flop"] == pytest.approx(hw.memory.peak_bandwidth_gbps / cpu_total, abs=1e-4)


def test_mali_local_memory_is_not_on_chip_and_adreno_is():
    assert load("mali-g78").gpu.local_memory_on_chip is False
    assert load("adreno-650").gpu.local_memory_on_chip is True


def test_uncertain_values_are_carried_through():
    hw = load("snapdragon-865")
    assert hw.uncertain and all(":" in u for u in hw.uncertain)


def test_default_cluster_is_big_and_roles_are_checked():
    hw = load("snapdragon-888")
    assert hw.cluster().role == "big"
    assert hw.cluster("prime").core.name == "cortex-x1"
    with pytest.raises(HardwareError, match="no 'mid' cluster"):
        hw.cluster("mid")


def test_host_description_from_recorded_facts():
    info = parse_cpuinfo("processor\t: 0\nmodel name\t: Test CPU\ncpu MHz\t\t: 3000.000\n"
                         f"flags\t\t: fpu sse {' '.join(X86_64_V4_FLAGS)}\n\nprocessor\t: 1\n")
    caches = {"L1d": {"size_kib": 48, "line_bytes": 64, "ways": 12, "shared_by_cores": 1},
              "L2": {"size_kib": 2048, "line_bytes": 64, "ways": 16, "shared_by_cores": 1},
              "L3": {"size_kib": 32768, "line_bytes": 64, "ways": 16, "shared_by_cores": 8}}
    hw = describe_host(info, caches, 8, "x86_64")
    core = hw.cluster().core
    assert core.vector_bits == 512 and core.vector_registers == 32 and isa_for(core) == "avx512"
    assert core.l1d.size_bytes == 48 * 1024 and hw.l3_bytes == 32 * 1024 * 1024
    assert hw.cluster().count == 8
    avx2 = describe_host(parse_cpuinfo(f"cpu MHz : 2000\nflags : {' '.join(X86_64_V3_FLAGS)}\n"), {}, 2, "x86_64")
    assert isa_for(avx2.cluster().core) == "avx2" and avx2.cluster().core.vector_registers == 16
    with pytest.raises(HardwareError, match="x86-64 only"):
        describe_host(info, caches, 1, "aarch64")


def test_host_is_detected_here():
    hw = load("host")
    assert hw.kind == "host" and hw.cluster().count >= 1 and hw.target_arch == "x86_64"


# ---------------------------------------------------------------------------------------------
# Bad input: each class gets a one-line HardwareError naming the file and field.
# ---------------------------------------------------------------------------------------------

GOOD_CORE = """\
kind: cpu_core
name: {name}
sources: [test]
vendor: arm
isa: armv8.2-a
features: [neon, fp16, dotprod]
gcc_march: armv8.2-a+fp16+dotprod
qemu_cpu: cortex-a76
pipeline: out_of_order
decode_width: 4
vector_bits: 128
vector_registers: 32
fma_per_cycle: 2
fma_latency_cycles: 4
load_rules: {{vector_loads_per_cycle: 2, ld128_dual_issues_with_fma: true, ld128_blocking_cycles: 0, ld64_dual_issues_with_fma: true}}
l1d: {{size_kib: 64, line_bytes: 64, ways: 4}}
l2: {{size_kib: 256, line_bytes: 64, ways: 8, shared_by_cores: 1}}
typical_max_clock_ghz: 2.8
"""


def _write(tmp_path, name, text, sub=None):
    folder = tmp_path / sub if sub else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def test_good_core_file_loads(tmp_path):
    hw = validate_file(_write(tmp_path, "mycore", GOOD_CORE.format(name="mycore")))
    assert hw.cluster().core.fma_per_cycle == 2


BAD_CASES = [
    ("not-yaml", "kind: [unclosed\n", "not valid YAML"),
    ("empty", "", "file is empty"),
    ("only-comment", "# nothing\n", "file is empty"),
    ("binary", b"\x00\x01\x02garbage\xff", "binary data"),
    ("not-utf8", b"kind: cpu_core\nname: \xff\xfe\n", "not UTF-8"),
    ("a-list", "- 1\n- 2\n", "top level must be a mapping"),
    ("unknown-key", GOOD_CORE.format(name="unknown-key") + "turbo_mode: true\n", "field 'turbo_mode': unknown key"),
    ("missing-field", GOOD_CORE.format(name="missing-field").replace("fma_per_cycle: 2\n", ""),
     "missing required field 'fma_per_cycle'"),
    ("wrong-type", GOOD_CORE.format(name="wrong-type").replace("vector_registers: 32", "vector_registers: many"),
     "field 'vector_registers': must be an integer"),
    ("zero-size", GOOD_CORE.format(name="zero-size").replace("size_kib: 64", "size_kib: 0"),
     "field 'l1d.size_kib': must be a number from 4 to 256 KiB"),
    ("negative-size", GOOD_CORE.format(name="negative-size").replace("size_kib: 256", "size_kib: -256"),
     "field 'l2.size_kib'"),
    ("bad-kind", "kind: toaster\nname: bad-kind\n", "field 'kind': must be one of"),
    ("python-tag", "kind: !!python/object/apply:os.system ['echo pwned']\nname: python-tag\n", "YAML tag not allowed"),
    ("alias-bomb", "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                   "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n",
     "anchors and aliases are not allowed"),
    ("name-mismatch", GOOD_CORE.format(name="other-name"), "must match the file name"),
    ("dup-key", GOOD_CORE.format(name="dup-key") + "vector_bits: 256\n", "duplicate key"),
    ("bad-uncertain", GOOD_CORE.format(name="bad-uncertain") + "uncertain: [l1d.nonexistent]\n",
     "'l1d.nonexistent' does not name a field"),
    ("line-not-pow2",
     GOOD_CORE.format(name="line-not-pow2").replace("line_bytes: 64, ways: 4", "line_bytes: 48, ways: 4"),
     "field 'l1d.line_bytes': must be a power of two from 16 to 256 bytes"),
    ("too-big", GOOD_CORE.format(name="too-big") + "notes: |\n" + "  padding padding padding\n" * 12000,
     "hardware descriptions are at most 262144"),
]


@pytest.mark.parametrize("name,text,message", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_files_give_one_line_errors_naming_file_and_field(tmp_path, name, text, message):
    path = _write(tmp_path, name, text)
    with pytest.raises(HardwareError) as info:
        validate_file(path)
    text = str(info.value)
    assert message in text
    assert f"{name}.yaml" in text
    assert "\n" not in text


SOC = """\
kind: soc
name: {name}
sources: [test]
vendor: test
marketing_name: Test SoC
clusters:
  - {{role: big, core: {core}, count: 2, max_clock_ghz: 2.0, cpu_ids: [0, 1]}}
l3_kib: 2048
slc_kib: null
gpu: null
memory: {{type: LPDDR5, peak_bandwidth_gbps: 40, channels: 4}}
"""


def test_soc_referencing_a_local_core_file_resolves(tmp_path):
    _write(tmp_path, "mycore", GOOD_CORE.format(name="mycore"), sub="cpu")
    hw = validate_file(_write(tmp_path, "mysoc", SOC.format(name="mysoc", core="mycore"), sub="soc"))
    assert hw.cluster().core.name == "mycore" and hw.cluster().count == 2


def test_unknown_reference(tmp_path):
    path = _write(tmp_path, "mysoc", SOC.format(name="mysoc", core="cortex-z99"), sub="soc")
    with pytest.raises(HardwareError, match=r"clusters\[0\]\.core.*unknown reference 'cortex-z99'"):
        validate_file(path)


def test_reference_to_wrong_kind(tmp_path):
    path = _write(tmp_path, "mysoc", SOC.format(name="mysoc", core="mali-g78"), sub="soc")
    with pytest.raises(HardwareError, match="is a gpu, expected cpu_core"):
        validate_file(path)


def test_reference_cycle(tmp_path):
    _write(tmp_path, "loop-a", "kind: alias\nname: loop-a\nref: loop-b\nsources: []\n")
    path = _write(tmp_path, "loop-b", "kind: alias\nname: loop-b\nref: loop-a\nsources: []\n")
    with pytest.raises(HardwareError, match="reference cycle"):
        validate_file(path)


def test_impossible_soc_cpu_ids(tmp_path):
    text = SOC.format(name="ids", core="cortex-a76").replace("cpu_ids: [0, 1]", "cpu_ids: [0]")
    with pytest.raises(HardwareError, match=r"clusters\[0\]\.cpu_ids.*count is 2"):
        validate_file(_write(tmp_path, "ids", text))


def test_unknown_hardware_name():
    with pytest.raises(HardwareError, match="empty hardware name"):
        load("  ")
    with pytest.raises(HardwareError, match="unknown hardware"):
        load("snapdragon-9999")
    with pytest.raises(HardwareError, match="no such file"):
        load("missing/file.yaml")


# Issue 35 item 7: each -march level is chosen only when the CPU has every feature that level lets
# gcc use (a CPU with AVX512F but not AVX512BW/VL got -march=x86-64-v4 code: SIGILL).
KNIGHTS_LANDING = X86_64_V3_FLAGS + ("avx512f", "avx512cd", "avx512er", "avx512pf")   # no BW, DQ, VL
AVX2_WITHOUT_BMI = tuple(f for f in X86_64_V3_FLAGS if f not in ("bmi1", "bmi2"))     # e.g. a VM that hides BMI


@pytest.mark.unit
@pytest.mark.parametrize("flags, widest, march", [
    (X86_64_V4_FLAGS, "avx512", "x86-64-v4"),
    (KNIGHTS_LANDING, "avx2", "x86-64-v3"),
    (X86_64_V3_FLAGS, "avx2", "x86-64-v3"),
    (AVX2_WITHOUT_BMI, "generic", "x86-64"),
    (tuple(f for f in X86_64_V3_FLAGS if f != "movbe"), "generic", "x86-64"),
    (("fpu", "sse", "sse2"), "generic", "x86-64"),
], ids=["v4", "avx512f-without-bw-vl", "v3", "avx2-without-bmi", "avx2-without-movbe", "baseline"])
def test_host_isa_needs_every_feature_of_its_march_level(flags, widest, march):
    text = f"processor\t: 0\nmodel name\t: synthetic\ncpu MHz\t\t: 2000.000\nflags\t\t: {' '.join(flags)}\n"
    info = parse_cpuinfo(text)
    assert supported_isas(info["flags"])[0] == widest
    core = describe_host(info, {}, 2, "x86_64").cluster().core
    assert (isa_for(core), core.gcc_march) == (widest, march)
    if widest != "avx512":
        with pytest.raises(HardwareError, match="cannot run avx512 code"):
            describe_host(info, {}, 2, "x86_64", isa="avx512")


@pytest.mark.unit
def test_host_clock_is_the_cpufreq_maximum_not_the_momentary_reading(tmp_path):
    """Issue 35 item 7: 'cpu MHz' is the clock of the moment (2.6 GHz read where 3.7 was measured);
    cpufreq's maximum is used where the kernel has one, else the reading is kept and marked uncertain."""
    (tmp_path / "cpuinfo_max_freq").write_text("3700000\n")
    assert read_max_clock_ghz(tmp_path) == 3.7 and read_max_clock_ghz(tmp_path / "absent") is None
    info = parse_cpuinfo(f"cpu MHz : 2600.000\nflags : {' '.join(X86_64_V3_FLAGS)}\n")
    with_max = describe_host(info, {}, 2, "x86_64", max_clock_ghz=3.7)
    momentary = describe_host(info, {}, 2, "x86_64")
    assert with_max.cluster().clock_ghz == 3.7 and "host:clock_ghz" not in with_max.uncertain
    assert momentary.cluster().clock_ghz == 2.6 and "host:clock_ghz" in momentary.uncertain
