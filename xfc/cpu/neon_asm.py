"""AArch64 NEON GEMM micro-kernel K loops as GCC extended inline assembly, registers from the plan.

The intrinsics micro-kernel leaves register allocation and instruction order to GCC, which spills
accumulators of large tiles and turns 64-bit A loads into scalar loads on in-order cores
(../shared/reference/arm-mca.md). Hand-written libraries write the K loop in assembly instead;
this module does the same for the full MR x NR tile of a plan whose `ukernel` is one of
ASM_UKERNELS (decide.gemm_ukernel chooses it from the core), for fp32 (FMLA .4s) and fp16
(FMLA .8h, Elem.of(16)):

  register map   fp32: accumulators v0.., then the B vectors, then one register per A load group
                 (tiles.a_load_groups: q loads of 4 rows, d loads of 2, s loads of 1); fp16: the A
                 groups first (FMLA .8h by element takes its indexed operand from v0-v15 only), then
                 the accumulators, then B. The loop uses exactly MicroTile.registers() vector
                 registers and never touches the stack
  loads          B with post-incremented ldr/ldp q; packed A with a post-incremented first load and
                 negative offsets for the rest of the k step (64-bit `ldr d` when the plan says
                 a_load_bits=64; fp16 q/d loads of 8/4 rows that may overlap, h loads of 1);
                 im2col_direct A from the staged image at koff[k]
  order          'asm_out_of_order': a k step's loads, then its FMAs (the core reorders);
                 'asm_in_order': each A load two groups ahead of the FMAs that use it, so an
                 in-order core does not wait on a load right before its FMA

The loop leaves the accumulators in a local tile (stored once per call, outside the loop); the
template reads them back for the C accumulate / bias / activation epilogue. `render_asm_kloop`
returns the assembly lines; templates/cpu/gemm_neon_asm.j2 spells them inside __asm__.
"""
from __future__ import annotations

from dataclasses import dataclass

ASM_UKERNELS = ("asm_out_of_order", "asm_in_order")
UKERNELS = ("intrinsics",) + ASM_UKERNELS
VECTOR_REGISTERS = 32
A_LOOKAHEAD_GROUPS = 2   # in-order order: A loads this many groups ahead of their FMAs

_KIND = {128: "q", 64: "d", 32: "s", 16: "h"}     # A load group width in bits -> FP register view
_BYTES = {"q": 16, "d": 8, "s": 4, "h": 2}


@dataclass(frozen=True)
class Elem:
    """How an element type is spelled: fp32 (.4s, s[lane]) or fp16 (.8h, h[lane])."""

    bits: int
    arrangement: str        # a full q register of elements: '4s' | '8h'
    lane: str               # one lane: 's' | 'h'

    @property
    def bytes(self) -> int:
        return self.bits // 8

    @property
    def shift(self) -> int:
        """log2 of the element size: element offsets -> byte offsets (lsl)."""
        return self.bytes.bit_length() - 1

    @staticmethod
    def of(bits: int) -> "Elem":
        if bits == 32:
            return FP32
        if bits == 16:
            return FP16
        raise ValueError(f"no NEON assembly for {bits}-bit elements")


FP32 = Elem(bits=32, arrangement="4s", lane="s")
FP16 = Elem(bits=16, arrangement="8h", lane="h")


@dataclass(frozen=True)
class RegisterMap:
    """Vector register numbers of one full tile: acc[row][vector], b[vector], a[group]."""

    acc: tuple[tuple[int, ...], ...]
    b: tuple[int, ...]
    a: tuple[int, ...]

    @property
    def used(self) -> tuple[int, ...]:
        return tuple(sorted([r for row in self.acc for r in row] + list(self.b) + list(self.a)))


def register_count(rows: int, nvec: int, a_groups: list[dict]) -> int:
    return rows * nvec + nvec + len(a_groups)


def register_map(rows: int, nvec: int, a_groups: list[dict], indexed_registers: int = VECTOR_REGISTERS) -> RegisterMap:
    """Accumulators first, then B, then A; A first where the indexed operand of FMLA by element is
    limited to v0..v(indexed_registers - 1) (IsaRow.indexed_registers: 16 for .8h), then the
    accumulators, then B. Raises ValueError past the 32 registers or the indexed range."""
    need = register_count(rows, nvec, a_groups)
    if need > VECTOR_REGISTERS:
        raise ValueError(f"{rows}x{nvec}-vector tile needs {need} vector registers (> {VECTOR_REGISTERS})")
    na = len(a_groups)
    if indexed_registers < VECTOR_REGISTERS:
        if na > indexed_registers:
            raise ValueError(f"{na} A registers do not fit v0-v{indexed_registers - 1} (the indexed operand of "
                             f"FMLA by element)")
        acc = tuple(tuple(na + i * nvec + j for j in range(nvec)) for i in range(rows))
        b0 = na + rows * nvec
        return RegisterMap(acc=acc, b=tuple(range(b0, b0 + nvec)), a=tuple(range(na)))
    acc = tuple(tuple(i * nvec + j for j in range(nvec)) for i in range(rows))
    b0 = rows * nvec
    b = tuple(range(b0, b0 + nvec))
    a = tuple(range(b0 + nvec, b0 + nvec + na))
    return RegisterMap(acc=acc, b=b, a=a)


def _mem(kind: str, reg: int, base: str, offset: int) -> str:
    """A load of `kind` (q/d/s/h) into reg at [base + offset]: ldr with a scaled unsigned offset where
    it encodes, else ldur (signed 9-bit unscaled)."""
    size = _BYTES[kind]
    if offset >= 0 and offset % size == 0 and offset // size < 4096:
        return f"ldr {kind}{reg}, [{base}, #{offset}]" if offset else f"ldr {kind}{reg}, [{base}]"
    if -256 <= offset <= 255:
        return f"ldur {kind}{reg}, [{base}, #{offset}]"
    raise ValueError(f"A offset {offset} does not encode")


def _b_loads(regs: RegisterMap) -> list[str]:
    """B vectors of one k step, post-incrementing the B pointer (pairs where they exist)."""
    out, j = [], 0
    while j < len(regs.b):
        if j + 1 < len(regs.b):
            out.append(f"ldp q{regs.b[j]}, q{regs.b[j + 1]}, [%[bp]], #32")
            j += 2
        else:
            out.append(f"ldr q{regs.b[j]}, [%[bp]], #16")
            j += 1
    return out


def _a_loads(regs: RegisterMap, a_groups: list[dict], a_pack: str, mr: int,
             elem: Elem = FP32) -> tuple[list[str], list[str]]:
    """(address setup, one load per A group) for one k step."""
    kinds = [_KIND[g["width"] * elem.bits] for g in a_groups]
    eb = elem.bytes
    if a_pack == "im2col_direct":
        setup = ["ldr %[t], [%[koff]], #8", f"add %[t], %[ap], %[t], lsl #{elem.shift}"]
        return setup, [_mem(k, regs.a[i], "%[t]", eb * g["offset"]) for i, (k, g) in enumerate(zip(kinds, a_groups))]
    step = eb * mr
    loads = []
    for i, (k, g) in enumerate(zip(kinds, a_groups)):
        if i == 0:   # offset 0: the k step's first load moves the pointer to the next k step
            loads.append(f"ldr {k}{regs.a[0]}, [%[ap]], #{step}")
        else:
            loads.append(_mem(k, regs.a[i], "%[ap]", eb * g["offset"] - step))
    return [], loads


def _fmas(regs: RegisterMap, a_groups: list[dict], gi: int, elem: Elem = FP32) -> list[str]:
    out = []
    for row in a_groups[gi]["rows"]:
        for j, b in enumerate(regs.b):
            out.append(f"fmla v{regs.acc[row['row']][j]}.{elem.arrangement}, v{b}.{elem.arrangement}, "
                       f"v{regs.a[gi]}.{elem.lane}[{row['lane']}]")
    return out


def koff_ahead(a_pack: str, order: str) -> bool:
    """True where the loop reads each k row's offset one k step ahead: the in-order loop over the
    staged image. There `ldr t, [koff]; add t, ap, t, lsl #2; ldr d, [t]` in a row stalls the pipe
    on the load and the add before every k step; instead %[t] holds this step's A address on entry,
    the step loads the next offset into %[t2] among its FMAs and forms the next address after its
    last A load (see k_step). It reads koff[kc], so the caller's koff array has one entry more."""
    return a_pack == "im2col_direct" and order == "asm_in_order"


def k_step(regs: RegisterMap, a_groups: list[dict], a_pack: str, mr: int, order: str,
           elem: Elem = FP32) -> list[str]:
    """The instructions of one k step."""
    setup, a_loads = _a_loads(regs, a_groups, a_pack, mr, elem)
    ahead = koff_ahead(a_pack, order)
    if ahead:
        setup = []
    lines = setup + _b_loads(regs)
    if order == "asm_out_of_order":
        lines += a_loads
        for gi in range(len(a_groups)):
            lines += _fmas(regs, a_groups, gi, elem)
        return lines
    groups = len(a_groups)
    # koff ahead: the next offset load pairs with the FMAs after group 0 (at the step's start it would
    # queue behind B and the first A loads: A55 model 76 -> 72 cycles per 4 steps of 16x4); the next
    # address is formed after the FMAs of a later group that follows this step's last A load.
    add_after = min(max(1, groups - 1 - A_LOOKAHEAD_GROUPS), groups - 1)
    lines += a_loads[:A_LOOKAHEAD_GROUPS]
    for gi in range(groups):
        if gi + A_LOOKAHEAD_GROUPS < len(a_loads):
            lines.append(a_loads[gi + A_LOOKAHEAD_GROUPS])
        lines += _fmas(regs, a_groups, gi, elem)
        if ahead and gi == 0:
            lines.append("ldr %[t2], [%[koff]], #8")
        if ahead and gi == add_after:
            lines.append(f"add %[t], %[ap], %[t2], lsl #{elem.shift}")
    return lines


def render_asm_kloop(rows: int, nvec: int, a_groups: list[dict], a_pack: str, mr: int, k_unroll: int,
                     order: str, elem_bits: int = 32, indexed_registers: int = VECTOR_REGISTERS) -> dict:
    """The K loop of the full tile as assembly lines plus the registers it clobbers.

    Operands the template binds: %[ap] %[bp] %[koff] (pointers, advanced), %[main] (k_unroll-step
    iterations) and %[rest] (single steps), %[t] (scratch; with koff_ahead the A address), %[t2]
    (scratch, bound only when 'koff_ahead' is true), %[acc] (the local tile written at the end).
    """
    if order not in ASM_UKERNELS:
        raise ValueError(f"asm order '{order}' is not one of {ASM_UKERNELS}")
    elem = Elem.of(elem_bits)
    regs = register_map(rows, nvec, a_groups, indexed_registers)
    step = k_step(regs, a_groups, a_pack, mr, order, elem)
    lines = [f"movi v{r}.{elem.arrangement}, #0" for row in regs.acc for r in row]
    ahead = koff_ahead(a_pack, order)
    if ahead:   # the first k step's A address
        lines += ["ldr %[t], [%[koff]], #8", f"add %[t], %[ap], %[t], lsl #{elem.shift}"]
    lines += ["cbz %[main], 2f", "1:"]
    for _ in range(k_unroll):
        lines += step
    lines += ["subs %[main], %[main], #1", "b.ne 1b", "2:", "cbz %[rest], 4f", "3:"]
    lines += step
    lines += ["subs %[rest], %[rest], #1", "b.ne 3b", "4:"]
    acc = [r for row in regs.acc for r in row]   # row-major, as the tile is read back
    for i in range(0, len(acc) - 1, 2):
        lines.append(f"stp q{acc[i]}, q{acc[i + 1]}, [%[acc], #{16 * i}]")
    if len(acc) % 2:
        lines.append(f"str q{acc[-1]}, [%[acc], #{16 * (len(acc) - 1)}]")
    layout = ("A v0.., then the accumulators, then B" if regs.a and regs.a[0] == 0
              else "accumulators v0.., then B, then A")
    return {"lines": lines, "clobbers": [f"v{r}" for r in regs.used], "registers": len(regs.used),
            "koff_ahead": ahead, "layout": layout, "align": 16}


# ---------------------------------------------------------------------------------------------
# Depthwise: the column-block loop of a full row block.
# ---------------------------------------------------------------------------------------------

DW_MIN_INPUT_REGISTERS = 2      # rotating input vectors the depthwise loop needs at least
DW_MAX_OFFSET_BYTES = 65520     # the largest scaled offset of `ldr/str q` (4095 x 16)
# Input loads are issued this many loads ahead of their FMAs (at most the rotating pool - 1). Out of
# order: the accumulators start right before their first FMA (the dups spread over the integer pipe);
# in order: all of them start the iteration, so no FMA waits on a dup (llvm-mca A55 model: 0.64 vs 0.57).
DW_LOOKAHEAD_LOADS = {"asm_out_of_order": 6, "asm_in_order": 3}


def depthwise_constant_registers(activation: str) -> int:
    """Vector registers the activation needs: 0 (none), 1 (relu: zero) or 2 (relu6: zero, six)."""
    return {"none": 0, "relu": 1, "relu6": 2}[activation]


def depthwise_registers(taps: int, rows: int, vectors: int, activation: str) -> int:
    """Vector registers the asm loop needs: taps + accumulators + activation constants + inputs."""
    return taps + rows * vectors + depthwise_constant_registers(activation) + DW_MIN_INPUT_REGISTERS


def interleave_row_halves(loads: list[dict], rows: int) -> list[dict]:
    """The loads in program order for the asm loop: those whose first output row is in the top half
    of the tile alternate with those of the bottom half (each keeps its own order).

    Sorted by offset, a stretch of the loop feeds only the accumulators of the 1-3 output rows one
    input row reaches (2-4 chains at stride 2), which cannot keep 2 FMA pipes x 4 cycles of latency
    busy: llvm-mca-16's Neoverse-N2 model fills its 160-entry ROB and loses 0.67 cycles per 8x2
    stride-2 block. Alternating two independent halves doubles the open chains (steady state
    80.67 -> 80.0 cycles, the V-pipe bound; the A55 model's in-order loop 277 -> 187)."""
    if rows < 2:
        return list(loads)
    first_row = [min(u["row"] for u in ld["uses"]) for ld in loads]
    top = [ld for ld, r in zip(loads, first_row) if r < rows // 2]
    bottom = [ld for ld, r in zip(loads, first_row) if r >= rows // 2]
    out: list[dict] = []
    for i in range(max(len(top), len(bottom))):
        out += top[i:i + 1] + bottom[i:i + 1]
    return out


def _residue_pointer(name: str, offset: int) -> tuple[str, int]:
    """(pointer operand, scaled offset): base pointers exist for each byte residue mod 16 so that
    every q access is `ldr/str q, [ptr, #multiple of 16]`."""
    res = offset % 16
    return f"%[{name}{res}]", offset - res


def _residues(elem: Elem, byte_offsets: list[int]) -> list[int]:
    """The byte residues mod 16 the loop needs a pointer for besides 0: fp32 all of 4, 8, 12 (bound
    whether used or not, as the loop always has); fp16 only those the offsets use (up to 7 of 2..14)."""
    if elem.bits == 32:
        return [4, 8, 12]
    return sorted({off % 16 for off in byte_offsets} - {0})


def render_depthwise_asm(loads: list[dict], taps: int, rows: int, vectors: int, lanes: int, out_w: int,
                         activation: str, order: str, elem_bits: int = 32) -> dict:
    """The loop over the full column blocks of one full row block, as assembly lines (fp32: .4s;
    fp16: .8h, elem_bits=16).

    Operands the template binds: %[x0] (stage + ow0), %[y0] (out row oh0 + ow0), the pointers named
    in 'x_pointers' / 'y_pointers' (%[x4] = %[x0] + 4 bytes, ...; fp32 x4 x8 x12 y4 y8 y12, set
    here), %[n] (blocks), %[w] (weights pointer), %[init] (the bias bits, or 0, of type
    'init_type'). Weights and activation constants are loaded once.
    """
    if order not in ASM_UKERNELS:
        raise ValueError(f"asm order '{order}' is not one of {ASM_UKERNELS}")
    elem = Elem.of(elem_bits)
    arr, eb = elem.arrangement, elem.bytes
    consts = depthwise_constant_registers(activation)
    pool = VECTOR_REGISTERS - taps - rows * vectors - consts
    if pool < DW_MIN_INPUT_REGISTERS:
        raise ValueError(f"depthwise {rows}x{vectors} tile with {taps} taps needs more than {VECTOR_REGISTERS} registers")
    acc = [[i * vectors + j for j in range(vectors)] for i in range(rows)]
    wreg = [rows * vectors + t for t in range(taps)]
    creg = [rows * vectors + taps + c for c in range(consts)]
    inreg = [rows * vectors + taps + consts + p for p in range(pool)]
    block_bytes = eb * vectors * lanes
    in_offsets = [eb * ld["offset"] for ld in loads]
    out_offsets = {(i, j): eb * i * out_w + 16 * j for i in range(rows) for j in range(vectors)}
    x_res, y_res = _residues(elem, in_offsets), _residues(elem, list(out_offsets.values()))
    lines = [f"add %[x{r}], %[x0], #{r}" for r in x_res] + [f"add %[y{r}], %[y0], #{r}" for r in y_res]
    lines += [f"ld1r {{v{r}.{arr}}}, [%[w]], #{eb}" for r in wreg]
    if consts:
        lines.append(f"movi v{creg[0]}.{arr}, #0")
    if consts > 1:
        lines.append(f"fmov v{creg[1]}.{arr}, #6.0")
    lines += ["1:"]
    started: set[int] = set()
    if order == "asm_in_order":
        lines += [f"dup v{r}.{arr}, %w[init]" for row in acc for r in row]
        started = {r for row in acc for r in row}
    loads = interleave_row_halves(loads, rows)
    load_ins = []
    for k, ld in enumerate(loads):
        ptr, off = _residue_pointer("x", eb * ld["offset"])
        if off > DW_MAX_OFFSET_BYTES:
            raise ValueError(f"depthwise input offset {off} bytes does not encode")
        load_ins.append(f"ldr q{inreg[k % pool]}, [{ptr}, #{off}]")
    ahead = min(DW_LOOKAHEAD_LOADS[order], pool - 1)
    body = load_ins[:ahead]
    for k, ld in enumerate(loads):
        if k + ahead < len(loads):
            body.append(load_ins[k + ahead])
        x = inreg[k % pool]
        for u in ld["uses"]:
            r = acc[u["row"]][u["vec"]]
            if r not in started:   # initialised right before its first FMA, on an integer pipe (not a V-pipe copy)
                started.add(r)
                body.append(f"dup v{r}.{arr}, %w[init]")
            body.append(f"fmla v{r}.{arr}, v{x}.{arr}, v{wreg[u['tap']]}.{arr}")
    lines += body
    for i in range(rows):
        for j in range(vectors):
            r = acc[i][j]
            if consts:
                lines.append(f"fmax v{r}.{arr}, v{r}.{arr}, v{creg[0]}.{arr}")
            if consts > 1:
                lines.append(f"fmin v{r}.{arr}, v{r}.{arr}, v{creg[1]}.{arr}")
            ptr, off = _residue_pointer("y", out_offsets[(i, j)])
            if off > DW_MAX_OFFSET_BYTES:
                raise ValueError(f"depthwise output offset {off} bytes does not encode")
            lines.append(f"str q{r}, [{ptr}, #{off}]")
    for p in ["x0"] + [f"x{r}" for r in x_res] + ["y0"] + [f"y{r}" for r in y_res]:
        lines.append(f"add %[{p}], %[{p}], #{block_bytes}")
    lines += ["subs %[n], %[n], #1", "b.ne 1b"]
    used = [r for row in acc for r in row] + wreg + creg + inreg
    return {"lines": lines, "clobbers": [f"v{r}" for r in sorted(used)], "registers": len(used), "order": order,
            "x_pointers": [f"x{r}" for r in x_res], "y_pointers": [f"y{r}" for r in y_res],
            "init_type": "unsigned int" if elem.bits == 32 else "unsigned short"}
