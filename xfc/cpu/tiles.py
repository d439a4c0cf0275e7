"""Register micro-tiles: the unit the cost model scores and the tile database measures.

  MicroTile             MR rows x NR_VECTORS vectors of accumulators, and how A reaches the FMAs
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


def a_load_widths(isa: str, mr: int, a_load_bits: int, in_place: bool = False) -> tuple[int, ...]:
    """How the MR values of A at one k step are loaded: one element per entry (a broadcast per row:
    the x86 and generic dialects, and A read in place, whose rows are not adjacent), or, for NEON's
    lane-indexed FMAs on packed A, q-register vectors (4 fp32 / 8 fp16 values), then d-register
    halves, then single values (64-bit loads start at the d-register width). The one rule: the
    register budget (MicroTile.a_registers) counts these loads and the code generator spells them."""
    row = isa_row(isa)
    if not row.lane_indexed or in_place:
        return (1,) * mr
    q_lanes = 128 // row.elem_bits
    widths, left = [], mr
    for width in ((q_lanes, q_lanes // 2, 1) if a_load_bits >= 128 else (q_lanes // 2, 1)):
        while left >= width:
            widths.append(width)
            left -= width
    return tuple(widths)


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
        """Registers A's values occupy at one k step: one per load of a_load_widths (NEON: a q, a d or
        a single value each; MR = 3 or 7 needs a d and a single load beside the q ones), else one
        broadcast register reused row by row."""
        if isa_row(isa).lane_indexed:
            return len(a_load_widths(isa, self.mr, self.a_load_bits))
        return 1

    def registers(self, isa: str) -> int:
        return self.accumulator_registers + self.nr_vectors + self.a_registers(isa)

    def loads_per_k(self, isa: str) -> tuple[int, int]:
        """(128-bit-or-wider vector loads, narrow 64-bit loads) per k step."""
        if isa_row(isa).lane_indexed:
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
    for tile in enumerate_micro_tiles(core, isa):
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
