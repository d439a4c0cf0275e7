"""Register micro-tiles: the unit the cost model scores and the tile database measures.

  MicroTile             MR rows x NR_VECTORS vectors of accumulators, and how A reaches the FMAs
  a_load_groups         how the MR values of A at one k step are loaded: what a tile's A registers
                        are budgeted from and what code generation spells (one function for both)
  MicroTileScore        cycles per k step and the share of FMA peak it sustains
  MicroTileEvaluator    the interface a scorer implements: cost_model.StaticEvaluator (the static
                        issue model) or a measured tile database (xfc.tiledb.TileDbEvaluator)
  enumerate_micro_tiles every tile whose accumulators and operands fit the core's SIMD registers
  rank_micro_tiles      tiles by useful throughput on a problem (ragged-edge waste included)
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Protocol

from ..hardware.model import CpuCore
from .isa import isa_row

FLOAT_BYTES = 4
MAX_MR = 16
MAX_NR_VECTORS = 4
RANK_BUCKET = 0.02               # relative score/time differences the model cannot resolve
# A row tail (M % MR rows) has its own micro-kernel, but few accumulators cannot hide the FMA
# latency: it is charged at least this share of a full tile's rows.
ROW_TAIL_MIN_SHARE = 0.5


def round_down(x: int, multiple: int) -> int:
    """The largest multiple of `multiple` <= x, but at least `multiple`."""
    return max(multiple, (x // multiple) * multiple)


def round_up(x: int, multiple: int) -> int:
    return math.ceil(x / multiple) * multiple


def a_load_groups(isa: str, mr: int, a_load_bits: int, row_stride: int = 1) -> list[dict]:
    """How the MR values of A at one k step are loaded and fed to the FMAs: a list of groups
    {width, offset, rows: [{row, lane}]}, one A register and one load each.

    x86/generic, or A read in place (row_stride > 1: rows are not adjacent): one broadcast per
    row at offset row * row_stride. NEON with packed A, consumed lane by lane (vfmaq_laneq /
    vfmaq_lane, FMLA by element); a_load_bits=64 starts at the d-register width:

      pieces  (fp32 row `neon`): q-register vectors of 4, then d-register halves of 2, then 1 for the
              remainder, tiling MR exactly (MR=7: 4 + 2 + 1, three registers);
      overlap (fp16 row `neon_fp16`, IsaRow.a_load_overlap): ceil(MR / w) loads of the widest width
              w <= MR (8 with q loads, 4 with d loads, else 1), the last one ending at row MR - 1
              and so overlapping the one before; a row is fed from the first load that holds it.
              MR=14: q loads at rows 0 and 6 (lanes 2-7 of the second feed rows 8-13), two
              registers where pieces would take four (8 + 4 + 1 + 1). No lane past MR is read, so
              A read from the staged image (im2col_direct) stays inside its rows.

    The one A-load rule: MicroTile.a_registers counts these groups (fp32 and fp16 alike) and code
    generation (cpu/codegen.py, neon_asm.py) spells them, so the register budget is what is rendered.
    """
    row = isa_row(isa)
    if not row.lane_indexed or row_stride != 1:
        return [{"width": 1, "offset": i * row_stride, "rows": [{"row": i, "lane": 0}]} for i in range(mr)]
    q_lanes = 128 // row.elem_bits
    widths = (q_lanes, q_lanes // 2, 1) if a_load_bits >= 128 else (q_lanes // 2, 1)
    groups = []
    if row.a_load_overlap:
        width = next(w for w in widths if w <= mr)
        loads = math.ceil(mr / width)
        offsets = [min(i * width, mr - width) for i in range(loads)]
        for i, offset in enumerate(offsets):
            first = i * width                       # rows 0..i*width-1 are fed by the loads before
            groups.append({"width": width, "offset": offset,
                           "rows": [{"row": r, "lane": r - offset} for r in range(first, min(first + width, mr))]})
        return groups
    done = 0
    for width in widths:
        while mr - done >= width:
            groups.append({"width": width, "offset": done,
                           "rows": [{"row": done + lane, "lane": lane} for lane in range(width)]})
            done += width
    return groups


@dataclass(frozen=True)
class MicroTile:
    mr: int
    nr_vectors: int
    lanes: int
    a_load_bits: int        # lane-indexed (NEON): 64 or 128-bit loads of A feeding the FMAs; broadcast: 32
    elem_bytes: int = FLOAT_BYTES   # bytes per element (2 for fp16): cache footprints and A values per load

    @property
    def nr(self) -> int:
        return self.nr_vectors * self.lanes

    @property
    def accumulator_registers(self) -> int:
        return self.mr * self.nr_vectors

    def a_registers(self, isa: str) -> int:
        """Registers A's values occupy at one k step: one per load of a_load_groups, the loads code
        generation spells (NEON: fp32 pieces, MR = 3 or 7 needing a d and a single load beside the q
        ones; fp16 overlapping loads of one width), else one broadcast register reused row by row."""
        if isa_row(isa).lane_indexed:
            return len(a_load_groups(isa, self.mr, self.a_load_bits))
        return 1

    def registers(self, isa: str) -> int:
        return self.accumulator_registers + self.nr_vectors + self.a_registers(isa)

    def loads_per_k(self, isa: str) -> tuple[int, int]:
        """(128-bit-or-wider vector loads, narrow 64-bit loads) per k step."""
        row = isa_row(isa)
        if row.lane_indexed and row.a_load_overlap:   # the loads code generation spells
            bits = [g["width"] * row.elem_bits for g in a_load_groups(isa, self.mr, self.a_load_bits)]
            return (self.nr_vectors + sum(b >= 128 for b in bits), sum(b < 128 for b in bits))
        if row.lane_indexed:
            a_loads = math.ceil(self.mr / (self.a_load_bits // (8 * self.elem_bytes)))
            return (self.nr_vectors + (a_loads if self.a_load_bits == 128 else 0),
                    a_loads if self.a_load_bits == 64 else 0)
        return self.nr_vectors + self.mr, 0  # broadcasts from memory are load micro-ops


@dataclass(frozen=True)
class MicroTileScore:
    cycles_per_k: float      # predicted cycles per k step of the micro-kernel
    efficiency: float        # fraction of FMA peak the micro-kernel sustains
    bound: str               # 'fma', 'load', 'latency', 'in-order load stalls'
    source: str              # 'static' or e.g. 'tile_db:<file>'


class MicroTileEvaluator(Protocol):
    """What scores micro-tiles for the synthesizer (synthesize_cpu(evaluator=...))."""

    def evaluate(self, tile: MicroTile, core: CpuCore, isa: str) -> MicroTileScore: ...


def enumerate_micro_tiles(core: CpuCore, isa: str) -> list[MicroTile]:
    return list(_micro_tiles(core, isa))


@functools.lru_cache(maxsize=64)
def _micro_tiles(core: CpuCore, isa: str) -> tuple[MicroTile, ...]:
    # a pure function of (core, isa), asked for by every GEMM candidate ranking of a synthesis
    # (a Winograd conv ranks up to seven GEMM problems)
    row = isa_row(isa)
    lanes = row.synthesis_lanes(core)
    tiles = []
    for nr_vectors in range(1, MAX_NR_VECTORS + 1):
        for mr in range(1, MAX_MR + 1):
            for a_bits in row.a_load_bits:
                tile = MicroTile(mr=mr, nr_vectors=nr_vectors, lanes=lanes, a_load_bits=a_bits,
                                 elem_bytes=row.elem_bytes)
                if tile.registers(isa) <= core.vector_registers:
                    tiles.append(tile)
    return tuple(tiles)


def rank_micro_tiles(core: CpuCore, isa: str, evaluator: MicroTileEvaluator,
                     m: int, n: int) -> list[tuple[MicroTile, MicroTileScore, float]]:
    """Micro-tiles by useful throughput on this problem: efficiency x (1 - ragged-edge waste).

    Ties go to more FMAs per k step (more register reuse, less L1 traffic), then to a stable key.
    """
    ranked = []
    tiles = enumerate_micro_tiles(core, isa)
    prepare = getattr(evaluator, "prepare", None)
    if prepare is not None:      # an evaluator that runs tools (llvm-mca) scores the candidates concurrently first
        prepare(tiles, core, isa)
    for tile in tiles:
        score = evaluator.evaluate(tile, core, isa)
        # Tails have their own kernels: the row tail costs at least ROW_TAIL_MIN_SHARE of a full
        # tile; columns are padded to whole vectors only.
        m_cost = (m // tile.mr) * tile.mr + (max(m % tile.mr, tile.mr * ROW_TAIL_MIN_SHARE) if m % tile.mr else 0)
        n_cost = (n // tile.nr) * tile.nr + round_up(n % tile.nr, tile.lanes)
        useful = (m * n) / (m_cost * n_cost)
        ranked.append((tile, score, score.efficiency * useful))
    # Differences under RANK_BUCKET are within the model's accuracy: there, more FMAs per k
    # step (more register reuse, fewer loads per FLOP) and wider tiles win.
    ranked.sort(key=lambda t: (-round(t[2] / RANK_BUCKET), -t[0].accumulator_registers,
                               -t[0].nr_vectors, t[0].mr, -t[0].a_load_bits))
    return ranked
