"""What CPU synthesis hands back beside the plan: the tile levels, the estimate, the explanation.

  TileLevel        one level of the tile program and what decided it
  CpuSynthesis     plan + levels + estimate + runners-up; .explain() (text) and .report() (dict)
  gemm_levels / depthwise_levels   the TileLevel lines of a grown schedule (synth.py's reasons)
  plan_header      the comment lines a generated kernel starts with
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .._version import __version__
from ..hardware.model import CpuCluster
from ..ops.spec import Conv2dSpec, DepthwiseSpec, OperatorSpec
from .config import fma_rate
from .cost_model import CostEstimate
from .ir import CpuKernelPlan, DepthwiseSchedule, GemmSchedule
from .isa import isa_row
from .tiles import FLOAT_BYTES, MicroTile, MicroTileScore, round_up

PREDICTION_NOTE = "static cost model, not a measurement"
STAGE_L1_SHARE = 0.75   # a depthwise row block counts as L1-resident up to this share of L1d


@dataclass(frozen=True)
class TileLevel:
    level: str        # 'REG', 'L1', 'L2', 'L3', 'CORES' (depthwise: 'REG', 'STAGE', 'CORES')
    tile: str         # what the tile is, e.g. 'mr=14 x nr=32, k unroll 4'
    usage: str        # the constraint it satisfies, e.g. 'registers 31 of 32'
    decided_by: str   # what stopped growth or picked the value


@dataclass(frozen=True)
class GemmReasons:
    """Why growth (synth.py) chose each GEMM level; the cost model does not need them."""

    kc: str
    mc: str
    nc: str
    split: str
    a_pack: str
    imbalance: float
    shared_bytes: int      # the shared cache NC is sized for
    shared_name: str       # 'L3', 'SLC' or 'L2 (no shared L3 described)'
    loop_order: str = "BLIS order"   # why jr (B micro-panels) is outside ir (row tiles), or not


@dataclass(frozen=True)
class CpuSynthesis:
    spec: OperatorSpec
    hardware: str
    cluster: CpuCluster
    plan: CpuKernelPlan
    levels: tuple[TileLevel, ...]
    estimate: CostEstimate
    gemm_shape: Optional[tuple[int, int, int]]   # (M, N, K) of the lowered GEMM, per batch item
    alternatives: tuple[tuple[str, float], ...] = field(default_factory=tuple)  # (summary, predicted_s)
    micro_tile_source: str = "static"
    decision: str = ""   # conv2d: which lowering won and why (xfc/cpu/winograd.py choose)

    @property
    def tiles_line(self) -> str:
        """The plan's 'tiles: ...' header line, without the prefix."""
        line = next((ln for ln in self.plan.header_lines if ln.startswith("tiles:")), "tiles: ?")
        return line[len("tiles:"):].strip()

    def explain(self) -> str:
        c = self.cluster
        lines = [f"xfc {__version__}: {self.spec.describe()}",
                 f"hardware: {self.hardware}, {c.role} cluster: {c.count}x {c.core.name} @ {c.clock_ghz:g} GHz "
                 f"({c.core.pipeline.replace('_', '-')}, {c.core.vector_bits}-bit SIMD x{c.core.vector_registers} "
                 f"registers, {fma_rate(c.core, self.plan.isa):g} FMA/cycle, L1d {c.core.l1d.size_bytes // 1024} KiB, "
                 f"L2 {c.l2.size_bytes // 1024} KiB), isa {self.plan.isa}"]
        if self.plan.lowering == "winograd":
            m, n, k = self.gemm_shape
            a = self.plan.winograd_m + 2
            lines.append(f"lowering: winograd F({a - 2}x{a - 2},3x3) as {a * a} GEMMs M={m} N={n} K={k}"
                         + (f" (x{self.spec.n} batch)" if self.spec.n > 1 else ""))
        elif self.gemm_shape:
            m, n, k = self.gemm_shape
            lines.append(f"lowering: {self.plan.lowering} as GEMM M={m} N={n} K={k}"
                         + (f" (x{self.spec.n} batch)" if isinstance(self.spec, Conv2dSpec) and self.spec.n > 1 else ""))
        else:
            lines.append(f"lowering: {self.plan.lowering}")
        width = [max(len(x) for x in col) for col in zip(*[(lv.level, lv.tile, lv.usage) for lv in self.levels])]
        for lv in self.levels:
            lines.append(f"  {lv.level.ljust(width[0])}  {lv.tile.ljust(width[1])}  {lv.usage.ljust(width[2])}"
                         f"  <- {lv.decided_by}")
        est = self.estimate
        parts = ", ".join(f"{name} {s * 1e3:.3f} ms" for name, s in est.seconds_by_bound)
        lines.append(f"predicted ({PREDICTION_NOTE}): {est.predicted_s * 1e3:.3f} ms, "
                     f"{est.predicted_gflops:.1f} GFLOP/s, bound: {est.bound} ({parts})")
        if self.alternatives:
            lines.append("runners-up: " + "; ".join(f"{s} {t * 1e3:.3f} ms" for s, t in self.alternatives[:3]))
        if self.decision:
            lines.append(self.decision)
        return "\n".join(lines)

    def summary_line(self) -> str:
        """One line for progress output: the plan's tile line."""
        return self.plan.header_lines[-2]

    def report(self) -> dict:
        """The synthesis part of a report: 'tiles' are the tile sizes (what the cost model ranks),
        'code_shape' the code-shape choices of the same plan."""
        plan = self.plan
        out = {
            "operator": self.spec.name, "shape": self.spec.describe(), "key": self.spec.key(),
            "hardware": self.hardware, "cluster": self.cluster.role, "core": self.cluster.core.name,
            "isa": plan.isa, "lowering": plan.lowering,
            "levels": [{"level": lv.level, "tile": lv.tile, "usage": lv.usage, "decided_by": lv.decided_by}
                       for lv in self.levels],
            "predicted_seconds": self.estimate.predicted_s, "predicted_gflops": self.estimate.predicted_gflops,
            "predicted_bound": self.estimate.bound, "prediction_note": PREDICTION_NOTE,
            "flops": self.spec.flops, "micro_tile_source": self.micro_tile_source,
        }
        # GFLOP/s are always the operator's FLOPs over the time; a Winograd plan multiplies less, so its
        # "effective" figure can exceed the cores' peak, which is reported beside it
        out["gflops_basis"] = "effective" if plan.lowering == "winograd" else "executed"
        row, core = isa_row(plan.isa), self.cluster.core
        ratio = fma_rate(core, plan.isa) / core.fma_per_cycle * (32 // row.elem_bits)   # fp16: its rate, twice the lanes
        out["peak_gflops"] = round(self.cluster.peak_gflops_per_core * ratio * plan.threads, 3)
        if plan.lowering == "winograd":
            out["winograd_m"] = plan.winograd_m
            out["predicted_stages"] = dict(self.estimate.seconds_by_bound)
        if self.decision:
            out["lowering_choice"] = self.decision
        if plan.schedule is not None:
            out["tiles"] = plan.schedule.tiles()
            out["code_shape"] = plan.schedule.code_shape()
        return out


def gemm_levels(tile: MicroTile, score: MicroTileScore, sched: GemmSchedule, reasons: GemmReasons,
                cluster: CpuCluster, isa: str) -> tuple[TileLevel, ...]:
    core = cluster.core
    mr, nr, kc, mc, nc, threads = sched.mr, sched.nr, sched.kc, sched.mc, sched.nc, sched.threads
    regs = tile.registers(isa)
    a_note = (f", A packed ({reasons.a_pack})"
              + (f", via {tile.a_load_bits}-bit loads" if isa_row(isa).lane_indexed else "")
              if sched.a_pack == "packed" else f", A read in place ({reasons.a_pack}): no A packing")
    kc_from_l2 = reasons.kc.startswith(("transposed", "micro-panels streamed"))
    eb = tile.elem_bytes   # bytes per element: 4 (fp32) or 2 (fp16)
    return (
        TileLevel("REG", f"mr={mr} x nr={nr} ({tile.nr_vectors} x {tile.lanes}-lane vectors), k unroll {sched.k_unroll}",
                  f"registers {regs}/{core.vector_registers} (acc {tile.accumulator_registers} + B "
                  f"{tile.nr_vectors} + A {tile.a_registers(isa)}{a_note})",
                  f"micro-tile score {score.efficiency:.0%} of FMA peak ({score.bound}-bound, "
                  f"{score.cycles_per_k:.1f} cycles/k step, {score.source})"),
        TileLevel("L1", f"kc={kc}: B micro-panel {kc}x{nr} + A micro-panel {mr}x{kc}",
                  (f"{(mr + nr) * kc * eb / 1024:.1f} KiB of {cluster.l2.size_bytes // 1024} KiB L2 "
                   "(streamed through L1)" if kc_from_l2 else
                   f"{(mr + nr) * kc * eb / 1024:.1f} KiB of {core.l1d.size_bytes // 1024} KiB L1d"), reasons.kc),
        TileLevel("L2", f"mc={mc}: {'packed ' if sched.a_pack == 'packed' else ''}A block {mc}x{kc}",
                  f"{mc * kc * eb / 1024:.1f} KiB of {cluster.l2.size_bytes // 1024} KiB L2",
                  reasons.mc + ("" if sched.loop_order == "jr_ir" else f"; row tiles outside B micro-panels: "
                                                                       f"{reasons.loop_order}")
                  + (f"; its row tiles prefetch the next B micro-panel into L2 ({sched.prefetch_next_panel_lines} "
                     f"line(s) per unrolled k step: the weights of a network's layer come from memory)"
                     if sched.prefetch_next_panel_lines else "")),
        TileLevel("L3", f"nc={nc}: packed B panel {kc}x{nc}",
                  f"{kc * nc * eb / 1024:.1f} KiB of {reasons.shared_bytes // 1024} KiB "
                  f"{reasons.shared_name.split()[0]}", reasons.nc),
        TileLevel("CORES", f"{threads} thread(s), split {'N columns' if sched.parallel_axis == 'n' else 'M rows'}",
                  f"{threads} of {cluster.count} cores, load imbalance {reasons.imbalance:.2f}",
                  reasons.split if threads > 1 else "single thread requested"),
    )


def depthwise_levels(spec: DepthwiseSpec, sched: DepthwiseSchedule, cluster: CpuCluster, lanes: int,
                     weight_regs: int, fmas: int, loads: int, elem_bytes: int = FLOAT_BYTES) -> tuple[TileLevel, ...]:
    core = cluster.core
    oh_rows, ow_vectors = sched.oh_rows, sched.ow_vectors
    hp = spec.window_rows(oh_rows)
    wp = spec.w + spec.pad_left + spec.pad_right
    stage_bytes = hp * round_up(wp, lanes) * elem_bytes
    where = "L1" if stage_bytes <= core.l1d.size_bytes * STAGE_L1_SHARE else "L2"
    planes = spec.n * spec.c
    return (
        TileLevel("REG", f"{oh_rows} output rows x {ow_vectors} vectors of {lanes} ({oh_rows * ow_vectors} accumulators)",
                  f"registers {oh_rows * ow_vectors + weight_regs + 2}/{core.vector_registers} "
                  f"(acc {oh_rows * ow_vectors} + weights {weight_regs} + 2 input)",
                  f"best FMA/load ratio {fmas / loads:.2f} with the fewest wasted lanes"),
        TileLevel("STAGE", f"zero-padded{' phase-split' if spec.stride_w > 1 else ''} row block {hp}x{wp} "
                  f"(the input rows of {oh_rows} output rows)",
                  f"{stage_bytes / 1024:.1f} KiB in {where} ({core.l1d.size_bytes // 1024} KiB "
                  f"L1d, {cluster.l2.size_bytes // 1024} KiB L2)",
                  "one channel, one row block at a time: staged rows stay in L1, no boundary tests in the inner loop"),
        TileLevel("CORES", f"{sched.threads} thread(s) over {planes} (batch x channel) planes",
                  f"{sched.threads} of {cluster.count} cores", "planes are independent; memory-bound"),
    )


def plan_header(hw, cluster: CpuCluster, spec: OperatorSpec) -> list[str]:
    """The first comment lines of a synthesized kernel."""
    return [
        f"Generated by xfc {__version__} - do not edit; regenerate with 'xfc synth'.",
        f"hardware: {hw.name} ({hw.marketing_name}), {cluster.role} cluster: {cluster.count}x {cluster.core.name} "
        f"@ {cluster.clock_ghz:g} GHz",
        f"operator: {spec.describe()}",
    ]
