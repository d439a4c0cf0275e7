"""Evaluators that fill the tile database, and the one that answers synthesis from it.

Filling (used by build.py): each has `source` and `measure(tile, cluster, isa) -> TileResult`.
  StaticDbEvaluator          the static issue model of xfc.cpu.cost_model, as rows ('static')
  HostMicroKernelEvaluator   the real rendered micro-kernel, built with the host gcc and timed on
                             L1-resident packed panels, after a correctness check ('host')
  McaMicroKernelEvaluator    the rendered AArch64 micro-kernel's K loop under llvm-mca-16, with
                             the core's closest LLVM model ('llvm-mca:<model>'; a static estimate)
  device.DeviceEvaluator     the rendered AArch64 micro-kernel (and whole operators) built static and
                             timed on an Android device over ADB, pinned per cluster ('adb:<serial>';
                             a virtual device's rows are stored as emulated and never rank)
Answering (plugged into xfc.cpu.synth.synthesize_cpu(evaluator=...)):
  TileDbEvaluator            best row per tile (measured > published > llvm-mca > static), the
                             live static model for the rest; never raises on a bad database
"""
from __future__ import annotations

import math
import os
import statistics
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Optional

from ..errors import VerificationError, XfcError
from ..hardware.model import CpuCluster, CpuCore, HardwareDescription
from ..cpu.tiles import MicroTile, MicroTileScore
from ..cpu.cost_model import DEFAULT_CONSTANTS, StaticEvaluator
from ..toolchain.tools import run
from . import hostcc
from .fingerprint import fingerprint, label
from .plancache import PlanCache, cached_synthesis
from .records import canonical_json
from .store import TileDb, TileDbError

OP_GEMM_UKERNEL = "gemm_ukernel"
FLOAT_BYTES = 4


def tile_params(tile: MicroTile) -> str:
    """The canonical JSON key of a GEMM micro-tile."""
    return canonical_json({"mr": tile.mr, "nr_vectors": tile.nr_vectors, "lanes": tile.lanes,
                           "a_load_bits": tile.a_load_bits})


@dataclass(frozen=True)
class TileResult:
    cycles_per_k: float
    seconds: Optional[float]      # per k step
    gflops: float
    efficiency: float             # of the description's per-core FMA peak
    bound: str
    repeats: int
    spread: float
    conditions: dict = field(default_factory=dict)
    compiler: str = ""
    emulated: bool = False


# ---------------------------------------------------------------------------------------------
# Static.
# ---------------------------------------------------------------------------------------------

class StaticDbEvaluator:
    """The static model of xfc.cpu.cost_model, recorded as rows: deterministic, no clock, no I/O."""

    source = "static"

    def __init__(self):
        self._model = StaticEvaluator()

    def evaluate(self, tile: MicroTile, core: CpuCore, isa: str) -> MicroTileScore:
        return self._model.evaluate(tile, core, isa)

    def measure(self, tile: MicroTile, cluster: CpuCluster, isa: str) -> TileResult:
        score = self.evaluate(tile, cluster.core, isa)
        return TileResult(cycles_per_k=score.cycles_per_k, seconds=score.cycles_per_k / (cluster.clock_ghz * 1e9),
                          gflops=score.efficiency * cluster.peak_gflops_per_core, efficiency=score.efficiency,
                          bound=score.bound, repeats=1, spread=0.0)

    def measure_operator(self, hw: HardwareDescription, cluster: CpuCluster, spec, threads: int):
        """The plan the static synthesizer picks for spec and its predicted time."""
        from .operators import static_operator
        return static_operator(hw, cluster, spec, threads)


# ---------------------------------------------------------------------------------------------
# Host micro-kernel timing.
# ---------------------------------------------------------------------------------------------

DRIVER = r"""
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "kernel.c"

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static float *panel(long floats) { return aligned_alloc(64, (size_t)((floats * sizeof(float) + 63) / 64 * 64)); }

/* argv: repeats, seconds per timed batch. Prints 'calls N', then one 'sample S' (seconds per call) per repeat. */
int main(int argc, char **argv)
{
    if (argc != 3) return 2;
    const int repeats = atoi(argv[1]);
    const double batch_s = atof(argv[2]);
    const long kc = XFC_TDB_KC;
    float *ap = panel(XFC_MR * kc), *bp = panel(XFC_NR * kc), *c = panel(XFC_MR * XFC_NR);
    if (!ap || !bp || !c || repeats < 1 || repeats > 1000 || !(batch_s > 0)) return 2;
    for (long i = 0; i < XFC_MR * kc; i++) ap[i] = 1e-3f * (float)(i % 7 + 1);
    for (long i = 0; i < XFC_NR * kc; i++) bp[i] = 1e-3f * (float)(i % 5 + 1);
    /* The tile must compute C = A^T B over the packed panels before it is timed. */
    xfc_ukernel(kc, ap, NULL, bp, c, XFC_NR, 0, 0, NULL);
    for (long i = 0; i < XFC_MR; i++)
        for (long j = 0; j < XFC_NR; j++) {
            double ref = 0, mag = 0;
            for (long k = 0; k < kc; k++) {
                double t = (double)ap[k * XFC_MR + i] * (double)bp[k * XFC_NR + j];
                ref += t;
                mag += fabs(t);
            }
            if (fabs((double)c[i * XFC_NR + j] - ref) > 4.0 * kc * FLT_EPSILON * mag) {
                printf("mismatch row %ld column %ld: %g, expected %g\n", i, j, (double)c[i * XFC_NR + j], ref);
                return 3;
            }
        }
    long calls = 1;
    for (;;) {  /* calls per batch: double until one batch lasts batch_s */
        double t0 = now();
        for (long it = 0; it < calls; it++) {
            xfc_ukernel(kc, ap, NULL, bp, c, XFC_NR, (int)(it & 1), 0, NULL);
            __asm__ volatile("" : : "r"(c) : "memory");
        }
        if (now() - t0 >= batch_s || calls >= (1L << 40)) break;
        calls *= 2;
    }
    printf("calls %ld\n", calls);
    for (int r = 0; r < repeats; r++) {
        double t0 = now();
        for (long it = 0; it < calls; it++) {
            xfc_ukernel(kc, ap, NULL, bp, c, XFC_NR, (int)(it & 1), 0, NULL);
            __asm__ volatile("" : : "r"(c) : "memory");
        }
        printf("sample %.6e\n", (now() - t0) / (double)calls);
    }
    return 0;
}
"""

HOST_ISAS = ("avx512", "avx2", "generic")


def l1_resident_kc(tile: MicroTile, core: CpuCore, fill: float = 0.5) -> int:
    """A reduction depth whose A and B micro-panels fit the given share of L1d (8 <= kc <= 256)."""
    kc = int(core.l1d.size_bytes * fill // ((tile.mr + tile.nr) * FLOAT_BYTES))
    return max(8, min(256, kc // 8 * 8))


class HostMicroKernelEvaluator:
    """Times the micro-kernel xfc renders for a tile on this machine (one thread, panels in L1).

    Thread-safe: builds run in parallel (one temporary directory each) while timed runs take a
    lock, so `--jobs N` overlaps compiling with timing without timing two tiles at once.
    """

    source = "host"

    def __init__(self, repeats: int = 9, batch_s: float = 0.002, work_dir: Optional[Path] = None):
        self.repeats = repeats
        self.batch_s = batch_s
        self.work_dir = work_dir
        self._timing = threading.Lock()

    def evaluate(self, tile: MicroTile, core: CpuCore, isa: str) -> MicroTileScore:
        cluster = CpuCluster(role="big", core=core, count=1, clock_ghz=core.typical_max_clock_ghz,
                             cpu_ids=(0,), l2=core.l2)
        r = self.measure(tile, cluster, isa)
        return MicroTileScore(cycles_per_k=r.cycles_per_k, efficiency=r.efficiency, bound=r.bound, source="host")

    @staticmethod
    def kernel_source(tile: MicroTile, isa: str, kc: int) -> tuple[str, str]:
        """(C source of the rendered kernel holding the tile's xfc_ukernel, its gcc -march value)."""
        from ..cpu.plans import hand_plan
        from ..cpu.codegen import render_cpu_kernel
        from ..ops.spec import make_spec
        if isa not in HOST_ISAS:
            raise XfcError(f"the host evaluator times x86 kernels; isa {isa!r} is not one of {', '.join(HOST_ISAS)}")
        spec = make_spec("matmul", dict(m=4 * tile.mr, n=4 * tile.nr, k=kc))
        # the register tile's loop alone: the driver calls xfc_ukernel itself, with no next panel to prefetch
        plan = hand_plan(spec, isa, 1, mr=tile.mr, nr=tile.nr, kc=kc, a_pack="packed", function_name="xfc_tiledb_uk",
                         prefetch_next_panel_lines=0)
        return render_cpu_kernel(plan).source, plan.gcc_march

    def measure(self, tile: MicroTile, cluster: CpuCluster, isa: str) -> TileResult:
        core = cluster.core
        kc = l1_resident_kc(tile, core)
        kernel, march = self.kernel_source(tile, isa, kc)
        flags = ["-O3", "-fopenmp", "-Wno-unused-function", f"-DXFC_TDB_KC={kc}"] + ([f"-march={march}"] if march else [])
        name = f"{isa} {tile.mr}x{tile.nr}"
        with tempfile.TemporaryDirectory(prefix="xfc-tiledb-", dir=self.work_dir) as tmp:
            work = Path(tmp)
            (work / "kernel.c").write_text(kernel)
            (work / "driver.c").write_text(DRIVER)
            exe = hostcc.compile_c(work / "driver.c", work / "uk", flags, f"host compile of micro-kernel {name}")
            with self._timing:
                before = hostcc.snapshot()
                out = run([str(exe), str(self.repeats), repr(self.batch_s)], f"timing micro-kernel {name}",
                          hostcc.RUN_TIMEOUT_S, errors={3: VerificationError}).stdout  # 3: wrong result
                after = hostcc.snapshot()
        samples = [float(line.split()[1]) for line in out.splitlines() if line.startswith("sample ")]
        if len(samples) != self.repeats or not all(s > 0 and math.isfinite(s) for s in samples):
            raise XfcError(f"timing micro-kernel {name}: unexpected driver output {out[:120]!r}")
        # The best repeat is the value (as benchmarks/ukernel_peak.py reports): other processes
        # only ever slow a run down, so the fastest is nearest to what the tile sustains alone.
        best, median = min(samples), statistics.median(samples)
        seconds_per_k = best / kc
        clock_hz = cluster.clock_ghz * 1e9
        cycles = seconds_per_k * clock_hz
        gflops = 2.0 * tile.mr * tile.nr * kc / best / 1e9
        conditions = hostcc.conditions(before, after)
        conditions.update(kc=kc, clock_ghz=cluster.clock_ghz, clock_from="description", value="best of repeats",
                          median_s_per_k=median / kc, threads=1)
        return TileResult(cycles_per_k=cycles, seconds=seconds_per_k, gflops=gflops,
                          efficiency=gflops / cluster.peak_gflops_per_core, bound="measured", repeats=len(samples),
                          spread=(max(samples) - min(samples)) / median, conditions=conditions,
                          compiler=hostcc.compiler_version())


# ---------------------------------------------------------------------------------------------
# llvm-mca: the AArch64 micro-kernel's K loop under the core's closest LLVM 16 model.
# ---------------------------------------------------------------------------------------------

MCA_KC = 256   # deep enough that GCC keeps the K loop (no full unroll); llvm-mca ignores caches


class McaMicroKernelEvaluator:
    """Renders a tile's micro-kernel (hand_plan with the tile's MR, NR and A load width, on a
    problem with no tails), compiles it with xfc's ARM flags and runs llvm-mca-16 on its K loop
    (xfc.analysis.mca). cycles_per_k = the loop's cycles on the core's FMA pipes (rescaled where the
    LLVM model has other pipes, see xfc.analysis.mca.MODELS) / the k steps one iteration covers.

    Results are cached per (tile, -march, model, compiler version), so `evaluate` (synthesis)
    and `measure` (tile-DB rows) never compile or analyse one tile twice. Thread-safe.
    """

    def __init__(self):
        from ..analysis import mca
        self._mca = mca
        self._lock = threading.Lock()
        self._cache: dict[tuple, tuple] = {}
        self.compiles = 0          # kernels compiled and analysed (not cache hits)

    def source_for(self, cluster: CpuCluster) -> str:
        return self._mca.model_for(cluster.core).source

    def kernel(self, tile: MicroTile, core: CpuCore, isa: str):
        """The rendered kernel (xfc.cpu.codegen.RenderedKernel) holding the tile's xfc_ukernel."""
        from ..cpu.codegen import render_cpu_kernel
        from ..cpu.plans import hand_plan
        from ..ops.spec import make_spec
        if isa != "neon":
            raise XfcError(f"the llvm-mca evaluator analyses AArch64 NEON micro-kernels; isa {isa!r} is not neon")
        spec = make_spec("matmul", dict(m=4 * tile.mr, n=4 * tile.nr, k=MCA_KC))
        plan = hand_plan(spec, "neon", 1, mr=tile.mr, nr=tile.nr, kc=MCA_KC, a_pack="packed",
                         a_load_bits=tile.a_load_bits, gcc_march=core.gcc_march, qemu_cpu=core.qemu_cpu,
                         function_name="xfc_tiledb_uk")
        return render_cpu_kernel(plan)

    def analyze(self, tile: MicroTile, core: CpuCore, isa: str):
        """(xfc.analysis.mca.McaResult, k steps per loop iteration) for the tile on the core (cached)."""
        model = self._mca.model_for(core)
        key = self._key(tile, core, isa)
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        result = self._mca.analyze_kernel(self.kernel(tile, core, isa), core, model)
        k_steps, rest = divmod(result.counts.fma, tile.accumulator_registers)
        if k_steps < 1 or rest:
            raise XfcError(f"llvm-mca evaluator: the K loop of tile {tile.mr}x{tile.nr} has {result.counts.fma} FMAs, "
                           f"not a multiple of its {tile.accumulator_registers} accumulators")
        with self._lock:
            self.compiles += key not in self._cache
            self._cache[key] = (result, k_steps)
        return result, k_steps

    def _key(self, tile: MicroTile, core: CpuCore, isa: str) -> tuple:
        return (tile, isa, core.gcc_march, self._mca.model_for(core), self._mca.compiler_version(),
                self._mca.llvm_mca_version())

    def prepare(self, tiles, core: CpuCore, isa: str) -> None:
        """Analyse the tiles not cached yet, one compiler and llvm-mca process per CPU this process may
        use at a time (the synthesizer's ranking then reads the cache) instead of one after another. A
        failure or an interrupt cancels what has not started and is raised."""
        from concurrent.futures import ThreadPoolExecutor
        with self._lock:
            todo = [t for t in dict.fromkeys(tiles) if self._key(t, core, isa) not in self._cache]
        if len(todo) < 2:
            return
        pool = ThreadPoolExecutor(max_workers=max(1, min(len(todo), len(os.sched_getaffinity(0)))))
        try:
            for future in [pool.submit(self.analyze, tile, core, isa) for tile in todo]:
                future.result()
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True)

    def evaluate(self, tile: MicroTile, core: CpuCore, isa: str) -> MicroTileScore:
        result, k_steps = self.analyze(tile, core, isa)
        cycles = result.estimate_cycles_per_iteration / k_steps
        return MicroTileScore(cycles_per_k=cycles, efficiency=result.estimate_pipe_share,
                              bound=f"llvm-mca {result.bottleneck}", source=result.source)

    def measure(self, tile: MicroTile, cluster: CpuCluster, isa: str) -> TileResult:
        result, k_steps = self.analyze(tile, cluster.core, isa)
        cycles = result.estimate_cycles_per_iteration / k_steps
        conditions = {
            "what": "static estimate from llvm-mca's scheduling model, not a timing",
            "llvm_mca": result.llvm_mca, "mcpu": result.model, "scheduling_model": result.scheduling_model,
            "reliable": result.reliable, "pipes_scale": result.pipes_scale,
            "model_cycles_per_iteration": round(result.cycles_per_iteration, 4),
            "cycles_per_iteration": round(result.estimate_cycles_per_iteration, 4), "k_steps_per_iteration": k_steps,
            "instructions_per_iteration": result.counts.instructions, "fma_per_iteration": result.counts.fma,
            "spill_stores": result.counts.spill_stores, "stack_reloads": result.counts.stack_reloads,
            "register_moves": result.counts.register_moves, "kc": MCA_KC, "threads": 1,
        }
        if result.scaled_arithmetic:
            conditions["rescaled"] = result.scaled_arithmetic
        if not result.reliable:
            conditions["unreliable"] = result.model_note
        return TileResult(cycles_per_k=cycles, seconds=cycles / (cluster.clock_ghz * 1e9),
                          gflops=result.estimate_pipe_share * cluster.peak_gflops_per_core,
                          efficiency=result.estimate_pipe_share, bound=f"llvm-mca {result.bottleneck}", repeats=1,
                          spread=0.0, conditions=conditions, compiler=result.compiler)


# ---------------------------------------------------------------------------------------------
# Answering synthesis from the database.
# ---------------------------------------------------------------------------------------------

class TileDbEvaluator:
    """A MicroTileEvaluator that answers from a tile database and falls back to the static model.

    Rows are read once per ISA. A row from a measurement, a published figure or llvm-mca answers
    for its tile with source 'tile_db:<row source>'; tiles with no such row (and 'static' rows,
    which the live model reproduces) get the static model. Emulated rows never answer; when the
    fingerprint has any, `notes` says so (printed by `xfc synth --explain`). A database that
    fails to read gives one warning through warn() and the static model from then on; it never
    raises.
    """

    def __init__(self, db: Optional[TileDb], hw: HardwareDescription, cluster_role: Optional[str] = None, *,
                 dtype: str = "fp32", warn: Optional[Callable[[str], None]] = None):
        self.db = db
        self._hw = hw
        self.calibrated = False
        self.cluster = hw.cluster(cluster_role)
        self.fingerprint = fingerprint(hw, self.cluster)
        self.label = label(hw, self.cluster)
        self.dtype = dtype
        self.notes: list[str] = []
        self._warn = warn or (lambda message: None)
        self._static = StaticEvaluator()
        self._rows: dict[str, dict] = {}
        self._scores: dict = {}          # (tile, isa) -> MicroTileScore (evaluate)
        self.plan_cache = None          # a plancache.PlanCache: warm synthesis (synthesis_evaluator sets it)
        self._say_emulated()

    def close(self) -> None:
        if self.plan_cache is not None:
            self.plan_cache.close()
        if self.db is not None:
            self.db.close()
            self.db = None

    def tile_state(self) -> str:
        """A digest of the rows that may answer micro-tile scores for this fingerprint (every
        non-static GEMM micro-kernel row): a plan recorded under another state is stale."""
        if self.db is None:
            return "none"
        try:
            rows = self.db.query("SELECT COUNT(*), MAX(created_at), TOTAL(cycles_per_k), TOTAL(seconds), "
                                 "TOTAL(emulated) FROM tile WHERE fingerprint = ? AND op_class = ? AND dtype = ? "
                                 "AND source != 'static'", (self.fingerprint, OP_GEMM_UKERNEL, self.dtype))
        except TileDbError as exc:
            self._note(f"warning: {exc}; using the static model")
            self.db = None
            return "none"
        return f"{self.db.path}|" + "|".join(repr(v) for v in rows[0])

    def synthesize(self, spec, hw, cluster=None, threads=None, evaluator=None, isa=None, constants=None):
        """synthesize_cpu with this evaluator, answered from the plan cache when it holds this
        request's plan (xfc.tiledb.plancache); the pipeline calls it in place of synthesize_cpu."""
        return cached_synthesis(self.plan_cache, spec, hw, fingerprint=fingerprint(hw, hw.cluster(cluster)),
                                tile_state=self.tile_state(), cluster=cluster, threads=threads,
                                evaluator=evaluator or self, isa=isa, constants=constants or DEFAULT_CONSTANTS)

    def constants(self):
        """The cost-model constants for synthesis: the database's calibration for this cluster's
        fingerprint (xfc tiledb calibrate), else the static ones. Never raises."""
        from ..cpu.cost_model import DEFAULT_CONSTANTS
        from .calibrate import calibrated_constants
        if self.db is None:
            return DEFAULT_CONSTANTS
        try:
            found = calibrated_constants(self.db, self._hw, self.cluster)
        except TileDbError as exc:
            self._note(f"warning: {exc}; using the static cost-model constants")
            return DEFAULT_CONSTANTS
        if found is None:
            return DEFAULT_CONSTANTS
        self.calibrated = True
        return found

    def _note(self, message: str) -> None:
        self.notes.append(message)
        self._warn(message)

    def _rows_for(self, isa: str) -> dict:
        if isa in self._rows:
            return self._rows[isa]
        rows: dict = {}
        if self.db is not None:
            try:
                rows = self.db.best_tiles(self.fingerprint, OP_GEMM_UKERNEL, self.dtype, isa)
                if not rows:
                    stale = [fp for fp in self.db.fingerprints_for_label(self.label) if fp != self.fingerprint]
                    if stale:
                        from .locations import is_shipped_hardware
                        described = (self._hw.name if self._hw.kind == "host" or is_shipped_hardware(self._hw)
                                     else self._hw.source_path)
                        self._note(f"note: tile db {self.db.path}: its rows for {self.label} were built from a "
                                   f"different description (fingerprint {stale[0][:12]}, now {self.fingerprint[:12]}); "
                                   f"ignored, using the static model (rows for this one: xfc tiledb build --hw "
                                   f"{described} --cluster {self.cluster.role} --db {self.db.path} --evaluators "
                                   f"{'host' if self._hw.kind == 'host' else 'llvm-mca'}; --tile-db off skips the "
                                   f"database)")
            except TileDbError as exc:
                self._note(f"warning: {exc}; using the static model")
                self.db = None
                rows = {}
        self._rows[isa] = rows
        return rows

    def _say_emulated(self) -> None:
        """One note (not a warning) when this fingerprint has emulated micro-tile rows: they are
        kept for the record but never answer, and `xfc synth --explain` prints the note so that
        nobody takes the scores for device timings."""
        if self.db is None:
            return
        try:
            found = self.db.query("SELECT source, COUNT(*) FROM tile WHERE fingerprint = ? AND op_class = ? "
                                  "AND dtype = ? AND emulated != 0 GROUP BY source ORDER BY source",
                                  (self.fingerprint, OP_GEMM_UKERNEL, self.dtype))
        except TileDbError:
            return                     # the first real read warns and falls back
        if found:
            sources = ", ".join(f"{n} from {source}" for source, n in found)
            self.notes.append(f"tile db {self.db.path}: emulated micro-tile rows for {self.label} ({sources}) are "
                              "kept for the record but never rank tiles; scores come from the other rows or the "
                              "static model")

    def evaluate(self, tile: MicroTile, core: CpuCore, isa: str) -> MicroTileScore:
        # `is` first: a dataclass == compares every field of the core, and this runs for every tile
        if core is not self.cluster.core and core != self.cluster.core:
            return self._static.evaluate(tile, core, isa)
        # one synthesis asks for the same tiles hundreds of times (every GEMM of a Winograd plan,
        # both vector axes); the rows behind an answer do not change while the evaluator lives
        key = (tile, isa)
        score = self._scores.get(key)
        if score is None:
            score = self._scores[key] = self._evaluate(tile, core, isa)
        return score

    def _evaluate(self, tile: MicroTile, core: CpuCore, isa: str) -> MicroTileScore:
        row = self._rows_for(isa).get(tile_params(tile))
        if row is None or row.source == "static":
            return self._static.evaluate(tile, core, isa)
        cycles = row.cycles_per_k if row.cycles_per_k else row.seconds * self.cluster.clock_ghz * 1e9
        fma_cycles = tile.accumulator_registers / core.fma_per_cycle
        return MicroTileScore(cycles_per_k=cycles, efficiency=fma_cycles / cycles, bound=row.bound,
                              source=f"tile_db:{row.source}")


def synthesis_evaluator(choice: str, hw: HardwareDescription, cluster_role: Optional[str],
                        environ: Mapping[str, str], warn: Callable[[str], None]) -> Optional[TileDbEvaluator]:
    """What `xfc synth --tile-db PATH|auto|off` plugs into synthesize_cpu(evaluator=...): None for
    'off'; otherwise a TileDbEvaluator over the resolved database (see locations.resolve), which
    answers with the static model when the database is missing, locked, corrupt or stale. An
    explicit PATH that does not exist is an OperatorError (locations.resolve). Close it with
    .close() when synthesis is done."""
    from .locations import resolve, user_db_path
    path = resolve(choice, hw, environ)
    if path is None:
        return None
    user = user_db_path(environ)
    quiet = choice == "auto" and path == user   # nothing measured yet is normal
    db = open_for_synthesis(path, warn, quiet_if_missing=quiet)
    evaluator = TileDbEvaluator(db, hw, cluster_role, warn=warn)
    if path == user and db is None and Path(path).exists():
        return evaluator                 # the per-user database is unusable: warned once already
    evaluator.plan_cache = PlanCache(user, warn, reader=db if path == user else None).prepare()
    return evaluator


def synthesis_inputs(choice: str, hw: HardwareDescription, cluster_role: Optional[str],
                     environ: Mapping[str, str], warn: Callable[[str], None]):
    """(evaluator or None, cost-model constants or None, report entry) for a tile-database choice
    PATH|auto|off, as `xfc synth --tile-db` and the Python API (xfc.api) take it. A missing, locked,
    corrupt or stale database costs one warning and leaves the static model; close the evaluator
    when synthesis is done."""
    from .locations import resolve
    if choice == "off" or not hw.clusters:
        return None, None, {"choice": choice, "path": None, "constants": "static"}
    evaluator = synthesis_evaluator(choice, hw, cluster_role, environ, warn)
    path = resolve(choice, hw, environ)
    if evaluator is None:
        return None, None, {"choice": choice, "path": str(path) if path else None, "constants": "static"}
    constants = evaluator.constants()
    entry = {"choice": choice, "path": str(path) if path else None, "opened": evaluator.db is not None,
             "constants": "calibrated" if evaluator.calibrated else "static",
             "constant_values": constants.as_dict(), "notes": list(evaluator.notes),
             "plan_cache": evaluator.plan_cache.report if evaluator.plan_cache else None}  # filled in by synthesis
    return evaluator, constants, entry


def open_for_synthesis(path: Optional[Path], warn: Callable[[str], None], *, quiet_if_missing: bool = False
                       ) -> Optional[TileDb]:
    """The database at path opened read-only for synthesis, or None after one warning line.

    Missing, locked, corrupt, foreign, older- or newer-schema files never stop synthesis.
    quiet_if_missing: say nothing when the file does not exist (the per-user database under
    `--tile-db auto` before anything was measured).
    """
    if path is None:
        return None
    if not Path(path).exists():
        if not quiet_if_missing:
            warn(f"warning: tile db {path}: no such file; using the static model")
        return None
    try:
        return TileDb.open(path, readonly=True, busy_timeout_s=2.0)
    except XfcError as exc:
        warn(f"warning: {exc}; using the static model")
        return None
