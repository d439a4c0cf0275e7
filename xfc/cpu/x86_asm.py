"""x86 AVX2 / AVX-512 GEMM micro-kernel K loops as GCC extended inline assembly, registers from the plan.

GCC allocates the intrinsics micro-kernel's registers itself. On the 16-register AVX2 file it
spills accumulators of tiles that fill the file (4x24: 12 accumulators + 3 B + 1 A) and reloads B
from memory inside the FMAs: seen in the assembly of the 6x16 and 4x24 loops, four accumulators
kept on the stack and each B vector loaded four times per k step. The loads then bound the loop,
not the FMAs (a Zen 3 host, 1 thread: 1x1 convolutions at 52% of the FMA peak where the plan
predicted 90%; benchmarks/x86_asm.py times both loops on the same plans). Hand-written
libraries (BLIS, OpenBLAS, XNNPACK's x86 assembly) write the K loop in assembly; this module does
the same for the full MR x NR tile of a plan whose `ukernel` is 'asm_out_of_order'
(decide.gemm_ukernel chooses it from the core; every x86 core xfc describes reorders):

  register map   accumulators first, then the NR/LANES B vectors, then the A broadcast register(s)
                 (one, or two alternating where the file has a register left): exactly
                 MicroTile.registers() registers (plus the spare), the stack untouched
  loads          per k step: the B vectors (vmovups from the packed panel), then per row one
                 vbroadcastss of A and its NR/LANES FMAs. A is packed ([k][MR], a_pack 'packed'),
                 read in place (row r at r x lda floats, 'direct') or read from the staged image at
                 koff[k] ('im2col_direct', scaled-index addressing); unrolled k steps use
                 displacements and bump the pointers once per iteration
  accumulators   stored once after the loop into a local tile (vmovups), which the template reads
                 back for the C accumulate / bias / activation / store epilogue

`render_x86_kloop` returns the lines (AT&T syntax, registers spelled %%ymmN / %%zmmN as inside
an extended asm string) and the clobbers; templates/cpu/gemm_neon_asm.j2's asm_kloop spells them.
"""
from __future__ import annotations

DIALECTS = ("avx2", "avx512")
# Where synthesis chooses the loop (decide.gemm_ukernel). AVX-512 is spelled and compiled by the
# tests everywhere and run where the CPU has it, but chosen only once it is measured faster than
# the intrinsics on an AVX-512 core: the machine this was measured on has AVX2 only.
CHOSEN_DIALECTS = ("avx2",)
VECTOR_REGISTERS = {"avx2": 16, "avx512": 32}
_REGISTER = {"avx2": "ymm", "avx512": "zmm"}
_VECTOR_BYTES = {"avx2": 32, "avx512": 64}
# AVX2 has no zeroing idiom for the upper 16 registers (there are none); AVX-512's vpxord covers all 32
_ZERO = {"avx2": "vxorps", "avx512": "vpxord"}
ELEM_BYTES = 4           # fp32 only: the x86 dialects have no fp16 row
MAX_A_REGISTERS = 2      # broadcast registers alternated row by row where the file has room


def register_count(rows: int, nvec: int) -> int:
    """Registers the loop needs at least: accumulators, B vectors and one broadcast register."""
    return rows * nvec + nvec + 1


def register_map(isa: str, rows: int, nvec: int) -> dict:
    """{acc: [[reg]], b: [reg], a: [reg]} register numbers; ValueError past the register file."""
    if isa not in DIALECTS:
        raise ValueError(f"no x86 assembly for isa '{isa}' (one of {', '.join(DIALECTS)})")
    total = VECTOR_REGISTERS[isa]
    need = register_count(rows, nvec)
    if need > total:
        raise ValueError(f"{rows}x{nvec}-vector tile needs {need} vector registers (> {total} on {isa})")
    acc = [[i * nvec + j for j in range(nvec)] for i in range(rows)]
    b0 = rows * nvec
    b = list(range(b0, b0 + nvec))
    spare = total - need
    a = list(range(b0 + nvec, b0 + nvec + 1 + min(spare, MAX_A_REGISTERS - 1)))
    return {"acc": acc, "b": b, "a": a}


def _reg(isa: str, n: int) -> str:
    return f"%%{_REGISTER[isa]}{n}"


def _a_address(a_pack: str, step: int, offset_floats: int, a_kstep_floats: int) -> str:
    """Where row `offset_floats` of A sits at k step `step` of the unrolled body."""
    if a_pack == "im2col_direct":   # %[t] holds koff[k] (floats) of this step
        return f"{ELEM_BYTES * offset_floats}(%[ap],%[t],{ELEM_BYTES})"
    return f"{ELEM_BYTES * (step * a_kstep_floats + offset_floats)}(%[ap])"


def k_step(isa: str, regs: dict, a_groups: list[dict], a_pack: str, a_kstep_floats: int, nr: int,
           step: int) -> list[str]:
    """The instructions of k step `step` of an unrolled body (offsets relative to the pointers at
    the body's start)."""
    vb = _VECTOR_BYTES[isa]
    lines = []
    if a_pack == "im2col_direct":
        lines.append(f"movq {8 * step}(%[koff]), %[t]")
    for j, b in enumerate(regs["b"]):
        lines.append(f"vmovups {ELEM_BYTES * step * nr + vb * j}(%[bp]), {_reg(isa, b)}")
    for gi, g in enumerate(a_groups):
        a = regs["a"][gi % len(regs["a"])]
        lines.append(f"vbroadcastss {_a_address(a_pack, step, g['offset'], a_kstep_floats)}, {_reg(isa, a)}")
        for row in g["rows"]:
            for j, b in enumerate(regs["b"]):
                lines.append(f"vfmadd231ps {_reg(isa, b)}, {_reg(isa, a)}, {_reg(isa, regs['acc'][row['row']][j])}")
    return lines


def _advance(a_pack: str, steps: int, a_kstep_floats: int, nr: int) -> list[str]:
    lines = [f"addq ${ELEM_BYTES * steps * nr}, %[bp]"]
    if a_pack == "im2col_direct":
        lines.append(f"addq ${8 * steps}, %[koff]")
    else:
        lines.append(f"addq ${ELEM_BYTES * steps * a_kstep_floats}, %[ap]")
    return lines


def render_x86_kloop(isa: str, rows: int, nvec: int, a_groups: list[dict], a_pack: str, a_kstep_floats: int,
                     nr: int, k_unroll: int) -> dict:
    """The K loop of the full tile as assembly lines plus the registers it clobbers.

    a_groups: tiles.a_load_groups for a broadcast dialect (one group per row; offset = row x the
    row stride in floats); a_kstep_floats: floats between consecutive k values of one A row (MR
    when packed, 1 when read in place; unused for im2col_direct). Operands the template binds:
    %[ap] %[bp] %[koff] (pointers, advanced), %[main] (k_unroll-step iterations) and %[rest]
    (single steps), %[t] (scratch: koff[k]), %[acc] (the local tile written at the end).
    """
    if any(g["width"] != 1 or len(g["rows"]) != 1 for g in a_groups):
        raise ValueError("x86 assembly broadcasts one A value per row (groups of width 1)")
    if a_pack not in ("packed", "direct", "im2col_direct"):
        raise ValueError(f"a_pack '{a_pack}' is not packed, direct or im2col_direct")
    regs = register_map(isa, rows, nvec)
    zero = _ZERO[isa]
    lines = [f"{zero} {_reg(isa, r)}, {_reg(isa, r)}, {_reg(isa, r)}" for row in regs["acc"] for r in row]
    lines += ["testq %[main], %[main]", "jz 2f", "1:"]
    for u in range(k_unroll):
        lines += k_step(isa, regs, a_groups, a_pack, a_kstep_floats, nr, u)
    lines += _advance(a_pack, k_unroll, a_kstep_floats, nr)
    lines += ["decq %[main]", "jnz 1b", "2:", "testq %[rest], %[rest]", "jz 4f", "3:"]
    lines += k_step(isa, regs, a_groups, a_pack, a_kstep_floats, nr, 0)
    lines += _advance(a_pack, 1, a_kstep_floats, nr)
    lines += ["decq %[rest]", "jnz 3b", "4:"]
    vb = _VECTOR_BYTES[isa]
    acc = [r for row in regs["acc"] for r in row]   # row-major, as the tile is read back
    lines += [f"vmovups {_reg(isa, r)}, {vb * i}(%[acc])" for i, r in enumerate(acc)]
    used = sorted(acc + regs["b"] + regs["a"])
    return {"lines": lines, "clobbers": [f"xmm{r}" for r in used], "registers": len(used), "koff_ahead": False,
            "layout": "accumulators first, then B, then the A broadcast register(s)", "align": vb}
