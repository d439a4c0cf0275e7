"""GPU tile IR: a kernel as three explicit levels plus what the OpenCL templates need.

    REG   per-work-item register tile: `rows` x `cols` outputs held in registers, the
          contiguous-axis part moved as `vector_width`-wide vectors (float4 / half4 / ...)
    WG    work-group tile: x * y work-items; optionally the reduction operands of the whole
          work-group block are staged through __local memory `stage_depth` elements at a time
    GRID  global size = work-groups needed to cover the output (ragged edges are clamped or
          guarded inside the kernel, never by padding the tensors)

Axes per operator (the contiguous output axis is always dimension 0, so consecutive
work-items touch consecutive addresses):
    matmul     rows = M,                cols = N            (dim 2 = batch)
    conv2d     rows = K out-channels,   cols = OH*OW pixels (dim 2 = batch)
    depthwise  rows = OH,               cols = OW           (dim 2 = batch * channels)

A GpuKernelPlan is a frozen value holding every decision; code generation (codegen.py) only
spells it and the templates only paste its numbers and strings.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..ops.spec import OperatorSpec

DTYPES = ("fp32", "fp16")
# variant = (storage type, compute type) the kernel file is rendered for
VARIANTS = {
    "fp32": ("float", "float"),
    "fp16": ("half", "half"),               # needs cl_khr_fp16 (PoCL cannot build it)
    "fp16_storage": ("half", "float"),      # vload_half/vstore_half: runs everywhere
}
PREDICTION_LABEL = "cost-model prediction, not a measurement"


@dataclass(frozen=True)
class RegisterTile:
    rows: int            # outputs per work-item along the row axis
    cols: int            # outputs per work-item along the contiguous axis
    vector_width: int    # elements per vector load / FMA / store along the contiguous axis
    k_unroll: int        # reduction steps unrolled in the inner loop (pragma hint)
    registers: int       # estimated 32-bit registers per work-item (accumulators + operands + addressing)
    row_axis: str
    col_axis: str

    def describe(self) -> str:
        vec = f", vector width {self.vector_width}" if self.vector_width > 1 else ""
        return f"{self.rows} {self.row_axis} x {self.cols} {self.col_axis}{vec}"


@dataclass(frozen=True)
class WorkGroupTile:
    x: int               # work-items along the contiguous axis
    y: int               # work-items along the row axis
    local_staging: bool  # reduction operands staged through __local memory
    stage_depth: int     # reduction elements staged per barrier round (0 without staging)
    local_bytes: int     # __local bytes per work-group
    block_rows: int      # outputs per work-group along the row axis
    block_cols: int      # outputs per work-group along the contiguous axis

    @property
    def size(self) -> int:
        return self.x * self.y


@dataclass(frozen=True)
class Grid:
    global_size: tuple[int, int, int]
    local_size: tuple[int, int, int]

    @property
    def work_groups(self) -> int:
        g, l = self.global_size, self.local_size
        return (g[0] // l[0]) * (g[1] // l[1]) * (g[2] // l[2])


@dataclass(frozen=True)
class Occupancy:
    registers: int               # estimated per work-item
    register_budget: int         # registers per work-item that keep full occupancy
    waves_resident: int          # waves (warps) resident per compute unit
    max_waves: int
    limiter: str                 # what limited residency
    work_groups_per_cu: int


@dataclass(frozen=True)
class CostEstimate:
    seconds: float
    bound: str                              # name of the largest term
    terms: tuple[tuple[str, float], ...]    # (term, seconds), all cost-model predictions
    gflops: float

    def term(self, name: str) -> float:
        return dict(self.terms)[name]


@dataclass(frozen=True)
class GpuKernelPlan:
    """Everything the OpenCL template and the harness need; templates never decide anything."""

    spec: OperatorSpec
    hardware_name: str
    gpu_name: str
    family: str                      # 'mali' | 'adreno'
    dtype: str                       # requested dtype: 'fp32' | 'fp16'
    variant: str                     # key of VARIANTS this plan renders
    lowering: str                    # 'gemm' | 'implicit_gemm' | 'direct_depthwise'
    template: str                    # templates/opencl/<template>
    kernel_name: str
    register_tile: RegisterTile
    work_group: WorkGroupTile
    grid: Grid
    constants: tuple[tuple[str, int], ...]   # #define NAME value, in order
    flags: tuple[tuple[str, bool], ...]      # code-shape switches the plan decided (ragged edges, padding)
    occupancy: Occupancy
    cost: CostEstimate
    limits: tuple[tuple[str, object], ...]   # hardware limits checked (for explain)
    decisions: tuple[str, ...]               # which constraint decided each level
    header_lines: tuple[str, ...]
    version: str
    extra: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    guarded_vector_store: bool = False       # matmul: a stored vector may cross N or start off its nominal
                                             # column (partial vectors; staged with clamped columns): stores
                                             # are checked and fall back to lanes

    # ---- derived values --------------------------------------------------------------------

    @property
    def storage_type(self) -> str:
        return VARIANTS[self.variant][0]

    @property
    def compute_type(self) -> str:
        return VARIANTS[self.variant][1]

    @property
    def element_bytes(self) -> int:
        return 2 if self.storage_type == "half" else 4

    def constant(self, name: str) -> int:
        return dict(self.constants)[name]

    def flag(self, name: str) -> bool:
        return dict(self.flags)[name]

    def with_variant(self, variant: str) -> "GpuKernelPlan":
        """The same tiles rendered for another storage/compute type (e.g. fp16 storage, fp32 math)."""
        if variant not in VARIANTS:
            raise ValueError(variant)
        lines = tuple(l.replace(f"variant {self.variant}", f"variant {variant}") for l in self.header_lines)
        return replace(self, variant=variant, header_lines=lines)

    def tiles(self) -> dict:
        rt, wg = self.register_tile, self.work_group
        return {
            "register_tile": {"rows": rt.rows, "cols": rt.cols, "vector_width": rt.vector_width,
                              "k_unroll": rt.k_unroll, "registers": rt.registers,
                              "row_axis": rt.row_axis, "col_axis": rt.col_axis},
            "work_group": {"x": wg.x, "y": wg.y, "size": wg.size, "local_staging": wg.local_staging,
                           "stage_depth": wg.stage_depth, "local_bytes": wg.local_bytes,
                           "block_rows": wg.block_rows, "block_cols": wg.block_cols},
            "grid": {"global_size": list(self.grid.global_size), "local_size": list(self.grid.local_size),
                     "work_groups": self.grid.work_groups},
        }

    def tile_summary(self) -> str:
        wg = self.work_group
        staging = f", local staging depth {wg.stage_depth} ({wg.local_bytes} B)" if wg.local_staging else ", no local staging"
        return (f"REG {self.register_tile.describe()} | WG {wg.x}x{wg.y}{staging} | "
                f"GRID {'x'.join(map(str, self.grid.global_size))} / {'x'.join(map(str, self.grid.local_size))}")

    def buffer_elements(self) -> tuple[int, int, int, int]:
        import numpy as np
        shapes = (*self.spec.operand_shapes, self.spec.output_shape)
        return tuple(int(np.prod(s, dtype=np.int64)) for s in shapes)

    def launch_line(self) -> str:
        """Machine-readable line the C harness parses from the kernel file (shape-free harness)."""
        a, b, bias, out = self.buffer_elements()
        g, l = self.grid.global_size, self.grid.local_size
        return (f"// xfc-launch: kernel={self.kernel_name} global={g[0]},{g[1]},{g[2]} "
                f"local={l[0]},{l[1]},{l[2]} a={a} b={b} bias={bias} out={out} storage={self.storage_type}")

    # ---- explanation ------------------------------------------------------------------------

    def explain(self) -> str:
        rt, wg, occ, cost = self.register_tile, self.work_group, self.occupancy, self.cost
        lim = dict(self.limits)
        lines = [
            f"xfc GPU plan: {self.spec.describe()}",
            f"hardware: {self.hardware_name} ({self.gpu_name}, {self.family}); dtype {self.dtype}, "
            f"kernel variant {self.variant} (storage {self.storage_type}, arithmetic {self.compute_type}); "
            f"lowering {self.lowering}",
            "",
            f"REG  register tile {rt.describe()} per work-item, k-unroll {rt.k_unroll}",
            f"     registers ~{occ.registers} of the {occ.register_budget}-register full-occupancy budget; "
            f"{occ.waves_resident} of {occ.max_waves} waves resident per compute unit (limited by {occ.limiter})",
        ]
        if wg.local_staging:
            lines.append(
                f"WG   {wg.x}x{wg.y} = {wg.size} work-items -> block {wg.block_rows} {rt.row_axis} x "
                f"{wg.block_cols} {rt.col_axis}; __local staging {wg.stage_depth} reduction elements per round: "
                f"{wg.local_bytes} B of {lim['local_memory_bytes']} B local memory "
                f"({'on chip' if lim['local_memory_on_chip'] else 'NOT on chip'})")
        else:
            lines.append(
                f"WG   {wg.x}x{wg.y} = {wg.size} work-items -> block {wg.block_rows} {rt.row_axis} x "
                f"{wg.block_cols} {rt.col_axis}; no __local staging (0 B of {lim['local_memory_bytes']} B local memory, "
                f"{'on chip' if lim['local_memory_on_chip'] else 'not on chip'}); operands reuse comes from the "
                f"{lim['l1_kib_per_cu']} KiB L1 per compute unit")
        lines.append(
            f"     work-group size {wg.size} vs max {lim['max_work_group_size']} (request cap "
            f"{lim['work_group_cap']}), preferred {lim['preferred_work_group_size']}; "
            f"{occ.work_groups_per_cu} work-group(s) resident per compute unit")
        g, l = self.grid.global_size, self.grid.local_size
        lines.append(f"GRID global {g[0]}x{g[1]}x{g[2]}, local {l[0]}x{l[1]}x{l[2]} = "
                     f"{self.grid.work_groups} work-groups over {lim['compute_units']} compute units")
        edge = [k for k, v in self.flags if v and k != "weights_per_row"]
        lines.append(f"     edge handling: {', '.join(edge) if edge else 'none needed (sizes divide the tiles)'}")
        lines.append("")
        lines.append("decisions:")
        lines.extend(f"  - {d}" for d in self.decisions)
        lines.append("")
        lines.append(f"predicted ({PREDICTION_LABEL}): {cost.seconds * 1e6:.1f} us, "
                     f"{cost.gflops:.1f} GFLOP/s, bound by {cost.bound}")
        lines.append("  terms: " + ", ".join(f"{n} {s * 1e6:.1f} us" for n, s in cost.terms))
        for key, value in self.extra:
            lines.append(f"note: {key}: {value}")
        return "\n".join(lines)
