"""xfc hw probe without a device (issue 15): the parsers, drafting from the files the virtual
device serves for every shipped SoC, unknown CPU parts, missing cache entries, older-kernel
/proc/cpuinfo, comparing with shipped descriptions, and writing drafts (xfc/hwprobe/)."""
from __future__ import annotations

from pathlib import Path

import pytest

from android_runner.device_system import Faults, FakeSystem, soc_names
from xfc.errors import HardwareError
from xfc.hardware import SHIPPED_ROOT, validate_file
from xfc.hardware.load import read_yaml
from xfc.hwprobe import compare, draft_description, facts_from_files, parse_cpuinfo, validate_draft, write_draft
from xfc.hwprobe.facts import cluster_facts
from xfc.hwprobe.parse import parse_cpulist, parse_gpu, parse_meminfo_bytes, parse_size_bytes
from xfc.hwprobe.render import render_draft
from xfc.outputs import OutputError
from xfc.hardware.identity import soc_description

from support.hwprobe import at

pytestmark = pytest.mark.unit

V82 = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp"


def device_files(soc: str, **faults) -> tuple[dict, dict]:
    """(props, files) exactly as the virtual device of this SoC serves them."""
    system = FakeSystem(soc_description(soc), Path("/nonexistent"), Faults(**faults), "x")
    return dict(system.props), {k: v.decode() for k, v in system.fake_files().items()}


def probe(soc: str, props=None, edit=None, name=None, **faults):
    p, files = device_files(soc, **faults)
    if edit:
        edit(files)
    return draft_description(facts_from_files("SER", p if props is None else props, files), name=name)


def device_paths(draft) -> list[str]:
    return [p for p, s in draft.provenance.items() if s.startswith("device:SER ")]


# --------------------------------------------------------------------------------------------
# parsers
# --------------------------------------------------------------------------------------------

def test_parse_cpuinfo_current_format():
    text = "".join(f"processor\t: {i}\nBogoMIPS\t: 38.40\nFeatures\t: {V82}\nCPU implementer\t: 0x51\n"
                   f"CPU architecture: 8\nCPU variant\t: 0x{'d' if i > 3 else '7'}\nCPU part\t: "
                   f"0x{'804' if i > 3 else '805'}\nCPU revision\t: {14 if i > 3 else 12}\n\n" for i in range(8))
    info = parse_cpuinfo(text + "Hardware\t: Qualcomm Technologies, Inc KONA\n")
    assert info.format == "per-cpu" and info.cpus == tuple(range(8)) and info.shared_midr is None
    assert (info.midr(0).implementer, info.midr(0).part, info.midr(0).variant, info.midr(0).revision) == \
        (0x51, 0x805, 0x7, 12)
    assert info.midr(7).key == (0x51, 0x804) and info.midr(7).variant == 0xD
    assert "asimddp" in info.features[5] and info.hardware == "Qualcomm Technologies, Inc KONA"


@pytest.mark.parametrize("features_first", [False, True])
def test_parse_cpuinfo_older_kernel_formats(features_first):
    # 3.10-era arm64: every processor line, then ONE block (the reading CPU's MIDR).
    block = "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32\n"
    ids = "CPU implementer\t: 0x41\nCPU architecture: AArch64\nCPU variant\t: 0x0\nCPU part\t: 0xd03\nCPU revision\t: 4\n"
    procs = "".join(f"processor\t: {i}\n" for i in range(4))
    text = ("Processor\t: AArch64 Processor rev 4 (aarch64)\n" + (block + procs + ids if features_first
                                                                  else procs + block + ids))
    info = parse_cpuinfo(text + "\nHardware\t: Qualcomm Technologies, Inc MSM8953\n")
    assert info.format == "older-kernel" and info.cpus == (0, 1, 2, 3) and info.midrs == {}
    assert info.shared_midr.key == (0x41, 0xD03)
    assert all(info.features[c] == tuple(block.split(":")[1].split()) for c in range(4))


def test_small_file_parsers():
    assert parse_cpulist("0-3,6\n") == (0, 1, 2, 3, 6) and parse_cpulist("4 5 6 ") == (4, 5, 6)
    assert parse_cpulist("7") == (7,) and parse_cpulist("") == () and parse_cpulist("x-1") == ()
    assert parse_size_bytes("32K\n") == 32768 and parse_size_bytes("4096K") == 4 << 20
    assert parse_size_bytes("1M") == 1 << 20 and parse_size_bytes("64") == 64 and parse_size_bytes("big") is None
    assert parse_meminfo_bytes("MemTotal:        7612340 kB\nMemFree: 1 kB\n") == 7612340 * 1024
    assert parse_meminfo_bytes("") is None


def test_gpu_from_driver_files_or_properties():
    adreno = parse_gpu("S", {}, {"/sys/class/kgsl/kgsl-3d0/gpu_model": "Adreno660v1\n",
                                 "/sys/class/kgsl/kgsl-3d0/max_gpuclk": "840000000\n"})
    assert (adreno.family, adreno.model, adreno.clock_mhz, adreno.compute_units) == ("adreno", "adreno-660", 840.0, None)
    assert adreno.source == "device:S /sys/class/kgsl/kgsl-3d0/gpu_model"
    mali = parse_gpu("S", {}, {"/sys/class/misc/mali0/device/gpuinfo": "Mali-G78 14 cores r1p1 0x9093\n"})
    assert (mali.family, mali.model, mali.compute_units, mali.clock_mhz) == ("mali", "mali-g78", 14, None)
    only_prop = parse_gpu("S", {"ro.hardware.egl": "mali"}, {})
    assert (only_prop.family, only_prop.model) == ("mali", "")
    assert parse_gpu("S", {"ro.hardware.egl": "swiftshader"}, {}) is None


# --------------------------------------------------------------------------------------------
# drafting from what the virtual device serves, for every SoC it can play
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("soc", soc_names())
def test_draft_validates_and_agrees_with_the_shipped_description(soc):
    draft = probe(soc)
    hw, shipped = validate_draft(draft), soc_description(soc)
    assert draft.match.name == soc and draft.name == f"{soc}-probed" and not draft.new_cores
    assert [(c.role, c.core.name, c.count, c.cpu_ids, c.clock_ghz, c.l2.size_bytes) for c in hw.clusters] == \
        [(c.role, c.core.name, c.count, c.cpu_ids, c.clock_ghz, c.l2.size_bytes) for c in shipped.clusters]
    assert hw.l3_bytes == shipped.l3_bytes and hw.gpu.name == shipped.gpu.name
    assert hw.gpu.compute_units == shipped.gpu.compute_units and hw.gpu.max_clock_mhz == shipped.gpu.max_clock_mhz
    result = compare(draft, shipped)
    assert result.agrees, [d.line() for d in result.differences]
    assert len(result.checked) > 20
    # What the device shows is cited from the device; the rest is uncertain.
    for path in ("clusters.big.cpu_ids", "clusters.big.max_clock_ghz", "clusters.little.core", "gpu.ref"):
        assert draft.provenance[path].startswith("device:SER /"), path
    assert {"memory.type", "memory.peak_bandwidth_gbps", "slc_kib"} <= set(draft.uncertain)
    assert not set(device_paths(draft)) & set(draft.uncertain)


def test_snapdragon_865_matches_the_shipped_file_on_every_field_the_device_exposes():
    draft = probe("snapdragon-865")
    shipped = read_yaml(SHIPPED_ROOT / "soc" / "snapdragon-865.yaml")
    exposed = device_paths(draft)
    for role in ("prime", "big", "little"):
        for key in ("role", "core", "count", "max_clock_ghz", "cpu_ids", "cpuinfo", "l2_kib"):
            assert f"clusters.{role}.{key}" in exposed
    assert {"l3_kib", "gpu.ref", "gpu.clock_mhz", "vendor", "android.soc_model", "android.board_platform",
            "android.soc_manufacturer"} <= set(exposed)
    for path in exposed:
        assert at(draft.data, path) == at(shipped, path), path
    # The YAML written for it reads back to the same values.
    text = render_draft(draft)["snapdragon-865-probed.yaml"]
    assert text.startswith("# xfc hw probe draft") and "l2_kib: 512  # device:SER /sys/devices/system/cpu/cpu7" in text


def test_compare_reports_each_disagreement_with_its_source():
    def slower_prime(files):
        files["/sys/devices/system/cpu/cpu7/cpufreq/cpuinfo_max_freq"] = "3187200\n"
        files["/sys/devices/system/cpu/cpu7/cache/index2/size"] = "1024K\n"
    draft = probe("snapdragon-865", edit=slower_prime)
    lines = [d.line() for d in compare(draft, soc_description("snapdragon-865")).differences]
    assert lines == [
        "clusters.prime.max_clock_ghz: shipped 2.84 GHz, device 3.1872 GHz  "
        "(device:SER /sys/devices/system/cpu/cpu7/cpufreq/cpuinfo_max_freq)",
        "clusters.prime.l2_kib: shipped 512 KiB, device 1024 KiB  (device:SER /sys/devices/system/cpu/cpu7/cache/index2)"]
    # A Kirin 980 is not a Snapdragon 855: cluster layout, clocks, parts, GPU all differ.
    kirin = compare(probe("kirin-980"), soc_description("snapdragon-855"))
    fields = {d.field for d in kirin.differences}
    assert {"clusters.prime.max_clock_ghz", "clusters.prime.core", "gpu.ref", "android.soc_model"} <= fields
    with pytest.raises(HardwareError, match="compare against a SoC"):
        compare(probe("kirin-980"), validate_file(SHIPPED_ROOT / "cpu" / "cortex-a55.yaml"))


# --------------------------------------------------------------------------------------------
# what the device cannot tell
# --------------------------------------------------------------------------------------------

def _unknown_parts(files):
    files["/proc/cpuinfo"] = (files["/proc/cpuinfo"].replace("CPU part\t: 0x804", "CPU part\t: 0xd81")
                              .replace("CPU implementer\t: 0x51\nCPU architecture: 8\nCPU variant\t: 0x1\n"
                                       "CPU part\t: 0xd81", "CPU implementer\t: 0x41\nCPU architecture: 8\n"
                                       "CPU variant\t: 0x1\nCPU part\t: 0xd81"))


def test_unknown_cpu_part_gets_a_new_core_file_with_uncertain_fields(tmp_path):
    draft = probe("snapdragon-865", props={"ro.product.cpu.abi": "arm64-v8a"}, edit=_unknown_parts,
                  name="my-phone")
    assert draft.match.name is None and [c.name for c in draft.new_cores] == ["cortex-a720"]
    core = draft.new_cores[0]
    assert core.data["cpuinfo"] == {"implementer": 0x41, "part": 0xD81}
    assert core.data["l1d"] == {"size_kib": 64, "line_bytes": 64, "ways": 4}           # read from sysfs
    assert core.data["features"] == ["neon", "fp16", "dotprod"] and core.data["isa"] == "armv8.2-a"
    assert {"fma_per_cycle", "fma_latency_cycles", "pipeline", "load_rules.ld128_blocking_cycles"} <= \
        set(core.data["uncertain"])
    assert "l1d.size_kib" not in core.data["uncertain"]
    assert at(draft.data, "clusters.prime.core") == at(draft.data, "clusters.big.core") == "cortex-a720"
    assert at(draft.data, "clusters.little.core") == "cortex-a55"     # 0x51/0x805 is known: Kryo silver
    assert any("0xd81 matches no shipped core" in n for n in draft.notes)
    files = write_draft(draft, tmp_path / "my-phone.yaml")
    assert sorted(p.name for p in files) == ["cortex-a720.yaml", "my-phone.yaml"]
    hw = validate_file(tmp_path / "my-phone.yaml")
    assert hw.cluster("prime").core.name == "cortex-a720" and hw.cluster("prime").core.fma_per_cycle == 2
    assert "cortex-a720:fma_per_cycle" in hw.uncertain
    # A part of an implementer without a name table: named by implementer and part.
    draft = probe("snapdragon-865", props={}, name="fruit", edit=lambda f: f.__setitem__(
        "/proc/cpuinfo", f["/proc/cpuinfo"].replace("0x51", "0x61").replace("0x804", "0x022")))
    assert {c.name for c in draft.new_cores} == {"apple-part-022", "apple-part-805"}
    validate_draft(draft)


def test_missing_cache_entries_come_from_the_matched_description_or_are_uncertain():
    draft = probe("exynos-2100", drop_cache_levels=(1, 2, 3))
    validate_draft(draft)
    assert {"clusters.prime.l2_kib", "l3_kib"} <= set(draft.uncertain)
    assert draft.provenance["l3_kib"].startswith("shipped soc/exynos-2100.yaml")
    assert compare(draft, soc_description("exynos-2100")).agrees
    # Unknown parts and no cacheinfo: placeholders, all listed under uncertain.
    draft = probe("exynos-2100", props={}, name="bare", drop_cache_levels=(1, 2, 3),
                  edit=lambda f: f.__setitem__("/proc/cpuinfo", f["/proc/cpuinfo"].replace("0xd44", "0xd82")))
    core = next(c for c in draft.new_cores if c.name == "cortex-x4")
    assert {"l1d.size_kib", "l2.size_kib", "l2.shared_by_cores"} <= set(core.data["uncertain"])
    assert "l3_kib" in draft.uncertain and draft.data["l3_kib"] is None
    validate_draft(draft)


def test_older_kernel_cpuinfo():
    # Matched by properties: the cores come from the matched description, marked uncertain.
    draft = probe("snapdragon-855", cpuinfo_format="older-kernel")
    validate_draft(draft)
    assert draft.facts.cpuinfo.format == "older-kernel"
    assert {"clusters.prime.core", "clusters.big.core", "clusters.little.core"} <= set(draft.uncertain)
    assert [c["core"] for c in draft.data["clusters"]] == ["cortex-a76", "cortex-a76", "cortex-a55"]
    assert compare(draft, soc_description("snapdragon-855")).agrees
    # No properties to match and several clusters: one line, exit 2.
    with pytest.raises(HardwareError) as exc:
        probe("snapdragon-855", props={}, cpuinfo_format="older-kernel")
    msg = str(exc.value)
    assert "older-kernel format" in msg and "3 clusters" in msg and "\n" not in msg and exc.value.exit_code == 2


def test_one_policy_with_two_parts_and_too_many_clusters():
    def mixed(files):
        files["/proc/cpuinfo"] = files["/proc/cpuinfo"].replace(
            "CPU part\t: 0x805", "CPU part\t: 0x804", 1)           # cpu0 claims a gold part
    draft = probe("snapdragon-865", edit=mixed)
    assert any("report different parts" in n for n in draft.notes)
    assert at(draft.data, "clusters.little.core") == "cortex-a55"

    def five_policies(files):
        for cpu, group in ((0, "0 1"), (1, "0 1"), (2, "2"), (3, "3")):
            files[f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/related_cpus"] = group + "\n"
        files["/sys/devices/system/cpu/cpu2/cpufreq/cpuinfo_max_freq"] = "1700000\n"
        files["/sys/devices/system/cpu/cpu3/cpufreq/cpuinfo_max_freq"] = "1600000\n"
    with pytest.raises(HardwareError, match="5 CPU clusters"):
        probe("snapdragon-865", edit=five_policies)


def test_no_cpufreq_groups_cpus_by_part():
    def no_cpufreq(files):
        for path in [p for p in files if "/cpufreq/" in p]:
            del files[path]
    draft = probe("snapdragon-865", edit=no_cpufreq)
    # 0x51/0x804 (gold) and 0x51/0x805 (silver): two groups, their cores as in the matched SoC;
    # clocks are then not known.
    assert [(c["core"], c["count"]) for c in draft.data["clusters"]] == [("cortex-a77", 4), ("cortex-a55", 4)]
    assert "clusters.big.max_clock_ghz" in draft.uncertain
    validate_draft(draft)
    assert not compare(draft, soc_description("snapdragon-865")).agrees   # 2 policies vs 3 clusters


def test_no_cpus_at_all_is_one_line():
    with pytest.raises(HardwareError, match="neither /proc/cpuinfo nor /sys/devices/system/cpu lists any CPU"):
        facts_from_files("SER", {}, {})


# --------------------------------------------------------------------------------------------
# rendering and writing
# --------------------------------------------------------------------------------------------

def test_device_strings_are_quoted_safely():
    props = {"ro.soc.model": 'X"1 #: [a]\nb', "ro.board.platform": "plat: {x}", "ro.product.cpu.abi": "arm64-v8a"}
    draft = probe("snapdragon-888", props=props, name="odd")
    hw = validate_draft(draft)
    assert hw.android.soc_models == ('X"1 #: [a]\nb',) and hw.android.board_platforms == ("plat: {x}",)


def test_write_draft_owns_only_its_files(tmp_path):
    draft = probe("dimensity-1200", name="mine")
    dest = tmp_path / "sub" / "mine.yaml"
    assert write_draft(draft, dest) == [dest]
    first = dest.read_text()
    assert validate_file(dest).name == "mine"
    write_draft(draft, dest)                               # its own earlier draft: replaced
    assert dest.read_text() == first
    foreign = tmp_path / "theirs.yaml"
    foreign.write_text("kind: soc\n")
    with pytest.raises(OutputError, match="not written by xfc"):
        write_draft(probe("dimensity-1200", name="theirs"), foreign)
    assert foreign.read_text() == "kind: soc\n"
    with pytest.raises(OutputError, match="must be mine.yaml"):
        write_draft(draft, tmp_path / "other.yaml")
    # A foreign file where a new core file would go: refused before anything is written.
    unknown = probe("snapdragon-865", props={}, name="ph", edit=_unknown_parts)
    (tmp_path / "cortex-a720.yaml").write_text("user file\n")
    with pytest.raises(OutputError, match="cortex-a720.yaml"):
        write_draft(unknown, tmp_path / "ph.yaml")
    assert not (tmp_path / "ph.yaml").exists() and (tmp_path / "cortex-a720.yaml").read_text() == "user file\n"
    with pytest.raises(HardwareError, match="draft name 'Bad Name'"):
        probe("dimensity-1200", name="Bad Name")


def test_cluster_facts_order_and_sharing():
    props, files = device_files("snapdragon-8-gen-2")
    clusters = cluster_facts(facts_from_files("SER", props, files))
    assert [c.cpu_ids for c in clusters] == [(7,), (5, 6), (3, 4), (0, 1, 2)]
    assert clusters[-1].l2_shared_by == 2 and clusters[0].l2_shared_by == 1   # the A510 complex
