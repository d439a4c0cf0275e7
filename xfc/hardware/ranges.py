"""Plausible ranges for every numeric field of a hardware description.

One table, PLAUSIBLE: field key -> Plausible(low, high, unit, why). The key is the kind and the
field path, with `[]` for list items ("soc.clusters[].max_clock_ghz"). xfc/hardware/schema.py builds its
numeric checkers from this table, and hardware_descriptions/SCHEMA.md carries the same table as
text (`python -c 'import xfc.hardware.ranges as r; r.write_schema_md()'` regenerates it; a unit test
keeps the two in sync).

The bounds are real hardware with a wide margin (the shipped descriptions and their sources,
plus public figures for wider parts). They exist to catch typos and unit slips (MHz written as GHz, bytes as KiB,
a dropped decimal point), not to rule on which hardware is possible.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Union

from ..paths import HARDWARE_DIR

Number = Union[int, float]


def _num(x: Number) -> str:
    """A bound as written in messages and SCHEMA.md: 1048576, 0.25, 7 (never 1.04858e+06)."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


@dataclass(frozen=True)
class Plausible:
    low: Number
    high: Number
    unit: str
    why: str                    # the real figures the bounds are drawn from
    integer: bool = True        # False: any finite number (ints and floats)
    power_of_two: bool = False

    def accepts(self) -> str:
        """What the field accepts, for error messages: 'an integer from 8 to 64 registers (...)'."""
        kind = "a power of two" if self.power_of_two else ("an integer" if self.integer else "a number")
        unit = f" {self.unit}" if self.unit else ""
        return f"{kind} from {_num(self.low)} to {_num(self.high)}{unit} ({self.why})"

    def contains(self, value: Number) -> bool:
        """value is already known to be an int or float of the right kind; NaN and inf fail here."""
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if not self.low <= value <= self.high:   # exact for ints of any size, no float overflow
            return False
        return not self.power_of_two or (value & (value - 1)) == 0


_INT_P2 = {"power_of_two": True}
_NUM = {"integer": False}

PLAUSIBLE: dict[str, Plausible] = {
    # ---- cpu_core -------------------------------------------------------------------------
    "cpu_core.decode_width": Plausible(
        1, 16, "instructions per cycle", "Cortex-A53/A55 decode 2, Cortex-X3 6, the widest shipped cores 8-10"),
    "cpu_core.vector_bits": Plausible(
        128, 512, "bits", "NEON 128, AVX2 256, AVX-512 512: the widths the code generators emit", **_INT_P2),
    "cpu_core.vector_registers": Plausible(
        8, 64, "registers", "AArch64 and AVX-512 have 32, AVX2 16; fewer than 8 hold no micro-kernel"),
    "cpu_core.fma_per_cycle": Plausible(
        0.25, 8, "vector FMA per cycle", "A53/A55/A510 1, A76-A715 2, X1-X3 4", **_NUM),
    "cpu_core.fp16_fma_per_cycle": Plausible(
        0.25, 8, "vector fp16 FMA per cycle", "FMLA .8h: A55 1, A75-A715 2, X1-X3 4 (as FMLA .4s)", **_NUM),
    "cpu_core.sdot_per_cycle": Plausible(
        0.25, 8, "128-bit SDOT per cycle", "Cortex-A55 1 (Q form), A76-A715 2, X1-X3 4 (Arm optimization guides)", **_NUM),
    "cpu_core.smmla_per_cycle": Plausible(
        0.25, 8, "128-bit SMMLA per cycle", "Cortex-A510 1, A710/A715 2, X2/X3 4 (Arm optimization guides)", **_NUM),
    "cpu_core.fma_latency_cycles": Plausible(
        1, 16, "cycles", "4 on Cortex-A55/A76-class and x86 cores, up to about 8 on in-order cores"),
    "cpu_core.load_rules.vector_loads_per_cycle": Plausible(
        0.25, 8, "loads per cycle", "in-order cores 1, A76/A77 2, A78 and X1-X3 3", **_NUM),
    "cpu_core.load_rules.ld128_blocking_cycles": Plausible(
        0, 8, "cycles", "0 on out-of-order cores, 2 on A53/A55/A510"),
    "cpu_core.l1d.size_kib": Plausible(
        4, 256, "KiB", "Cortex-A 16-64 KiB, x86 32-48 KiB, Apple 128 KiB", **_NUM),
    "cpu_core.l1d.line_bytes": Plausible(16, 256, "bytes", "64 on Arm and x86, 128 on Apple", **_INT_P2),
    "cpu_core.l1d.ways": Plausible(1, 32, "ways", "4 on most Cortex-A, 16 on A75, 8-12 on x86"),
    "cpu_core.l2.size_kib": Plausible(
        16, 32768, "KiB", "private 64 KiB-2 MiB per core; cluster-shared up to 16 MiB", **_NUM),
    "cpu_core.l2.line_bytes": Plausible(16, 256, "bytes", "64 on Arm and x86, 128 on Apple", **_INT_P2),
    "cpu_core.l2.ways": Plausible(1, 32, "ways", "4-16 on Cortex-A, up to 20 on x86"),
    "cpu_core.l2.shared_by_cores": Plausible(
        1, 16, "cores", "1 when private, 2 in an A510 complex, 4 in an A53 cluster"),
    "cpu_core.typical_max_clock_ghz": Plausible(
        0.2, 7, "GHz", "phone cores 1.4-3.4 GHz, x86 desktop parts up to 6.2 GHz", **_NUM),
    # ---- gpu ------------------------------------------------------------------------------
    "gpu.compute_units": Plausible(1, 64, "compute units", "Adreno 2-6 SPs, Mali MP1-MP24"),
    "gpu.max_clock_mhz": Plausible(100, 2000, "MHz", "mobile GPUs run 300-1000 MHz", **_NUM),
    "gpu.warp_width": Plausible(4, 256, "threads", "Mali Bifrost 4/8, Valhall 16, Adreno 64/128", **_INT_P2),
    "gpu.half_warp_width": Plausible(2, 128, "threads", "the Adreno half wave: 32 or 64", **_INT_P2),
    "gpu.fp32_flop_per_clock_per_cu": Plausible(
        8, 4096, "FLOP per clock per CU", "Mali-G76 48, Mali-G710 128, Adreno 6xx/7xx 512-768 per SP", **_NUM),
    "gpu.fp16_flop_per_clock_per_cu": Plausible(
        8, 8192, "FLOP per clock per CU", "1x-2x the FP32 rate: Mali-G710 256, Adreno 740 1536", **_NUM),
    "gpu.registers_per_thread_full_occupancy": Plausible(
        8, 256, "32-bit registers", "Mali 32, Adreno 16-24 (derived from TFLite's register memory)"),
    "gpu.register_file_bytes_per_cu": Plausible(
        16384, 1048576, "bytes", "Adreno 128-288 KiB per SP (TFLite constants)"),
    "gpu.max_waves_per_cu": Plausible(1, 256, "waves", "Adreno 16-30, Mali 32-64"),
    "gpu.local_memory.size_kib": Plausible(
        1, 256, "KiB", "32 KiB on Mali and Adreno; OpenCL full profile requires at least 32", **_NUM),
    "gpu.max_work_group_size": Plausible(16, 4096, "work-items", "Mali 384-1024, Adreno 1024"),
    "gpu.preferred_work_group_size": Plausible(
        4, 4096, "work-items", "Mali 64, Adreno 128; never below the smallest warp (4)"),
    "gpu.l1_kib_per_cu": Plausible(
        0.5, 256, "KiB", "Adreno 1 KiB texture L1 per uSPTP, Mali 16 KiB per core", **_NUM),
    "gpu.l2_kib": Plausible(16, 16384, "KiB", "Adreno 128-256 KiB, Mali 512 KiB-2 MiB", **_NUM),
    "gpu.coalescing_threads": Plausible(
        1, 256, "threads", "Mali Bifrost 4/8, Valhall 16, Adreno 16 (64-byte line / 4 bytes)", **_INT_P2),
    # ---- soc ------------------------------------------------------------------------------
    "soc.clusters[].count": Plausible(1, 16, "cores", "1-4 per cluster in phones, up to 6 in laptop SoCs"),
    "soc.clusters[].max_clock_ghz": Plausible(
        0.2, 5, "GHz", "phone clusters 1.4-3.4 GHz, laptop Arm SoCs up to 4.3 GHz", **_NUM),
    "soc.clusters[].cpu_ids[]": Plausible(
        0, 31, "", "Linux CPU numbers; phones have 8 CPUs (a few 10) numbered from 0"),
    "soc.clusters[].l2_kib": Plausible(
        16, 32768, "KiB", "private 64 KiB-2 MiB per core; cluster-shared up to 16 MiB", **_NUM),
    "soc.l3_kib": Plausible(128, 65536, "KiB", "DynamIQ L3 1-16 MiB (2-8 MiB in the shipped SoCs)", **_NUM),
    "soc.slc_kib": Plausible(128, 131072, "KiB", "phones 2-8 MiB, laptop SoCs up to 96 MiB", **_NUM),
    "soc.gpu.compute_units": Plausible(1, 64, "compute units", "Adreno 2-6 SPs, Mali MP1-MP24"),
    "soc.gpu.clock_mhz": Plausible(100, 2000, "MHz", "mobile GPUs run 300-1000 MHz", **_NUM),
    "soc.memory.peak_bandwidth_gbps": Plausible(
        1, 1000, "GB/s", "LPDDR4X-4266 x64 34 GB/s, LPDDR5X-8400 67 GB/s, up to 800 GB/s in desktop-class Arm SoCs",
        **_NUM),
    "soc.memory.channels": Plausible(
        1, 64, "channels", "4 x16 channels in the shipped phones, 32 in 512-bit laptop parts"),
}


# ---------------------------------------------------------------------------------------------
# SCHEMA.md carries this table between two markers.
# ---------------------------------------------------------------------------------------------

SCHEMA_MD = HARDWARE_DIR / "SCHEMA.md"
BEGIN = "<!-- plausible-ranges:begin -->"
END = "<!-- plausible-ranges:end -->"


def ranges_markdown() -> str:
    """The table as Markdown, one row per field, in the order of PLAUSIBLE."""
    rows = ["| kind | field | accepted | unit | real figures |", "|---|---|---|---|---|"]
    for key, r in PLAUSIBLE.items():
        kind, field = key.split(".", 1)
        what = "power of two " if r.power_of_two else ("integer " if r.integer else "")
        rows.append(f"| `{kind}` | `{field}` | {what}{_num(r.low)} .. {_num(r.high)} | {r.unit or '-'} | {r.why} |")
    return "\n".join(rows)


def schema_md_with_table(text: str) -> str:
    """text (SCHEMA.md) with the block between the markers replaced by the current table."""
    start, end = text.index(BEGIN), text.index(END)
    return text[:start] + BEGIN + "\n" + ranges_markdown() + "\n" + text[end:]


def write_schema_md() -> None:
    """Regenerate the table in SCHEMA.md (atomically)."""
    new = schema_md_with_table(SCHEMA_MD.read_text())
    tmp = SCHEMA_MD.with_name(SCHEMA_MD.name + ".tmp")
    tmp.write_text(new)
    os.replace(tmp, SCHEMA_MD)
