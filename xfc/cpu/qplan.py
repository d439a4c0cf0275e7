"""The int8 plan type (QPlan): what xfc.cpu.qplans (x86 hosts) and xfc.cpu.qarm (AArch64) produce
and xfc.cpu.qcodegen renders. A module of its own so that both planners import it without
importing each other."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..ops.quant import QuantParams
from ..ops.spec import OperatorSpec


@dataclass(frozen=True)
class QPlan:
    spec: OperatorSpec
    quant: QuantParams                 # out_scale resolved
    qisa: str                          # one of QISAS
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

    @property
    def nr(self) -> int:
        return self.nv * self.lanes

    def summary(self) -> dict:
        out = {"dialect": self.qisa, "lowering": self.lowering, "mr": self.mr, "nr": self.nr,
               "tile_rows": self.tile_rows, "threads": self.threads}
        if self.target_arch == "aarch64" and self.lowering != "direct_depthwise":
            out.update(k_depth=self.k_depth, registers_used=self.registers[0], registers_available=self.registers[1],
                       predicted_ops_per_cycle=round(self.ops_per_cycle, 2), split_loads=self.split_loads)
        return out
