"""The int8 plan type (Int8Plan): what xfc.cpu.int8_synth (x86 hosts) and xfc.cpu.int8_arm (AArch64) produce
and xfc.cpu.int8_codegen renders. A module of its own so that both planners import it without
importing each other."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..ops.dtypes import INT8, DType
from ..ops.quant import QuantParams
from ..ops.spec import OperatorSpec


def widened_to_int16(dialect: str, pair_sums_int16: bool, k_depth: int = 4) -> bool:
    """Whether the GEMM operand that is not broadcast is packed as int16 (avx2 without pair sums: the
    even and odd bytes as vpmaddwd's int16 pairs, two bytes per k element): the codegen's packing and
    the planner's panel sizes both read it."""
    return dialect == "avx2" and k_depth == 4 and not pair_sums_int16


@dataclass(frozen=True)
class Int8Plan:
    spec: OperatorSpec
    quant: QuantParams                 # out_scale resolved
    dialect: str                          # one of INT8_DIALECTS
    lowering: str                      # 'gemm' | 'implicit_gemm' | 'direct_depthwise'
    mr: int
    nv: int
    lanes: int
    threads: int
    function_name: str
    gcc_march: str
    predicted_gops: Optional[float]
    header_lines: tuple[str, ...]
    reasons: tuple[str, ...]
    tile_rows: int = 1                 # conv2d: a column tile spans this many output rows
    k_depth: int = 4                   # k elements per packed group (ARM smmla: 8)
    qemu_cpu: str = ""                 # ARM: the qemu-aarch64 -cpu model verification runs on
    target_arch: str = "x86_64"        # "aarch64": a static harness under qemu (xfc/cpu/qarm.py)
    ops_per_cycle: Optional[float] = None             # ARM: the issue model's int8 ops per cycle
    registers: Optional[tuple[int, int]] = None       # ARM: (vector registers used, available)
    split_loads: bool = False          # ARM in-order variant: 128-bit operands loaded as two 64-bit halves
    # Decisions the templates spell (they used to take them themselves):
    activation_offset: int = 0         # GEMM lowerings: added to every activation byte by an XOR with 0x80 so that the dot
                                       # product's signedness fits (x86 u8 x s8: int8 x + 128; ARM s8 x s8:
                                       # uint8 x - 128); 0: used as they are. The kernel subtracts the
                                       # shifted zero point a_zero_point + activation_offset
    row_operand: str = "activations"   # GEMM rows: 'activations' (matmul: M = rows of x, weights are the
                                       # packed columns) or 'weights' (implicit-GEMM conv: M = output
                                       # channels, columns are pixels of the staged input)
    parallel_axis: str = "columns"     # what threads split: 'columns' (GEMM column tiles: a thread owns whole output
                                       # columns), 'planes' (depthwise: whole (image, channel) planes) or
                                       # 'channel_groups' (depthwise 'channels': (image, 16-channel group) pairs)
    k_unroll: int = 0                  # the k loops' unroll pragma: 0 leaves it to the compiler, 1 forbids it
    target_pragma: str = ""            # depthwise on x86: the `#pragma GCC target` the kernel is compiled for
                                       # ('' none: the -march of the build)
    depthwise_layout: str = "plane"    # depthwise: 'plane' (each channel plane staged as int16 x - zp, row loops
                                       # vectorized by the compiler: generic, ARM) or 'tap_pairs' (staged as int16
                                       # pairs of horizontally adjacent taps, explicit vpmaddwd / vpdpwssd on
                                       # `lanes` output pixels per vector, blocks of tile_rows output rows x nv
                                       # vectors; x86 avx2 / vnni: int8_synth.choose_depthwise_block) or 'channels'
                                       # (vnni with avx512vbmi: groups of `lanes` channels in the lanes, quads of
                                       # adjacent taps, nv output pixels per block: int8_synth.depthwise_channels_block)
    column_layout: str = "rows"        # implicit-GEMM conv columns: 'rows' (a vector holds pixels of one output row;
                                       # a tile spans tile_rows rows) or 'flat' (stride 1: the staged rows, padding
                                       # included, read as one long row, so a vector runs on into the next output
                                       # row; the padding columns are computed and dropped: int8_synth.flat_shape)
                                       # or 'im2col' (strided: every tap gathered per output pixel when staged,
                                       # the outputs as one run: int8_synth.im2col_shape) or 'channels' (the
                                       # GEMM turned around: output pixels as gathered rows, output channels in
                                       # the lanes, row_operand 'activations': int8_synth.channels_shape)
    channels_rows_in_place: bool = False   # column_layout 'channels': each row tile's pixels read where the staged
                                       # input holds them (tiles within one output row, a pixel's k group
                                       # KD x stride_w bytes after the previous one), no per-call gather
                                       # (int8_synth.channels_in_place_shape); False: gathered into row panels
    flat_row_pixels: int = 0           # column_layout 'flat': pixels of a staged row (int8_synth.flat_row_width: the
                                       # input row and its wider side padding); 0 for the other layouts
    pair_sums_int16: bool = False      # avx2 GEMM kernels: u8 x s8 products summed in pairs by vpmaddubsw, exact
                                       # because every weight is within +-64 (QuantParams.narrow_weights); the
                                       # pre-pack refuses a weight outside it. False: bytes widened to int16 (vpmaddwd)
    prefetch_every_groups: int = 0     # GEMMs whose weights are the column panels (matmul, 'channels' conv, x86): each row
    prefetch_lines_per_step: int = 0   # tile prefetches its share of the next panel into L2, this many cache lines every
                                       # this many k groups (int8_synth.next_panel_prefetch); 0: off
    depthwise_staging: str = ""        # 'tap_pairs': how a staged row's tap pairs are built from the int16 input
                                       # row V (int8_synth.depthwise_staging): 'pairs' (stride 1: (V[i], V[i + dw])
                                       # interleaved), 'direct' (stride 2, dilation 1: V itself), 'gather'

    @property
    def nr(self) -> int:
        return self.nv * self.lanes

    @property
    def dtype(self) -> DType:
        return INT8

    def summary(self) -> dict:
        out = {"dialect": self.dialect, "lowering": self.lowering, "mr": self.mr, "nr": self.nr,
               "tile_rows": self.tile_rows, "threads": self.threads}
        if self.column_layout != "rows":
            out.update(column_layout=self.column_layout)
        if self.channels_rows_in_place:
            out.update(channels_rows="in_place")
        if self.prefetch_every_groups:
            out.update(prefetch_every_groups=self.prefetch_every_groups,
                       prefetch_lines_per_step=self.prefetch_lines_per_step)
        if self.lowering == "direct_depthwise":
            out.update(layout=self.depthwise_layout, lanes=self.lanes, vectors=self.nv, parallel_axis=self.parallel_axis)
            if self.depthwise_staging:
                out.update(staging=self.depthwise_staging)
        if self.target_arch == "aarch64" and self.lowering != "direct_depthwise":
            out.update(k_depth=self.k_depth, registers_used=self.registers[0], registers_available=self.registers[1],
                       predicted_ops_per_cycle=round(self.ops_per_cycle, 2), split_loads=self.split_loads)
        return out


@dataclass(frozen=True)
class Int8Synthesis:
    """An int8 plan with its explanation and report keys: what the chain reads of a synthesis
    (the fp32 and fp16 planners return xfc.cpu.explain.CpuSynthesis, with the same methods)."""

    plan: Int8Plan
    seconds: float = 0.0

    def explain(self) -> str:
        return "\n".join([*self.plan.header_lines, *("  " + r for r in self.plan.reasons)])

    @property
    def predicted_s(self) -> float:
        """Seconds the issue model predicts for one call (inf where the plan has no prediction)."""
        gops = self.plan.predicted_gops
        return self.plan.spec.flops / (gops * 1e9) if gops else float("inf")

    def summary_line(self) -> str:
        plan = self.plan
        if plan.lowering == "direct_depthwise" and plan.depthwise_layout == "channels":
            return f"int8 {plan.dialect} depthwise (channels: {plan.lanes} in the lanes, {plan.nv} pixels per block)"
        if plan.lowering == "direct_depthwise":
            return (f"int8 {plan.dialect} depthwise ({plan.depthwise_layout}, {plan.tile_rows} row(s) x {plan.nv} x "
                    f"{plan.lanes} pixels)")
        return f"int8 {plan.dialect} tile {plan.mr}x{plan.nr}" + (f" ({plan.column_layout} columns)"
                                                                   if plan.column_layout != "rows" else "")

    def report(self) -> dict:
        plan = self.plan
        return {"tiles": {"mr": plan.mr, "nr": plan.nr} if plan.lowering != "direct_depthwise" else None,
                "predicted_gflops": plan.predicted_gops, "quantization": plan.quant.as_dict(), "dialect": plan.dialect,
                "lowering": plan.lowering, "tile_summary": plan.summary(), "threads": plan.threads,
                "predicted_bound": "compute (int8 issue model)", "explain": self.explain()}
