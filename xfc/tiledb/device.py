"""The device evaluator: micro-tiles and whole operators built for aarch64 (static) and timed on an
Android device through the ADB runner ('adb:<serial>' rows).

  attach(hw, clusters)   connects, reads the device's identity and refuses (DeviceError, exit 3)
                         a device that is not the --hw description (same checks as `xfc bench
                         --device`: xfc.hardware.identity), before anything is built or written
  measure(tile, ...)     the tile's rendered NEON micro-kernel in a small driver (DEVICE_DRIVER):
                         packed A and B panels in, C out (checked here against float64 numpy),
                         then timed on L1-resident panels; the best repeat is the value
  measure_operator(...)  the statically synthesized plan, cross-built as `xfc bench` builds it,
                         run, checked against the numpy reference, timed (median of the repeats)

Every run is pinned to the cluster's CPUs (taskset, as `xfc bench --device` pins) and records its
conditions: governor, per-CPU clocks and thermal zones before and after, the throttling flag
(THROTTLE_RULE) and whether the device is emulated. The virtual device (android_runner, backed
by qemu-aarch64) says so in its properties (AdbRunner.emulated, the same label `xfc bench`
prints): its rows are stored with emulated = 1 (tile rows) or conditions.emulated = true
(operator rows) and never rank anything.
"""
from __future__ import annotations

import functools
import tempfile
import threading
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from ..toolchain.tools import ARM_CC, COMPILE_TIMEOUT_S, require_tool, run
from ..cpu.tiles import MicroTile, MicroTileScore
from ..errors import DeviceError, HardwareError, VerificationError, XfcError
from ..hardware.model import CpuCluster, CpuCore, HardwareDescription
from ..runners.base import Measurement, Runner, RunSpec, hexmask
from .evaluators import FLOAT_BYTES, TileResult, l1_resident_kc
from .operators import OperatorResult, plan_json
from .records import MAX_TEXT, SOURCE_RE, canonical_json

# A row is flagged throttled when any of these holds (the first two are AdbRunner.judge_throttling,
# the rule `xfc bench --device` reports; the third is read here):
THROTTLE_RULE = ("a pinned CPU's clock fell more than 10% during the run, or a thermal zone rose more than 10 C "
                 "during it or read above 85 C after it, or a pinned CPU's scaling_max_freq after the run is "
                 "below its cpuinfo_max_freq (a thermal or power cap)")
EMULATED_NOTE = "emulated timing (qemu-backed virtual device): stored for the record, never used to rank"
MAX_ZONES = 12          # thermal zones recorded per row (the hottest after the run); phones have ~80
SYSFS_CPU = "/sys/devices/system/cpu"

# The micro-kernel driver, "json" harness protocol (xfc.runners.base): A B BIAS OUT --repeat N --warmup W.
# A and B are the packed micro-panels (ap[k * MR + i], bp[k * NR + j]); OUT gets C = A^T B from one call.
DEVICE_DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "kernel.c"

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static float *panel(long floats) { return aligned_alloc(64, (size_t)((floats * sizeof(float) + 63) / 64 * 64)); }
static int load(const char *path, float *dst, long floats)
{
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(dst, sizeof(float), (size_t)floats + 1, f);
    fclose(f);
    return n == (size_t)floats;
}
static int by_value(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}
static void batch(long calls, float *ap, float *bp, float *c)
{
    for (long it = 0; it < calls; it++) {
        xfc_ukernel(XFC_TDB_KC, ap, NULL, bp, c, XFC_NR, (int)(it & 1), 0, NULL);
        __asm__ volatile("" : : "r"(c) : "memory");
    }
}

int main(int argc, char **argv)
{
    if (argc != 9 || strcmp(argv[5], "--repeat") || strcmp(argv[7], "--warmup")) {
        fprintf(stderr, "usage: %s A B BIAS OUT --repeat N --warmup W\n", argv[0]);
        return 2;
    }
    const int repeats = atoi(argv[6]), warmup = atoi(argv[8]);
    const long kc = XFC_TDB_KC;
    float *ap = panel(XFC_MR * kc), *bp = panel(XFC_NR * kc), *c = panel(XFC_MR * XFC_NR);
    double *samples = malloc(sizeof(double) * (repeats > 0 ? repeats : 1));
    if (!ap || !bp || !c || !samples || repeats < 1 || repeats > 1000 || warmup < 0) return 2;
    if (!load(argv[1], ap, XFC_MR * kc) || !load(argv[2], bp, XFC_NR * kc)) {
        fprintf(stderr, "micro-kernel driver: A must hold %ld and B %ld floats\n", (long)XFC_MR * kc, (long)XFC_NR * kc);
        return 2;
    }
    xfc_ukernel(kc, ap, NULL, bp, c, XFC_NR, 0, 0, NULL);
    FILE *out = fopen(argv[4], "wb");
    if (!out || fwrite(c, sizeof(float), XFC_MR * XFC_NR, out) != (size_t)(XFC_MR * XFC_NR) || fclose(out)) return 2;
    long calls = 1;
    for (;;) {  /* calls per sample: double until one sample lasts XFC_TDB_BATCH_S */
        double t0 = now();
        batch(calls, ap, bp, c);
        if (now() - t0 >= XFC_TDB_BATCH_S || calls >= (1L << 40)) break;
        calls *= 2;
    }
    for (int w = 0; w < warmup; w++) batch(calls, ap, bp, c);
    for (int r = 0; r < repeats; r++) {
        double t0 = now();
        batch(calls, ap, bp, c);
        samples[r] = (now() - t0) / (double)calls;
    }
    printf("{\"kernel\": \"xfc_tiledb_uk %dx%d kc=%ld\", \"repeats\": %d, \"calls_per_sample\": %ld, \"samples_s\": [",
           XFC_MR, XFC_NR, kc, repeats, calls);
    for (int r = 0; r < repeats; r++) printf("%s%.9e", r ? ", " : "", samples[r]);
    qsort(samples, (size_t)repeats, sizeof(double), by_value);
    printf("], \"min_s\": %.9e, \"median_s\": %.9e, \"max_s\": %.9e}\n", samples[0], samples[repeats / 2],
           samples[repeats - 1]);
    return 0;
}
"""


@functools.lru_cache(maxsize=None)
def arm_compiler_version() -> str:
    """e.g. 'aarch64-linux-gnu-gcc 12.2.0' (recorded with every device row)."""
    return f"{ARM_CC} " + run([require_tool(ARM_CC), "-dumpfullversion"], f"{ARM_CC} -dumpfullversion", 30).stdout.strip()


def check_device_matches(identity, hw: HardwareDescription, clusters: Sequence[CpuCluster]) -> None:
    """DeviceError unless the device is the description: it matches hw by its properties or CPUs
    (xfc.hardware.identity.match_identity, as `xfc bench --device` matches), or hw is the user's
    own description and the device's CPUs are exactly its clusters; and every cluster's kernels
    can run on it (check_description, as `xfc bench` checks)."""
    from ..hardware.identity import check_description, cpus_fit, match_identity
    from .locations import is_shipped_hardware
    match = match_identity(identity)
    own = not is_shipped_hardware(hw) and cpus_fit(identity, hw)
    if match.name != hw.name and not own:
        found = match.describe() if (match.name or match.candidates) else f"no shipped description ({identity.describe()})"
        raise DeviceError(f"device {identity.serial} is {found}, not {hw.name}: measuring it into {hw.name}'s rows "
                          f"would file its timings under the wrong hardware"
                          + (f"; use --hw {match.name}" if match.name else ""))
    for cluster in clusters:
        try:
            check_description(identity, hw, cluster, match)
        except HardwareError as exc:
            raise DeviceError(str(exc)) from None


def panels(tile: MicroTile, kc: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Packed A (kc x MR) and B (kc x NR) micro-panels with values of both signs."""
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1.0, 1.0, (kc, tile.mr)).astype(np.float32),
            rng.uniform(-1.0, 1.0, (kc, tile.nr)).astype(np.float32))


def check_micro_output(tile: MicroTile, a: np.ndarray, b: np.ndarray, out: np.ndarray, what: str) -> None:
    """VerificationError unless out = A^T B within fp32 accumulation error (float64 reference)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref = a64.T @ b64
    bound = 4.0 * a.shape[0] * np.finfo(np.float32).eps * (np.abs(a64).T @ np.abs(b64))
    err = np.abs(out.astype(np.float64).reshape(tile.mr, tile.nr) - ref)
    if not np.isfinite(err).all() or (err > bound).any():
        i, j = np.unravel_index(int(np.argmax(np.where(np.isfinite(err), err - bound, np.inf))), err.shape)
        raise VerificationError(f"{what}: row {i} column {j} is {out.reshape(tile.mr, tile.nr)[i, j]:.6g}, "
                                f"expected {ref[i, j]:.6g}; not timed into the database")


BEFORE_FILES = ("scaling_governor", "cpuinfo_max_freq")
AFTER_FILES = ("scaling_governor", "scaling_max_freq")


def cpufreq_paths(cpus: Sequence[int], names: Sequence[str]) -> list[str]:
    return [f"{SYSFS_CPU}/cpu{c}/cpufreq/{name}" for c in cpus for name in names]


def _per_cpu(texts: dict, cpus: Sequence[int], name: str, number: bool) -> dict:
    """cpu -> the value of one cpufreq file (int kHz or text), for the CPUs that have it."""
    out = {}
    for c in cpus:
        v = texts.get(f"{SYSFS_CPU}/cpu{c}/cpufreq/{name}", "").strip()
        if v and (v.isdigit() or not number):
            out[c] = int(v) if number else v
    return out


def run_conditions(m, cpus: Sequence[int], before: dict, after: dict, judged: tuple, serial: str,
                   model: str) -> dict:
    """The conditions of one device run: m (a runners Measurement with its clocks and zones),
    the cpufreq files read before and after it (path -> text), and the runner's throttling
    judgement (flag, reasons). THROTTLE_RULE says when a row is throttled."""
    max_khz, cap_khz = _per_cpu(before, cpus, "cpuinfo_max_freq", True), _per_cpu(after, cpus, "scaling_max_freq", True)
    throttled, reasons = judged[0], [r for r in judged[1] if "unknown" not in r]
    capped = [c for c in sorted(cap_khz) if c in max_khz and cap_khz[c] < max_khz[c]]
    if capped:
        throttled = True
        reasons += [f"cpu{c} capped at {cap_khz[c]} kHz below its {max_khz[c]} kHz maximum" for c in capped]
    temps_before, temps_after = _zones(m.temps_before, m.temps_after)
    conditions = {
        "where": m.where, "emulated": bool(m.emulated), "serial": serial, "model": model, "cpu_ids": list(cpus),
        "pinned": f"taskset {hexmask(cpus)}",
        "governor": {str(c): v for c, v in _per_cpu(before, cpus, "scaling_governor", False).items()},
        "governor_after": {str(c): v for c, v in _per_cpu(after, cpus, "scaling_governor", False).items()},
        "max_freq_khz": _khz(max_khz), "scaling_max_freq_khz_after": _khz(cap_khz),
        "freq_khz_before": _khz(m.freq_before), "freq_khz_after": _khz(m.freq_after),
        "temp_c_max_before": max(m.temps_before.values(), default=None),
        "temp_c_max_after": max(m.temps_after.values(), default=None),
        "temps_c_before": temps_before, "temps_c_after": temps_after,
        "throttled": throttled, "throttle_reasons": reasons, "throttle_rule": THROTTLE_RULE,
    }
    if m.emulated:
        conditions["note"] = EMULATED_NOTE
    return conditions


def _khz(values: dict) -> dict:
    return {str(cpu): int(v) for cpu, v in sorted(values.items())}


def _zones(before: dict, after: dict) -> tuple[dict, dict]:
    """The MAX_ZONES hottest zones after the run (keys kept as strings, in zone order)."""
    keep = sorted(after, key=lambda z: (-after[z], z))[:MAX_ZONES]
    order = sorted(keep, key=lambda z: (len(z), z))
    return ({z: before[z] for z in order if z in before}, {z: after[z] for z in order})


class DeviceEvaluator:
    """Measures micro-tiles and operators on one adb device (see the module docstring).

    Thread-safe: cross builds run in parallel (one temporary directory each) while everything that
    talks to the device takes a lock, so `--jobs N` overlaps compiling with measuring and the
    device runs one thing at a time.
    """

    def __init__(self, runner, *, repeats: int = 9, warmup: int = 1, batch_s: float = 0.002,
                 operator_repeats: int = 5, timeout_s: float = 300.0, work_dir: Optional[Path] = None):
        if repeats < 1 or operator_repeats < 1:
            raise XfcError("device evaluator: repeats must be >= 1")
        self.runner = runner
        self.repeats, self.warmup, self.batch_s = repeats, warmup, batch_s
        self.operator_repeats, self.timeout_s, self.work_dir = operator_repeats, timeout_s, work_dir
        self.hw: Optional[HardwareDescription] = None
        self.identity = None
        self._device = threading.Lock()
        self.runs = 0                      # harness runs on the device (micro-tiles and operators)

    # ---- identity ---------------------------------------------------------------------------

    def attach(self, hw: HardwareDescription, clusters: Sequence[CpuCluster]) -> "DeviceEvaluator":
        """Connect and check the device against hw before anything is built (DeviceError)."""
        if hw.target_arch != "aarch64":
            raise XfcError(f"--evaluators adb measures AArch64 kernels on a device; {hw.name} is {hw.target_arch}")
        require_tool(ARM_CC)
        self.identity = self.runner.read_identity()
        if not SOURCE_RE.match(f"adb:{self.runner.serial}"):
            raise DeviceError(f"device serial {self.runner.serial!r} cannot name a database source "
                              "(letters, digits and ._:+- only)")
        check_device_matches(self.identity, hw, clusters)
        self.hw = hw
        return self

    @property
    def source(self) -> str:
        if self.runner.serial is None:
            raise XfcError("device evaluator: attach() it to a device first")
        return f"adb:{self.runner.serial}"

    @property
    def emulated(self) -> bool:
        return bool(self.runner.emulated)

    # ---- running ----------------------------------------------------------------------------

    def _run(self, spec: RunSpec, cluster: CpuCluster):
        """(Measurement, conditions) of one pinned run, under the device lock."""
        cpus = tuple(cluster.cpu_ids)
        with self._device:
            before = self.runner.read_texts(cpufreq_paths(cpus, BEFORE_FILES))
            m = self.runner.execute(spec)
            after = self.runner.read_texts(cpufreq_paths(cpus, AFTER_FILES))
            self.runs += 1
        judged = self.runner.judge_throttling(m.freq_before, m.freq_after, m.temps_before, m.temps_after)
        return m, run_conditions(m, cpus, before, after, judged, self.runner.serial,
                                 self.runner.props.get("ro.product.model", ""))

    @staticmethod
    def _fit(conditions: dict) -> dict:
        """Conditions small enough for a row (records.MAX_TEXT): per-zone readings go first."""
        if len(canonical_json(conditions)) > MAX_TEXT:
            conditions = {k: v for k, v in conditions.items() if k not in ("temps_c_before", "temps_c_after")}
        if len(canonical_json(conditions)) > MAX_TEXT:
            conditions["throttle_reasons"] = conditions["throttle_reasons"][:3]
        return conditions

    # ---- micro-tiles ------------------------------------------------------------------------

    @staticmethod
    def kernel_source(tile: MicroTile, core: CpuCore, isa: str, kc: int) -> str:
        """The C source of the rendered kernel holding the tile's xfc_ukernel for this core (NEON)."""
        from ..cpu.codegen import render_cpu_kernel
        from ..cpu.plans import hand_plan
        from ..ops.spec import make_spec
        if isa != "neon":
            raise XfcError(f"the device evaluator times AArch64 NEON micro-kernels; isa {isa!r} is not neon")
        spec = make_spec("matmul", dict(m=4 * tile.mr, n=4 * tile.nr, k=kc))
        plan = hand_plan(spec, "neon", 1, mr=tile.mr, nr=tile.nr, kc=kc, a_pack="packed",
                         a_load_bits=tile.a_load_bits, gcc_march=core.gcc_march, qemu_cpu=core.qemu_cpu,
                         function_name="xfc_tiledb_uk")
        return render_cpu_kernel(plan).source

    def build_micro_kernel(self, tile: MicroTile, core: CpuCore, isa: str, kc: int, work: Path) -> Path:
        (work / "kernel.c").write_text(self.kernel_source(tile, core, isa, kc))
        (work / "driver.c").write_text(DEVICE_DRIVER)
        exe = work / "uk.aarch64"
        run([require_tool(ARM_CC), "-O3", "-std=gnu11", "-fopenmp", "-Wno-unused-function", "-static",
             f"-march={core.gcc_march or 'armv8-a'}", f"-DXFC_TDB_KC={kc}", f"-DXFC_TDB_BATCH_S={self.batch_s!r}",
             "-o", exe.name, "driver.c", "-lm"], f"aarch64 compile of micro-kernel {tile.mr}x{tile.nr}",
            COMPILE_TIMEOUT_S, cwd=work)
        return exe

    def measure(self, tile: MicroTile, cluster: CpuCluster, isa: str) -> TileResult:
        core = cluster.core
        kc = l1_resident_kc(tile, core)
        name = f"{isa} {tile.mr}x{tile.nr} on {self.source}"
        a, b = panels(tile, kc)
        with tempfile.TemporaryDirectory(prefix="xfc-tiledb-adb-", dir=self.work_dir) as tmp:
            exe = self.build_micro_kernel(tile, core, isa, kc, Path(tmp))
            m, conditions = self._run(RunSpec(
                harness=exe, inputs=(a, b, np.zeros(tile.nr, np.float32)),   # the driver's BIAS argument: never read repeat=self.repeats, warmup=self.warmup, timeout_s=self.timeout_s,
                output_shape=(tile.mr, tile.nr), cpu_ids=tuple(cluster.cpu_ids), label=f"micro-kernel {name}",
                protocol="json", march=core.gcc_march, flops=2 * tile.mr * tile.nr * kc), cluster)
        check_micro_output(tile, a, b, m.output, f"micro-kernel {name}")
        if m.min_s <= 0:
            raise DeviceError(f"micro-kernel {name}: the driver reported a zero time; not stored")
        # The best repeat is the value, as for the host evaluator: other work only slows a run.
        best, median = m.min_s, m.median_s
        seconds_per_k = best / kc
        gflops = 2.0 * tile.mr * tile.nr * kc / best / 1e9
        conditions.update(kc=kc, clock_ghz=cluster.clock_ghz, clock_from="description", value="best of repeats",
                          median_s_per_k=median / kc, threads=1,
                          panels_kib=round((tile.mr + tile.nr) * kc * FLOAT_BYTES / 1024, 2))
        return TileResult(cycles_per_k=seconds_per_k * cluster.clock_ghz * 1e9, seconds=seconds_per_k, gflops=gflops,
                          efficiency=gflops / cluster.peak_gflops_per_core, bound="measured", repeats=len(m.samples_s),
                          spread=(m.max_s - m.min_s) / median, conditions=self._fit(conditions),
                          compiler=arm_compiler_version(), emulated=bool(m.emulated))

    def evaluate(self, tile: MicroTile, core: CpuCore, isa: str) -> MicroTileScore:
        """A MicroTileEvaluator answer from a live measurement (a real device only)."""
        if self.hw is None:
            raise XfcError("device evaluator: attach() it to a device first")
        if self.emulated:
            raise XfcError(f"{self.source} is emulated: its timings never rank tiles")
        cluster = next((c for c in self.hw.clusters if c.core == core), None)
        if cluster is None:
            raise XfcError(f"device evaluator: {self.hw.name} has no cluster of {core.name} cores")
        r = self.measure(tile, cluster, isa)
        return MicroTileScore(cycles_per_k=r.cycles_per_k, efficiency=r.efficiency, bound=r.bound, source=self.source)

    # ---- operators --------------------------------------------------------------------------

    def measure_operator(self, hw: HardwareDescription, cluster: CpuCluster, spec, threads: int) -> OperatorResult:
        """The synthesized plan through the chain (xfc.pipeline.stages) on the device, pinned to the
        cluster: the per-call entry point timed, the pre-packed one run once, both judged under the
        plan's own bound (a Winograd plan's included)."""
        from ..cpu.synth import synthesize_cpu
        from ..ops.dtypes import FP32, make_operands
        from ..pipeline import stages
        result = synthesize_cpu(spec, hw, cluster.role, threads)
        operands = make_operands(spec, FP32, seed=0)
        pinned = _PinnedRunner(self, cluster)
        with tempfile.TemporaryDirectory(prefix="xfc-tiledb-adb-op-", dir=self.work_dir) as tmp:
            built = stages.realize(result.plan, Path(tmp), runner=pinned)
            m = stages.run(built, operands, prepacked=False, repeat=self.operator_repeats, warmup=self.warmup,
                           cpu_ids=tuple(cluster.cpu_ids), timeout_s=self.timeout_s)
            conditions = pinned.conditions
            packed = stages.run(built, operands, prepacked=True, cpu_ids=tuple(cluster.cpu_ids),
                                timeout_s=self.timeout_s)
        verdict = stages.judge(result.plan, [m.output, packed.output], operands)
        if m.median_s <= 0:
            raise DeviceError(f"{spec.describe()} on {self.source}: the harness reported a zero time; not stored")
        if not verdict.ok:
            raise VerificationError(f"{spec.describe()} on {self.source}: the synthesized kernel differs from the "
                                    f"reference ({verdict.reason}); not stored")
        conditions.update(threads=threads, value="median of repeats", weights="packed inside every call")
        return OperatorResult(plan=plan_json(result.plan), predicted_s=result.estimate.predicted_s,
                              measured_s=m.median_s, gflops=spec.flops / m.median_s / 1e9, repeats=len(m.samples_s),
                              spread=(m.max_s - m.min_s) / m.median_s, conditions=self._fit(conditions),
                              compiler=arm_compiler_version())


class _PinnedRunner(Runner):
    """The evaluator's device runner with its telemetry: each run under the device lock, the
    cluster's frequencies read before and after (DeviceEvaluator._run); the last run's conditions kept."""

    def __init__(self, evaluator: "DeviceEvaluator", cluster: CpuCluster):
        self.evaluator, self.cluster = evaluator, cluster
        self.where, self.emulated = evaluator.runner.where, evaluator.runner.emulated
        self.conditions: dict = {}

    def execute(self, spec: RunSpec) -> Measurement:
        m, self.conditions = self.evaluator._run(spec, self.cluster)
        return m
