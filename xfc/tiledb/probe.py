"""The host probe: vector FMA throughput per width, FMA latency and the running clock, measured.

Why: the host description otherwise assumes two full-width FMAs per cycle, which is wrong on
cores that split wide FMAs (Zen 1/2 at 256 bit, Zen 4 at 512 bit) or have one FMA port.

How (x86-64, one small C program built with the host gcc, well under a second):
  clock       a chain of dependent integer adds (`add r64, r64`: one cycle on every x86-64 core),
              so cycles need neither rdtsc (a reference clock) nor privileges;
  throughput  for each width the CPU supports (128, 256, 512 bit) a loop of independent FMA
              chains (12 for 128/256-bit, 16 for 512-bit: more than latency x ports on current
              cores), FMA instructions per second / clock = FMAs per cycle;
  latency     one dependent FMA chain, clock / (FMAs per second);
  DRAM        one thread, then every CPU (OpenMP), summing its share of a buffer several times
              the L3; the faster is the sustained read bandwidth (a lower bound on the peak; the
              host description uses it as its DRAM bandwidth).
  L3          one thread summing a buffer of SHARED_CACHE_L2_MULTIPLE x its L2, inside half the
              L3, over and over: what one core reads from the shared cache (the description's
              shared_cache_read_gbps). Not measured without an L3 that holds it.
  past the L3 one thread, then every CPU, summing a buffer of OVERFLOW_L3_MULTIPLE x the L3 over
              and over (each CPU its static share): how many times faster all of them read a
              stream a little larger than the L3 than one does, less what the DRAM figure (the
              faster of one thread and every CPU) already holds of it (the description's
              l3_overflow_read_speedup). Not measured without an L3, or with one CPU.
Each figure is the best of a few runs (the most the machine sustains; contention only slows).

The result is cached in the per-user tile database (table `calibration`, subject
'cpu:<key>', source 'host'), keyed by the CPU model, its flags and a hash of the machine id, and
re-measured on request, and once by the first process that finds the machine quiet when the cached
probe ran beside other work (BUSY_LOAD_PER_CPU: its DRAM read can be far low; the higher read is
kept). It is the first measured input of the calibration the tile database
stores: one table, one mechanism.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional

from .._version import __version__
from ..errors import ToolchainError, XfcError
from ..toolchain.tools import run
from ..hardware.host import HostMeasurement, parse_cpuinfo, read_caches
from . import hostcc
from .locations import user_db_path
from .records import CalibrationRow, canonical_json
from .store import TileDb, TileDbError, store_row, utc_now

REPEATS = 7
CHAINS = {128: 12, 256: 12, 512: 16}
ITERS = {"add": 120_000, "fma128": 1_000_000, "fma256": 1_000_000, "fma512": 750_000, "lat": 1_500_000}
ADDS_PER_ITER = 100
WIDTH_FLAGS = {128: ("fma",), 256: ("avx", "fma"), 512: ("avx512f",)}
# the row of l3_overflow_read_speedup's figure: a name of its own, so rows of 8575b28's plain ratio
# (cached as 'l3_overflow_read_speedup') are not read back as it, and such caches are measured again once
OVERFLOW_ROW = "l3_overflow_stream_gain"
FACT_NAMES = ("clock_ghz", "fma_latency_cycles", "dram_read_gbps", "shared_cache_read_gbps", OVERFLOW_ROW)
# The DRAM read buffer: far beyond the last-level cache, so the hardware prefetchers cannot keep
# it on chip (8x the L3 when that is larger; 256 MiB costs ~0.1 s to fault in once).
DRAM_MIN_BYTES = 256 << 20
DRAM_L3_MULTIPLE = 8
MIN_DRAM_GBPS, MAX_DRAM_GBPS = 0.5, 2000.0
# The shared-cache read buffer: several times one core's L2, so the L2 holds little of it, and within
# half of the L3 (cost_model.L3_FILL), so none of it leaves for DRAM. Read SHARED_CACHE_PASSES times
# per timed run (a few ms), after an untimed pass that brings it back from where the DRAM runs pushed it.
SHARED_CACHE_L2_MULTIPLE = 4
SHARED_CACHE_PASSES = 8
# The buffer a little larger than the L3, as a Winograd filter transform just past it (ResNet's
# 512-channel F(4,3): 1.15x a 32 MiB L3), read OVERFLOW_PASSES times per timed run after an untimed
# pass. On the 2-vCPU Zen 4 VM of session 62 two CPUs read it 1.8-2.1x as fast as one, three runs
# (benchmarks/stream_past_cache.py), where the DRAM reads' ratio moved between 1.2x and 2.0x.
OVERFLOW_L3_MULTIPLE = 1.2
OVERFLOW_PASSES = 3
ATTEMPTS = 3                      # probe runs before an implausible result is given up on
MIN_CLOCK_GHZ, MAX_CLOCK_GHZ = 0.4, 7.0
MIN_FMA_LATENCY, MAX_FMA_LATENCY = 2.5, 10.0
MAX_FMA_PER_CYCLE = 2.6           # two FMA ports plus measurement margin
# A probe that starts with a 1-minute load average of at least half a runnable process per CPU ran
# beside other work. Its DRAM read can be far low: on a 2-vCPU EPYC VM one such probe cached
# 8.1 GB/s, where quiet probes read 22.7-23.8 GB/s, and every Winograd plan whose filter streams
# from DRAM was then priced 3x too slow. Such a result is used and cached, marked busy; the first
# process that finds the machine quiet measures again and keeps the higher DRAM read (contention
# only lowers a read, never raises it).
BUSY_LOAD_PER_CPU = 0.5


def _fma_function(bits: int) -> str:
    chains = CHAINS[bits]
    vt, suffix = {128: ("__m128", "_mm"), 256: ("__m256", "_mm256"), 512: ("__m512", "_mm512")}[bits]
    target = "avx512f" if bits == 512 else "avx2,fma"
    decl = ", ".join(f"a{i} = {suffix}_set1_ps(1.0f + {i}e-3f)" for i in range(chains))
    body = " ".join(f"a{i} = {suffix}_fmadd_ps(a{i}, m, d);" for i in range(chains))
    low = {128: "", 256: "_mm256_castps256_ps128", 512: "_mm512_castps512_ps128"}[bits]
    total = " + ".join(f"_mm_cvtss_f32({low}(a{i}))" for i in range(chains))
    return f"""
__attribute__((target("{target}"), noinline)) static void fma{bits}(long iters)
{{
    {vt} {decl};
    const {vt} m = {suffix}_set1_ps(0.9999999f), d = {suffix}_set1_ps(1e-7f);
    for (long i = 0; i < iters; i++) {{ {body} }}
    sink = {total};
}}
"""


def dram_buffer_bytes(l3_bytes: Optional[int]) -> int:
    return max(DRAM_MIN_BYTES, DRAM_L3_MULTIPLE * (l3_bytes or 0))


def shared_cache_buffer_bytes(l2_bytes: Optional[int], l3_bytes: Optional[int]) -> int:
    """The shared-cache read buffer (SHARED_CACHE_L2_MULTIPLE x L2, in 64-byte lines), or 0 when
    there is no L3 that holds it in half its size."""
    if not l2_bytes or not l3_bytes:
        return 0
    size = SHARED_CACHE_L2_MULTIPLE * l2_bytes // 64 * 64
    return size if size <= l3_bytes // 2 else 0


def overflow_buffer_bytes(l3_bytes: Optional[int], cpus: int) -> int:
    """The buffer past the L3 (OVERFLOW_L3_MULTIPLE x the L3, in 64-byte lines), or 0 when there is
    no L3 or one CPU (nothing to compare)."""
    if not l3_bytes or cpus < 2:
        return 0
    return int(OVERFLOW_L3_MULTIPLE * l3_bytes) // 64 * 64


def probe_source(dram_bytes: int = DRAM_MIN_BYTES, shared_cache_bytes: int = 0, overflow_bytes: int = 0) -> str:
    """The probe program: argv = repeats, then test names; prints 'name ops seconds' lines."""
    funcs = "".join(_fma_function(bits) for bits in (128, 256, 512))
    return f"""#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static volatile float sink;
static volatile unsigned long isink;
static double now(void) {{ struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }}

/* {ADDS_PER_ITER} dependent integer adds per iteration: one cycle each. */
__attribute__((noinline)) static void addchain(long iters)
{{
    unsigned long x = 0, y = 1;
    for (long i = 0; i < iters; i++)
        __asm__ volatile(".rept {ADDS_PER_ITER}\\n\\taddq %1, %0\\n\\t.endr" : "+r"(x) : "r"(y));
    isink = x;
}}

/* One dependent FMA chain: one FMA latency per iteration. */
__attribute__((target("avx2,fma"), noinline)) static void fmalat(long iters)
{{
    __m128 a = _mm_set1_ps(1.0f);
    const __m128 m = _mm_set1_ps(0.9999999f), d = _mm_set1_ps(1e-7f);
    for (long i = 0; i < iters; i++) a = _mm_fmadd_ps(a, m, d);
    sink = _mm_cvtss_f32(a);
}}
{funcs}
/* Sustained read bandwidth: every thread sums its static share of the buffer with 128-bit loads
 * (four independent sums; two loads per cycle are far above any DRAM rate). The buffer is
 * first touched by the same static split, so each thread's pages are its own. */
#define DRAM_BYTES {dram_bytes}L
static float *dram_buf;
static int dram_init(void)
{{
    if (dram_buf) return 0;
    dram_buf = aligned_alloc(64, DRAM_BYTES);
    if (!dram_buf) return 1;
    const long n = DRAM_BYTES / sizeof(float);
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) dram_buf[i] = 1.0f;
    return 0;
}}
/* Inside a parallel region: this thread's static share of buf[0, n), summed `passes` times. */
static float sum_share(const float *buf, long n, int passes)
{{
    const long id = omp_get_thread_num(), nth = omp_get_num_threads();
    const long lo = n * id / nth / 16 * 16, hi = n * (id + 1) / nth / 16 * 16;
    __m128 s0 = _mm_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (int pass = 0; pass < passes; pass++)
        for (long i = lo; i < hi; i += 16) {{
            s0 = _mm_add_ps(s0, _mm_load_ps(buf + i));
            s1 = _mm_add_ps(s1, _mm_load_ps(buf + i + 4));
            s2 = _mm_add_ps(s2, _mm_load_ps(buf + i + 8));
            s3 = _mm_add_ps(s3, _mm_load_ps(buf + i + 12));
        }}
    return _mm_cvtss_f32(_mm_add_ps(_mm_add_ps(s0, s1), _mm_add_ps(s2, s3)));
}}
__attribute__((noinline)) static void dram_read(int threads)
{{
    float total = 0.0f;
#pragma omp parallel num_threads(threads) reduction(+:total)
    total += sum_share(dram_buf, DRAM_BYTES / sizeof(float), 1);
    sink = total;
}}

/* One core's read rate from the shared cache: one thread sums a buffer of several times its L2
 * (far less than the L3) {SHARED_CACHE_PASSES} times, with 256-bit loads (64 bytes per cycle at two loads: far
 * above any L3). An untimed pass first brings it back from wherever the DRAM runs pushed it. */
#define SHARED_CACHE_BYTES {max(shared_cache_bytes, 64)}L
static float *l3_buf;
__attribute__((target("avx"), noinline)) static void l3_read(int passes)
{{
    const long n = SHARED_CACHE_BYTES / sizeof(float);
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (int pass = 0; pass < passes; pass++)
        for (long i = 0; i + 32 <= n; i += 32) {{
            s0 = _mm256_add_ps(s0, _mm256_load_ps(l3_buf + i));
            s1 = _mm256_add_ps(s1, _mm256_load_ps(l3_buf + i + 8));
            s2 = _mm256_add_ps(s2, _mm256_load_ps(l3_buf + i + 16));
            s3 = _mm256_add_ps(s3, _mm256_load_ps(l3_buf + i + 24));
        }}
    sink = _mm_cvtss_f32(_mm256_castps256_ps128(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3))));
}}

/* A buffer a little larger than the L3, summed {OVERFLOW_PASSES} times by one thread or by every CPU (each
 * its static share, first touched by the same split over every CPU), as the GEMMs of a split over
 * output channels read their parts of a filter transform just past the L3. */
#define OVERFLOW_BYTES {max(overflow_bytes, 64)}L
static float *ovf_buf;
static int ovf_init(void)
{{
    if (ovf_buf) return 0;
    if (!(ovf_buf = aligned_alloc(64, OVERFLOW_BYTES))) return 1;
    const long n = OVERFLOW_BYTES / sizeof(float);
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) ovf_buf[i] = 1.0f;
    return 0;
}}
__attribute__((noinline)) static void ovf_read(int threads, int passes)
{{
    float total = 0.0f;
#pragma omp parallel num_threads(threads) reduction(+:total)
    total += sum_share(ovf_buf, OVERFLOW_BYTES / sizeof(float), passes);
    sink = total;
}}

int main(int argc, char **argv)
{{
    if (argc < 3) return 2;
    const int repeats = atoi(argv[1]);
    for (int r = 0; r < repeats; r++)
        for (int t = 2; t < argc; t++) {{
            const char *name = argv[t];
            long iters, ops;
            if (!strncmp(name, "dram", 4) && dram_init()) return 3;
            if (!strcmp(name, "l3") && !l3_buf) {{
                if (!(l3_buf = aligned_alloc(64, SHARED_CACHE_BYTES))) return 3;
                for (long i = 0; i < SHARED_CACHE_BYTES / (long)sizeof(float); i++) l3_buf[i] = 1.0f;
            }}
            if (!strncmp(name, "ovf", 3) && ovf_init()) return 3;
            if (!strcmp(name, "l3")) l3_read(1);   /* untimed: the buffer into the L3 */
            if (!strcmp(name, "ovf1")) ovf_read(1, 1);   /* untimed: as much of it on chip as stays */
            if (!strcmp(name, "ovf")) ovf_read(omp_get_num_procs(), 1);
            double t0 = now();
            if (!strcmp(name, "add")) {{ iters = {ITERS["add"]}; addchain(iters); ops = iters * {ADDS_PER_ITER}; }}
            else if (!strcmp(name, "lat")) {{ iters = {ITERS["lat"]}; fmalat(iters); ops = iters; }}
            else if (!strcmp(name, "fma128")) {{ iters = {ITERS["fma128"]}; fma128(iters); ops = iters * {CHAINS[128]}; }}
            else if (!strcmp(name, "fma256")) {{ iters = {ITERS["fma256"]}; fma256(iters); ops = iters * {CHAINS[256]}; }}
            else if (!strcmp(name, "fma512")) {{ iters = {ITERS["fma512"]}; fma512(iters); ops = iters * {CHAINS[512]}; }}
            else if (!strcmp(name, "dram1")) {{ dram_read(1); ops = DRAM_BYTES; }}
            else if (!strcmp(name, "dram")) {{ dram_read(omp_get_num_procs()); ops = DRAM_BYTES; }}
            else if (!strcmp(name, "l3")) {{ l3_read({SHARED_CACHE_PASSES}); ops = SHARED_CACHE_BYTES * {SHARED_CACHE_PASSES}L; }}
            else if (!strcmp(name, "ovf1")) {{ ovf_read(1, {OVERFLOW_PASSES}); ops = OVERFLOW_BYTES * {OVERFLOW_PASSES}L; }}
            else if (!strcmp(name, "ovf")) {{ ovf_read(omp_get_num_procs(), {OVERFLOW_PASSES}); ops = OVERFLOW_BYTES * {OVERFLOW_PASSES}L; }}
            else return 2;
            printf("%s %ld %.9e\\n", name, ops, now() - t0);
        }}
    return 0;
}}
"""


# ---------------------------------------------------------------------------------------------
# Identity of the CPU (the cache key).
# ---------------------------------------------------------------------------------------------

def parse_cpu(cpuinfo_text: str) -> dict:
    """The first processor block of /proc/cpuinfo: model, vendor, family/model/stepping, flags."""
    info = parse_cpuinfo(cpuinfo_text)
    return {"model_name": info.get("model name", "unknown"), "vendor": info.get("vendor_id", ""),
            "family": info.get("cpu family", ""), "model": info.get("model", ""),
            "stepping": info.get("stepping", ""), "flags": sorted(info["flags"])}


def cpu_key(cpu: dict, machine_id: str) -> str:
    """Hash of the CPU's identity and flags plus a hash of the machine id (never stored raw)."""
    machine = hashlib.sha256(machine_id.encode()).hexdigest()
    return hashlib.sha256(canonical_json({**cpu, "machine": machine}).encode()).hexdigest()[:32]


def widths_for(flags) -> tuple[int, ...]:
    return tuple(bits for bits, needed in sorted(WIDTH_FLAGS.items()) if all(f in flags for f in needed))


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


# ---------------------------------------------------------------------------------------------
# Measuring.
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HostProbe:
    cpu_key: str
    cpu_model: str
    clock_ghz: float
    fma_per_cycle: tuple[tuple[int, float], ...]    # (vector bits, vector FMA instructions per cycle)
    fma_latency_cycles: float
    method: str
    repeats: int
    spread: float                                   # worst (max - min) / median over the figures
    measured_at: str
    cached: bool = False
    dram_read_gbps: Optional[float] = None           # sustained all-CPU read; None: not measured
    measured_busy: bool = False                      # measured beside other work (BUSY_LOAD_PER_CPU)
    shared_cache_read_gbps: Optional[float] = None   # one core reading the L3; None: not measured
    l3_overflow_read_speedup: Optional[float] = None  # l3_overflow_read_speedup(); None: not measured

    def fma_per_cycle_at(self, vector_bits: int) -> Optional[float]:
        return dict(self.fma_per_cycle).get(vector_bits)

    def measurement(self) -> HostMeasurement:
        """The figures the host description takes (it quantizes them: xfc.hardware.host)."""
        return HostMeasurement(clock_ghz=self.clock_ghz, fma_per_cycle=self.fma_per_cycle,
                               fma_latency_cycles=self.fma_latency_cycles, measured_at=self.measured_at,
                               cached=self.cached, dram_read_gbps=self.dram_read_gbps,
                               shared_cache_read_gbps=self.shared_cache_read_gbps,
                               l3_overflow_read_speedup=self.l3_overflow_read_speedup)


def analyse(lines: str, widths: tuple[int, ...]) -> tuple[float, dict[int, float], float, int, float]:
    """(clock GHz, {bits: FMAs per cycle}, FMA latency in cycles, repeats, spread) from the output."""
    times: dict[str, list[float]] = {}
    ops: dict[str, int] = {}
    for line in lines.splitlines():
        parts = line.split()
        if len(parts) != 3:
            raise ToolchainError(f"host probe: unexpected output line {line[:80]!r}")
        name, count, seconds = parts[0], int(parts[1]), float(parts[2])
        if not seconds > 0:
            raise ToolchainError(f"host probe: {name} took no measurable time")
        times.setdefault(name, []).append(seconds)
        ops[name] = count
    needed = ["add", "lat"] + [f"fma{b}" for b in widths]
    if any(n not in times for n in needed):
        raise ToolchainError(f"host probe: missing results (got {', '.join(sorted(times))})")
    rate = {n: ops[n] / min(ts) for n, ts in times.items()}
    clock_hz = rate["add"]
    fma = {b: rate[f"fma{b}"] / clock_hz for b in widths}
    latency = clock_hz / rate["lat"]
    spread = max((max(ts) - min(ts)) / statistics.median(ts) for ts in times.values())
    return clock_hz / 1e9, fma, latency, min(len(ts) for ts in times.values()), spread


def best_gbps(lines: str) -> dict[str, float]:
    """The best run of each named read in the probe's output ('name bytes seconds' lines), GB/s."""
    best: dict[str, float] = {}
    for parts in map(str.split, lines.splitlines()):
        if len(parts) == 3 and float(parts[2]) > 0:
            best[parts[0]] = max(best.get(parts[0], 0.0), int(parts[1]) / float(parts[2]) / 1e9)
    return best


def dram_read_gbps(lines: str) -> Optional[float]:
    """The best 'dram' or 'dram1' run's bytes per second in GB/s (None when the output has
    neither). One thread alone counts too: when another process holds a core, the all-CPU run
    waits for its slowest thread, while one thread on an idle core still shows what memory gives."""
    best = best_gbps(lines)
    return max((best[name] for name in ("dram", "dram1") if name in best), default=None)


def shared_cache_read_gbps(lines: str) -> Optional[float]:
    """The best 'l3' run's bytes per second in GB/s (None when the output has none)."""
    return best_gbps(lines).get("l3")


def l3_overflow_read_speedup(lines: str, cpus: int) -> Optional[float]:
    """How many times faster every CPU streams past the L3 than the DRAM figure prices one stream:
    the best 'ovf' (every CPU) run's rate over the best 'ovf1' (one thread) run's, times the best
    'dram1' over the DRAM figure (the faster of 'dram1' and 'dram', dram_read_gbps): where every CPU
    read DRAM faster than one, the DRAM figure already holds that much of the gain (on the Zen 4 VM
    of session 62 the all-CPU DRAM read moved between 1.2x and 2.0x one thread's). Within [1, cpus];
    None when the output lacks any of the four."""
    best = best_gbps(lines)
    if any(name not in best for name in ("ovf", "ovf1", "dram", "dram1")):
        return None
    held = best["dram1"] / max(best["dram1"], best["dram"])
    return min(max(best["ovf"] / best["ovf1"] * held, 1.0), float(max(cpus, 1)))


def probe_cpus() -> int:
    """The CPUs this process may run on (its affinity: what the probe's OpenMP team and the host
    description count), not every CPU of the machine."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def implausible(clock_ghz: float, fma: dict[int, float], latency_cycles: float,
                dram_gbps: Optional[float] = None) -> str:
    """Why a probe result cannot be right ('' when it can). Another process taking the core during
    the integer-add clock runs makes the clock read low, which inflates FMAs per cycle and shrinks
    the FMA latency; the FMA latency of every x86-64 core with FMA is 3-6 cycles and none issues
    more than two vector FMAs per cycle, so a result outside these (with margin) is rejected."""
    if not MIN_CLOCK_GHZ <= clock_ghz <= MAX_CLOCK_GHZ:
        return f"clock {clock_ghz:.2f} GHz"
    if not MIN_FMA_LATENCY <= latency_cycles <= MAX_FMA_LATENCY:
        return f"FMA latency {latency_cycles:.2f} cycles"
    worst = max(fma.values(), default=0.0)
    if worst > MAX_FMA_PER_CYCLE:
        return f"{worst:.2f} FMAs per cycle"
    if dram_gbps is not None and not MIN_DRAM_GBPS <= dram_gbps <= MAX_DRAM_GBPS:
        return f"DRAM read {dram_gbps:.1f} GB/s"
    return ""


def measure_host(flags, repeats: int = REPEATS, l3_bytes: Optional[int] = None, l2_bytes: Optional[int] = None
                 ) -> tuple[float, dict[int, float], float, int, float, dict, str, float, Optional[float],
                            Optional[float]]:
    """Build and run the probe: (clock GHz, FMAs/cycle by width, latency, repeats, spread,
    conditions, compiler, DRAM read GB/s, one core's shared-cache read GB/s or None, every CPU's
    read of a buffer past the L3 over one thread's or None). ToolchainError when it cannot run here."""
    if platform.machine() not in ("x86_64", "AMD64"):
        raise ToolchainError(f"host probe: x86-64 only (this machine is {platform.machine()})")
    widths = widths_for(flags)
    if not widths:
        raise ToolchainError("host probe: this CPU has no FMA instructions (no 'fma' flag); nothing to measure")
    with tempfile.TemporaryDirectory(prefix="xfc-probe-") as tmp:
        src = Path(tmp) / "probe.c"
        shared_bytes = shared_cache_buffer_bytes(l2_bytes, l3_bytes)
        cpus = probe_cpus()
        overflow_bytes = overflow_buffer_bytes(l3_bytes, cpus)
        src.write_text(probe_source(dram_buffer_bytes(l3_bytes), shared_bytes, overflow_bytes))
        exe = hostcc.compile_c(src, Path(tmp) / "probe", ["-O2", "-fopenmp"], "host probe compile")
        problem = ""
        for _attempt in range(ATTEMPTS):
            before = hostcc.snapshot()
            out = run([str(exe), str(repeats), "add", "lat", *(f"fma{b}" for b in widths), "dram1", "dram",
                       *(("l3",) if shared_bytes else ()), *(("ovf1", "ovf") if overflow_bytes else ())],
                      "host probe",
                      hostcc.RUN_TIMEOUT_S).stdout
            after = hostcc.snapshot()
            clock, fma, latency, reps, spread = analyse(out, widths)
            dram, shared = dram_read_gbps(out), shared_cache_read_gbps(out)
            overflow = l3_overflow_read_speedup(out, cpus)
            if dram is None:
                raise ToolchainError("host probe: no DRAM read result in its output")
            problem = implausible(clock, fma, latency, dram) or (
                f"shared-cache read {shared:.1f} GB/s" if shared is not None and not
                MIN_DRAM_GBPS <= shared <= MAX_DRAM_GBPS else "")
            if not problem:
                break
        else:
            raise ToolchainError(f"host probe: implausible figures in {ATTEMPTS} attempts ({problem}); "
                                 "the machine is probably busy, nothing cached")
    return (clock, fma, latency, reps, spread, hostcc.conditions(before, after), hostcc.compiler_version(), dram, shared,
            overflow)


METHOD = ("independent FMA chains per width ({chains}); clock from a dependent integer-add chain "
          "(1 cycle per add); FMA latency from one dependent chain; best of {repeats} runs of ~3 ms; "
          "DRAM: one thread, then every CPU, summing a {dram_mib} MiB buffer, best of {repeats}{l3}")
L3_METHOD = "; L3: one thread summing a {shared_mib} MiB buffer " + str(SHARED_CACHE_PASSES) + " times after an untimed pass, best of {repeats}"
OVERFLOW_METHOD = ("; past the L3: one thread, then every CPU, summing a {overflow_mib} MiB buffer "
                   + str(OVERFLOW_PASSES) + " times after an untimed pass, best of {repeats}")


def _rows(probe: HostProbe, origin: str, conditions: dict, compiler: str) -> list[CalibrationRow]:
    subject = f"cpu:{probe.cpu_key}"
    common = dict(subject=subject, method=probe.method, source="host", origin=origin, repeats=probe.repeats,
                  spread=probe.spread, conditions=canonical_json(conditions), compiler=compiler,
                  xfc_version=__version__, created_at=probe.measured_at)
    rows = [CalibrationRow(name="clock_ghz", value=probe.clock_ghz, unit="GHz", **common),
            CalibrationRow(name="fma_latency_cycles", value=probe.fma_latency_cycles, unit="cycles", **common)]
    if probe.dram_read_gbps is not None:
        rows.append(CalibrationRow(name="dram_read_gbps", value=probe.dram_read_gbps, unit="GB/s", **common))
    # 0: not measured (no L3 holds the buffer), so a cached probe is complete without one
    rows.append(CalibrationRow(name="shared_cache_read_gbps", value=probe.shared_cache_read_gbps or 0.0,
                               unit="GB/s", **common))
    # 0: not measured (no L3, or one CPU)
    rows.append(CalibrationRow(name=OVERFLOW_ROW, value=probe.l3_overflow_read_speedup or 0.0,
                               unit="x (every CPU's past-L3 read over one thread's, less the DRAM figure's share)",
                               **common))
    rows += [CalibrationRow(name=f"fma_per_cycle@{bits}", value=rate, unit="FMA instructions per cycle", **common)
             for bits, rate in probe.fma_per_cycle]
    return rows


def _from_rows(rows: list[CalibrationRow], key: str, model: str, widths: tuple[int, ...]) -> Optional[HostProbe]:
    latest: dict[str, CalibrationRow] = {}
    for row in rows:
        if row.name not in latest or row.created_at > latest[row.name].created_at:
            latest[row.name] = row
    names = list(FACT_NAMES) + [f"fma_per_cycle@{b}" for b in widths]
    if any(n not in latest for n in names):
        return None
    any_row = latest["clock_ghz"]
    return HostProbe(cpu_key=key, cpu_model=model, clock_ghz=latest["clock_ghz"].value,
                     fma_per_cycle=tuple((b, latest[f"fma_per_cycle@{b}"].value) for b in widths),
                     fma_latency_cycles=latest["fma_latency_cycles"].value, method=any_row.method,
                     repeats=any_row.repeats, spread=any_row.spread or 0.0, measured_at=any_row.created_at,
                     cached=True, dram_read_gbps=latest["dram_read_gbps"].value,
                     measured_busy=_busy(_recorded_load(latest["dram_read_gbps"].conditions)),
                     shared_cache_read_gbps=latest["shared_cache_read_gbps"].value or None,
                     l3_overflow_read_speedup=latest[OVERFLOW_ROW].value or None)


def _recorded_load(conditions: str) -> Optional[float]:
    try:
        return json.loads(conditions or "{}").get("loadavg_before")
    except (ValueError, AttributeError):
        return None


def _busy(loadavg: Optional[float]) -> bool:
    """Whether a 1-minute load average says other work shares the CPUs (BUSY_LOAD_PER_CPU)."""
    return loadavg is not None and loadavg >= BUSY_LOAD_PER_CPU * (os.cpu_count() or 1)


def host_probe(environ: Mapping[str, str], *, remeasure: bool = False, db_path: Optional[Path] = None,
               warn: Callable[[str], None] = lambda message: None, cpuinfo_text: Optional[str] = None,
               machine_id: Optional[str] = None) -> HostProbe:
    """The host's measured FMA figures: from the per-user cache, or measured now (and cached).

    Raises ToolchainError when the probe cannot run (no gcc, not x86-64, no FMA). A cache that
    cannot be opened or written costs a warning, not the measurement.
    """
    cpu = parse_cpu(cpuinfo_text if cpuinfo_text is not None else _read_text("/proc/cpuinfo"))
    if machine_id is None:
        machine_id = (_read_text("/etc/machine-id") or _read_text("/var/lib/dbus/machine-id")).strip() \
            or platform.node()
    key = cpu_key(cpu, machine_id)
    widths = widths_for(cpu["flags"])
    l3 = read_caches().get("L3")
    l3_bytes = int(l3["size_kib"] * 1024) if l3 else None
    path = db_path or user_db_path(environ)
    db: Optional[TileDb] = None
    try:
        db = TileDb.open(path)
    except TileDbError as exc:
        warn(f"warning: {exc}; the host probe result is not cached")
    try:
        cached = None
        if db is not None and not remeasure:
            cached = _from_rows(db.rows("calibration", "subject = ? AND source = 'host'", (f"cpu:{key}",)),
                                key, cpu["model_name"], widths)
            if cached is not None and not (cached.measured_busy and not _busy(hostcc.load_average())):
                return cached
        l2 = read_caches().get("L2")
        shared_bytes = shared_cache_buffer_bytes(int(l2["size_kib"] * 1024) if l2 else None, l3_bytes)
        clock, fma, latency, repeats, spread, conditions, compiler, dram, shared, overflow = measure_host(
            cpu["flags"], l3_bytes=l3_bytes, l2_bytes=int(l2["size_kib"] * 1024) if l2 else None)
        if cached is not None and cached.dram_read_gbps:   # re-measured because the cached one was busy
            dram = max(dram, cached.dram_read_gbps)
        if cached is not None and cached.shared_cache_read_gbps and shared:   # contention only lowers it too
            shared = max(shared, cached.shared_cache_read_gbps)
        chains = ", ".join(f"{CHAINS[b]} x {b}-bit" for b in sorted(fma))
        overflow_mib = overflow_buffer_bytes(l3_bytes, probe_cpus()) >> 20
        probe = HostProbe(cpu_key=key, cpu_model=cpu["model_name"], clock_ghz=round(clock, 4),
                          fma_per_cycle=tuple((b, round(fma[b], 4)) for b in sorted(fma)),
                          fma_latency_cycles=round(latency, 3),
                          method=METHOD.format(chains=chains, repeats=repeats,
                                               dram_mib=dram_buffer_bytes(l3_bytes) >> 20,
                                               l3=(L3_METHOD.format(shared_mib=shared_bytes >> 20, repeats=repeats)
                                                   if shared_bytes else "")
                                               + (OVERFLOW_METHOD.format(overflow_mib=overflow_mib, repeats=repeats)
                                                  if overflow_mib else "")),
                          repeats=repeats, spread=round(spread, 4), measured_at=utc_now(),
                          dram_read_gbps=round(dram, 2), measured_busy=_busy(conditions.get("loadavg_before")),
                          shared_cache_read_gbps=round(shared, 2) if shared else None,
                          l3_overflow_read_speedup=round(overflow, 3) if overflow else None)
        if db is not None:
            conditions = {**conditions, "cpu_model": cpu["model_name"]}
            rows = _rows(probe, db.origin_for("host"), conditions, compiler)
            try:
                db.transact(lambda conn: [store_row(conn, "calibration", row, replace=True) for row in rows],
                            "cache the host probe")
            except TileDbError as exc:
                warn(f"warning: {exc}; the host probe result is not cached")
        return probe
    finally:
        if db is not None:
            db.close()


def host_probe_or_none(environ: Mapping[str, str], *, remeasure: bool = False,
                       warn: Callable[[str], None] = lambda message: None) -> Optional[HostProbe]:
    """host_probe, or None after one warning line when it cannot run (for host detection, which
    then keeps its assumptions and marks them as such)."""
    try:
        return host_probe(environ, remeasure=remeasure, warn=warn)
    except XfcError as exc:
        warn(f"warning: {exc}; host FMA figures stay assumed")
        return None
