"""The host description as measured (issue 17 part 2): the probe's figures enter `--hw host`,
quantized so noise cannot change a kernel; `xfc hw show host` says which figures were measured;
`--remeasure`; the assumed fallback when the probe cannot run."""
from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from xfc.hardware.host import X86_64_V4_FLAGS
from xfc.hardware.host import HostMeasurement, describe_host
from xfc.ops.spec import make_spec
from xfc.cpu.synth import synthesize_cpu

X86 = platform.machine() in ("x86_64", "AMD64")
FACTS = {"flags": set(X86_64_V4_FLAGS), "model name": "Recorded CPU", "cpu MHz": "2100.000"}


def _measurement(clock_ghz, rate512, rate256, latency, cached=True):
    return HostMeasurement(clock_ghz=clock_ghz, fma_per_cycle=((128, 2.0), (256, rate256), (512, rate512)),
                           fma_latency_cycles=latency, measured_at="2026-01-01T00:00:00Z", cached=cached)


@pytest.mark.unit
@pytest.mark.parametrize("isa,rate512,rate256,want", [
    ("avx512", 1.04, 2.0, 1.0),      # Zen 4: 512-bit FMAs split in two
    ("avx512", 1.96, 2.0, 2.0),      # two full-width ports
    ("avx2", 2.0, 0.97, 1.0),        # Zen 1: 256-bit split
    ("avx2", 2.0, 1.48, 1.5),
])
def test_measured_rate_replaces_the_assumption(isa, rate512, rate256, want):
    hw = describe_host(FACTS, {}, 2, "x86_64", isa=isa, measured=_measurement(3.61, rate512, rate256, 4.1))
    core, cluster = hw.cluster().core, hw.cluster()
    assert core.fma_per_cycle == want and core.fma_latency_cycles == 4
    assert cluster.clock_ghz == pytest.approx(3.6), "clock quantized to 0.05 GHz"
    assert not any(u in hw.uncertain for u in ("host:fma_per_cycle", "host:fma_latency_cycles", "host:clock_ghz"))
    assert "measured by the host FMA probe" in hw.notes and "2026-01-01T00:00:00Z" in hw.notes


@pytest.mark.unit
def test_probe_noise_cannot_change_the_kernel():
    """Two probe runs that differ by run-to-run noise give one description and one plan (the
    quantization absorbs noise inside one bin; across machines or sessions the cached result keeps
    the description stable until --remeasure)."""
    spec = make_spec("conv2d", dict(c=64, h=28, w=28, k=64, r=3, s=3), pad=1)
    a = describe_host(FACTS, {}, 2, "x86_64", measured=_measurement(3.612, 1.93, 1.97, 4.2))
    b = describe_host(FACTS, {}, 2, "x86_64", measured=_measurement(3.621, 2.07, 2.02, 3.8, cached=False))
    assert a.clusters == b.clusters
    assert synthesize_cpu(spec, a, threads=1).plan == synthesize_cpu(spec, b, threads=1).plan


@pytest.mark.unit
def test_measured_dram_read_replaces_the_assumed_bandwidth_in_stable_steps():
    from xfc.hardware.host import ASSUMED_DRAM_GBPS, quantized_dram_gbps
    base = _measurement(3.61, 2.0, 2.0, 4.0)
    assumed = describe_host(FACTS, {}, 2, "x86_64", measured=base)
    assert assumed.memory.peak_bandwidth_gbps == ASSUMED_DRAM_GBPS and "host:memory.peak_bandwidth_gbps" in assumed.uncertain
    hw = describe_host(FACTS, {}, 2, "x86_64", measured=HostMeasurement(**{**base.__dict__, "dram_read_gbps": 31.7}))
    assert hw.memory.peak_bandwidth_gbps == quantized_dram_gbps(31.7)
    assert abs(hw.memory.peak_bandwidth_gbps / 31.7 - 1) <= 0.025, "5% steps: within half a step"
    assert "host:memory.peak_bandwidth_gbps" not in hw.uncertain and "sustained read" in hw.notes
    # and the cost model knows it is a measured sustained read, not a peak to derate
    assert hw.memory.measured_sustained_read and not assumed.memory.measured_sustained_read
    # Noise of a percent either way keeps one value (away from a step boundary), so one kernel.
    assert quantized_dram_gbps(31.4) == quantized_dram_gbps(31.9)
    assert quantized_dram_gbps(20.0) < quantized_dram_gbps(22.0) < quantized_dram_gbps(25.0)


@pytest.mark.unit
def test_probe_dram_figure_is_the_faster_of_one_thread_and_all():
    from xfc.tiledb.probe import dram_read_gbps, implausible
    text = "add 100 1e-6\ndram1 1000000000 0.04\ndram1 1000000000 0.05\ndram 1000000000 0.08\n"
    assert dram_read_gbps(text) == pytest.approx(25.0)       # another process held a core for the all-CPU run
    assert dram_read_gbps("dram 2000000000 0.05\ndram1 1000000000 0.05\n") == pytest.approx(40.0)
    assert dram_read_gbps("add 100 1e-6\n") is None
    assert "DRAM" in implausible(3.0, {256: 2.0}, 4.0, 0.01) and implausible(3.0, {256: 2.0}, 4.0, 30.0) == ""


@pytest.mark.unit
def test_without_a_measurement_the_figures_stay_assumed_and_say_so():
    hw = describe_host(FACTS, {}, 2, "x86_64")
    assert hw.cluster().core.fma_per_cycle == 2 and hw.cluster().clock_ghz == 2.1
    assert {"host:fma_per_cycle", "host:fma_latency_cycles"} <= set(hw.uncertain)
    assert "assumptions" in hw.notes


def _xfc(*args, env_extra=None, tmp_path: Path):
    env = {**os.environ, "XFC_CACHE_DIR": str(tmp_path / "cache"), **(env_extra or {})}
    env.pop("XFC_HOST_ISA", None)
    return subprocess.run([sys.executable, "-m", "xfc", *args], capture_output=True, text=True, env=env, timeout=120)


pytestmark_host = pytest.mark.skipif(not X86 or shutil.which("gcc") is None, reason="the host probe needs x86-64 and gcc")


@pytest.mark.host
@pytestmark_host
def test_hw_show_host_reports_measured_figures_and_remeasures(tmp_path):
    first = _xfc("hw", "show", "host", "--json", tmp_path=tmp_path)
    assert first.returncode == 0, first.stderr
    data = json.loads(first.stdout)
    figures = dict(data["host_figures"])
    # one core's L3 read: measured where an L3 holds the probe's buffer (xfc.tiledb.probe)
    l3_read = figures.pop("shared_cache_read_gbps", None)
    assert l3_read in (None, "measured (one core)") or l3_read.startswith("not measured")
    assert (l3_read == "measured (one core)") == bool(data.get("shared_cache_read_gbps"))
    # every CPU against one reading past the L3: measured where there is an L3 and more than one CPU
    overflow = figures.pop("l3_overflow_read_speedup", None)
    assert overflow in (None, "measured (every CPU against one thread, less the DRAM figure's share)",
                        "measured (below 1.5x: not used)") or overflow.startswith("not measured")
    assert overflow.startswith("measured (every") == bool(data.get("l3_overflow_read_speedup"))
    if data.get("l3_overflow_read_speedup"):   # half steps above 1, no more than the CPUs it counts
        assert data["l3_overflow_read_speedup"] in [1.5 + step / 2 for step in range(2 * data["clusters"][0]["count"])]
        assert data["l3_overflow_read_speedup"] <= data["clusters"][0]["count"]
    assert figures == {"fma_per_cycle": "measured", "fma_latency_cycles": "measured",
                       "clock_ghz": "measured", "memory.peak_bandwidth_gbps": "measured (sustained read)"}
    assert "just now" in data["notes"] and "host:fma_per_cycle" not in data["uncertain"]
    assert "host:memory.peak_bandwidth_gbps" not in data["uncertain"]
    assert 0.5 <= data["memory"]["peak_bandwidth_gbps"] <= 2000
    core = data["clusters"][0]["core"]
    assert core["fma_per_cycle"] * 2 == int(core["fma_per_cycle"] * 2) and 0.5 <= core["fma_per_cycle"] <= 4
    again = json.loads(_xfc("hw", "show", "host", "--json", tmp_path=tmp_path).stdout)
    assert "(cached;" in again["notes"] and again["clusters"] == data["clusters"]
    table = _xfc("hw", "show", "host", "--remeasure", tmp_path=tmp_path)
    assert table.returncode == 0, table.stderr
    assert "Host figures:" in table.stdout and "just now" in table.stdout
    assert table.stdout.count("measured") >= 4 and "GB/s DRAM" in table.stdout


@pytest.mark.host
@pytestmark_host
def test_probe_off_or_impossible_keeps_assumptions_with_one_warning(tmp_path):
    off = json.loads(_xfc("hw", "show", "host", "--json", env_extra={"XFC_HOST_PROBE": "off"}, tmp_path=tmp_path).stdout)
    assert off["host_figures"]["fma_per_cycle"] == "assumed" and "host:fma_per_cycle" in off["uncertain"]
    # No compiler on PATH: the probe cannot run; the description still loads, one warning line.
    bare = tmp_path / "bin"
    bare.mkdir()
    proc = _xfc("hw", "show", "host", "--json", tmp_path=tmp_path,
                env_extra={"PATH": str(bare), "XFC_CACHE_DIR": str(tmp_path / "empty-cache")})
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(proc.stdout)["host_figures"]
    assert figures["fma_per_cycle"] == "assumed" and figures["clock_ghz"] != "measured"
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "host FMA figures stay assumed" in lines[0] and "Traceback" not in proc.stderr


@pytest.mark.subprocess
def test_remeasure_is_for_the_host_only(tmp_path):
    proc = _xfc("hw", "show", "cortex-a55", "--remeasure", tmp_path=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == ("xfc: error: --remeasure: only the host is measured "
                                                    "('xfc hw show host --remeasure'), not cortex-a55")


@pytest.mark.unit
def test_a_probe_disturbed_by_another_process_is_rejected():
    from xfc.tiledb.probe import implausible
    assert implausible(3.6, {256: 2.0, 512: 1.0}, 4.0) == ""
    # The integer-add clock run shared its core: clock reads low, FMAs per cycle high, latency short.
    assert "FMA latency" in implausible(1.6, {512: 4.5}, 1.8)
    assert "FMAs per cycle" in implausible(3.0, {512: 3.1}, 4.0)
    assert "clock" in implausible(0.1, {512: 2.0}, 4.0)


@pytest.mark.unit
def test_the_l3_read_probe_and_its_figure_in_the_description():
    from xfc.hardware.host import quantized_dram_gbps
    from xfc.tiledb.fingerprint import cluster_facts, fingerprint
    from xfc.tiledb.probe import shared_cache_buffer_bytes, shared_cache_read_gbps
    mib = 1 << 20
    assert shared_cache_buffer_bytes(2 * mib, 480 * mib) == 8 * mib          # 4 x L2, inside half the L3
    assert shared_cache_buffer_bytes(1 * mib, 32 * mib) == 4 * mib
    assert shared_cache_buffer_bytes(2 * mib, 12 * mib) == 0                 # would not stay in half of it
    assert shared_cache_buffer_bytes(2 * mib, None) == 0 and shared_cache_buffer_bytes(None, 32 * mib) == 0
    text = "dram 1000000000 0.05\nl3 800000000 0.04\nl3 800000000 0.03\n"
    assert shared_cache_read_gbps(text) == pytest.approx(800 / 30)            # the best run
    assert shared_cache_read_gbps("dram 1000000000 0.05\n") is None
    base = _measurement(3.61, 2.0, 2.0, 4.0)
    caches = {"L3": {"size_kib": 32768, "line_bytes": 64, "ways": 16, "shared_by_cores": 2}}
    measured = HostMeasurement(**{**base.__dict__, "shared_cache_read_gbps": 27.3})
    hw = describe_host(FACTS, caches, 2, "x86_64", measured=measured)
    assert hw.shared_cache_read_gbps == quantized_dram_gbps(27.3)
    # no L3: no figure, whatever the probe says; not measured: None, and the fingerprint as before
    assert describe_host(FACTS, {}, 2, "x86_64", measured=measured).shared_cache_read_gbps is None
    plain = describe_host(FACTS, caches, 2, "x86_64", measured=base)
    assert plain.shared_cache_read_gbps is None and "shared_cache_read_gbps" not in cluster_facts(plain, plain.cluster())
    assert fingerprint(hw, hw.cluster()) != fingerprint(plain, plain.cluster())


@pytest.mark.unit
def test_a_measured_l3_read_lowers_the_shared_cache_rate_never_raises_it():
    from xfc.cpu.cost_model import DEFAULT_CONSTANTS, SHARED_CACHE_BYTES_PER_CYCLE
    clock_hz = 4e9
    port = SHARED_CACHE_BYTES_PER_CYCLE * clock_hz
    assert DEFAULT_CONSTANTS.shared_cache_bytes_per_s(clock_hz, 1) == port
    assert DEFAULT_CONSTANTS.shared_cache_bytes_per_s(clock_hz, 2, 28.0) == pytest.approx(2 * 28e9)
    assert DEFAULT_CONSTANTS.shared_cache_bytes_per_s(clock_hz, 1, 200.0) == port     # faster than the port


@pytest.mark.unit
def test_the_past_l3_probe_and_its_speedup_in_the_description():
    from xfc.tiledb.fingerprint import cluster_facts, fingerprint
    from xfc.tiledb.probe import l3_overflow_read_speedup, overflow_buffer_bytes
    mib = 1 << 20
    assert overflow_buffer_bytes(32 * mib, 2) == int(1.2 * 32 * mib) // 64 * 64   # a little past the L3
    assert overflow_buffer_bytes(None, 2) == 0 and overflow_buffer_bytes(32 * mib, 1) == 0
    # the best all-CPU run over the best one-thread run, within [1, cpus], less what the DRAM figure
    # (the faster of one thread and every CPU) already holds of it
    dram_alike = "dram1 1000000000 0.040\ndram 1000000000 0.041\n"
    text = dram_alike + "ovf1 900000000 0.030\novf1 900000000 0.031\novf 900000000 0.017\novf 900000000 0.016\n"
    assert l3_overflow_read_speedup(text, 2) == pytest.approx(30 / 16)
    dram_scaled = "dram1 1000000000 0.040\ndram 1000000000 0.025\n"      # every CPU read DRAM 1.6x as fast
    assert l3_overflow_read_speedup(text.replace(dram_alike, dram_scaled), 2) == pytest.approx(30 / 16 / 1.6)
    assert l3_overflow_read_speedup(dram_alike + "ovf1 900000000 0.03\novf 900000000 0.04\n", 2) == 1.0
    assert l3_overflow_read_speedup(dram_alike + "ovf1 900000000 0.03\novf 900000000 0.001\n", 2) == 2.0
    assert l3_overflow_read_speedup(dram_alike + "ovf1 900000000 0.03\n", 2) is None
    assert l3_overflow_read_speedup("ovf1 900000000 0.03\novf 900000000 0.02\n", 2) is None
    base = _measurement(3.61, 2.0, 2.0, 4.0)
    caches = {"L3": {"size_kib": 32768, "line_bytes": 64, "ways": 16, "shared_by_cores": 2}}
    measured = HostMeasurement(**{**base.__dict__, "l3_overflow_read_speedup": 1.81})
    hw = describe_host(FACTS, caches, 2, "x86_64", measured=measured)
    assert hw.l3_overflow_read_speedup == 1.5           # down to half steps
    for speedup, cpus, described in ((1.89, 2, 1.5), (1.64, 2, 1.5), (2.0, 2, 2.0), (1.45, 2, None),
                                     (5.0, 2, 2.0), (5.0, 8, 5.0)):
        # no gain (1): no figure, the fingerprint as without it; never more than the CPUs it counts
        assert describe_host(FACTS, caches, cpus, "x86_64", measured=HostMeasurement(
            **{**base.__dict__, "l3_overflow_read_speedup": speedup})).l3_overflow_read_speedup == described
    # no L3, or one CPU: no figure, whatever the probe says; not measured: the fingerprint as before
    assert describe_host(FACTS, {}, 2, "x86_64", measured=measured).l3_overflow_read_speedup is None
    assert describe_host(FACTS, caches, 1, "x86_64", measured=measured).l3_overflow_read_speedup is None
    plain = describe_host(FACTS, caches, 2, "x86_64", measured=base)
    assert plain.l3_overflow_read_speedup is None
    assert "l3_overflow_read_speedup" not in cluster_facts(plain, plain.cluster())
    assert fingerprint(hw, hw.cluster()) != fingerprint(plain, plain.cluster())


@pytest.mark.unit
def test_hw_show_says_whether_the_past_l3_gain_was_measured_and_used():
    from xfc.tiledb.hostdesc import measured_or_assumed
    base = _measurement(3.61, 2.0, 2.0, 4.0)
    caches = {"L3": {"size_kib": 32768, "line_bytes": 64, "ways": 16, "shared_by_cores": 2}}

    def shown(speedup, isa=None, measured=True):
        m = HostMeasurement(**{**base.__dict__, "l3_overflow_read_speedup": speedup}) if measured else None
        hw = describe_host(FACTS, caches, 2, "x86_64", isa=isa, measured=m)
        return hw.l3_overflow_read_speedup, measured_or_assumed(hw)["l3_overflow_read_speedup"]

    assert shown(2.0) == (2.0, "measured (every CPU against one thread, less the DRAM figure's share)")
    assert shown(1.2) == (None, "measured (below 1.5x: not used)")
    assert shown(None)[1].startswith("not measured") and shown(2.0, measured=False)[1].startswith("not measured")
    assert shown(2.0, isa="avx2") == shown(2.0) and shown(1.2, isa="avx2") == shown(1.2)
