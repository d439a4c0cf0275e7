"""Static throughput of a generated AArch64 kernel's inner FMA loop under llvm-mca (LLVM 16).

    kernel C --(aarch64 gcc, xfc's ARM build flags + -S)--> assembly
             --(parse: functions, labels, branches)------> innermost loop with the most FMAs
             --(llvm-mca-16 -mcpu=<model> -json)---------> cycles, resource pressure per iteration
             --> McaResult: FMA per cycle, share of the core's FMA pipes, bottleneck, spills

The innermost loop is a backward branch to a label whose body (label .. branch) holds no other
control transfer; labels inside the body are allowed, so GCC's rotated loops (entered in the
middle) count. For a GEMM kernel the loop with the most FMAs is the K loop of the full-size
micro-kernel (k_unroll k steps per iteration); for depthwise it is the column-block loop.

LLVM 16 has a faithful scheduling model for only some shipped cores, so every core maps to the
closest model in one table, MODELS (core -> llvm-mca -mcpu, the LLVM model behind it, the
model's q-form FMLA rate, and why). Where the model has a different number of FMA pipes than
the core (the 4-pipe X cores on the 2-pipe Neoverse-N2 model; the A55 model, which issues two
q-form FMLA per cycle where an A55 or A510 issues one), the figure is also rescaled to the core's
pipes with the arithmetic written out (see `_rescale`). These are static estimates from a
scheduling model: llvm-mca assumes every load hits L1 and models neither cache-line splits nor
the front end beyond its dispatch width. They are not timings.

Cycles per iteration are the loop's steady state: llvm-mca runs the loop N = MCA_ITERATIONS times
and 2N times, and the figure is (cycles(2N) - cycles(N)) / N, the cost of one more iteration. The
total over N iterations also holds a fixed pipeline fill and drain (1-44 cycles on the suite's loops) that
divided by N depends only on the arbitrary N; it is reported separately as `fill_cycles`, with the
old total / N figure as `cycles_per_iteration_with_fill`. The same method applies to every loop.

Tools: llvm-mca-16 (Debian/Ubuntu package llvm-16) and aarch64-linux-gnu-gcc. Every subprocess
gets an argument list and a timeout (xfc.procs); work files live in a temporary directory.
"""
from __future__ import annotations

import functools
import hashlib
import json
import re
import shutil
import subprocess
import tempfile
import threading
from collections import Counter, OrderedDict
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..toolchain import procs
from ..cpu.isa import isa_for
from ..errors import OperatorError, ToolchainError, XfcError

LLVM_MCA = "llvm-mca-16"
LLVM_MCA_PACKAGE = "llvm-16"
MCA_ITERATIONS = 200
MCA_TIMEOUT_S = 120
VERSION_TIMEOUT_S = 30


# ---------------------------------------------------------------------------------------------
# Core -> LLVM 16 scheduling model.
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class McaModel:
    """How one core is analysed with llvm-mca-16."""

    mcpu: str                    # llvm-mca -mcpu value (the source tag is 'llvm-mca:<mcpu>')
    scheduling_model: str        # the LLVM 16 model that -mcpu selects
    model_fma_per_cycle: float   # q-form FMLA per cycle the model issues (1 / its RThroughput)
    pipes_scale: float           # the core's fma_per_cycle / model_fma_per_cycle
    reliable: bool               # False: the figures are a record of the instruction mix, not speed
    why: str                     # why this model, and what the figure means for this core

    @property
    def source(self) -> str:
        return f"llvm-mca:{self.mcpu}"


_A53 = "CortexA53Model"
_A55 = "CortexA55Model"
_A57 = "CortexA57Model"
_N2 = "NeoverseN2Model"

# Measured with llvm-mca-16 (16.0.6): which model each -mcpu selects (TargetInfo resource names)
# and the model's q-form FMLA rate (tests/test_mca.py re-measures both for every entry).
# LLVM 16 maps cortex-a76/a77/a78/x1 to the A57 model, which caps q-form FMLA at 1 per cycle;
# the 2-pipe cores therefore use the A710-class model (Neoverse-N2, -mcpu=cortex-a710) instead.
MODELS: dict[str, McaModel] = {
    "cortex-a53": McaModel(
        "cortex-a53", _A53, 1, 1.0, False,
        "LLVM's own in-order A53 model, 1 q-form FMLA per cycle like the core, but it sustains only about 0.7 "
        "FMLA per cycle on 24 independent FMLAs (in-order completion holds the loop's integer ops behind the "
        "FMLA latency of 10): marked unreliable, a record of the instruction mix rather than of speed"),
    "cortex-a55": McaModel(
        "cortex-a55", _A55, 2, 0.5, False,
        "LLVM's A55 model, but it issues 2 q-form FMLA per cycle where the A55 issues 1 (and it does not "
        "model the 128-bit-load/FMLA pairing rules the tile choice relies on): the cycles are corrected to at "
        "least the FMA-pipe work on 1 pipe, and the figure is marked unreliable"),
    "cortex-a510": McaModel(
        "cortex-a55", _A55, 2, 0.5, False,
        "LLVM 16 has no A510 model (-mcpu=cortex-a510 selects the A55 model); the A55 model issues 2 q-form "
        "FMLA per cycle where the A510 issues 1 per core: corrected to 1 pipe, marked unreliable"),
    "cortex-a75": McaModel(
        "cortex-a57", _A57, 1, 1.0, True,
        "no A75 model in LLVM 16 (-mcpu=cortex-a75 selects the A57 model); its 1 q-form FMLA per cycle is the "
        "description's fma_per_cycle (itself marked uncertain there), so nothing is rescaled"),
    "cortex-a76": McaModel(
        "cortex-a710", _N2, 2, 1.0, True,
        "no A76 model in LLVM 16 (-mcpu=cortex-a76 selects the A57 model, 1 q-form FMLA per cycle); the "
        "A710-class model (Neoverse-N2) has the core's 2 128-bit FMA pipes: a 2-pipe proxy"),
    "cortex-a77": McaModel(
        "cortex-a710", _N2, 2, 1.0, True,
        "no A77 model in LLVM 16 (the A57 model caps q-form FMLA at 1 per cycle); the A710-class model has "
        "the core's 2 FMA pipes: a 2-pipe proxy"),
    "cortex-a78": McaModel(
        "cortex-a710", _N2, 2, 1.0, True,
        "no A78 model in LLVM 16 (the A57 model caps q-form FMLA at 1 per cycle); the A710-class model has "
        "the core's 2 FMA pipes: a 2-pipe proxy"),
    "cortex-a710": McaModel(
        "cortex-a710", _N2, 2, 1.0, True,
        "-mcpu=cortex-a710 selects the Neoverse-N2 model, the A710's sibling design with the same 2 "
        "128-bit FMA pipes"),
    "cortex-a715": McaModel(
        "cortex-a710", _N2, 2, 1.0, True,
        "no A715 model in LLVM 16 (-mcpu=cortex-a715 selects the Neoverse-N2 model too); 2 FMA pipes like "
        "the core"),
    "cortex-x1": McaModel(
        "cortex-a710", _N2, 2, 2.0, True,
        "no X1 model in LLVM 16 (-mcpu=cortex-x1 selects the A57 model) and no LLVM 16 model has 4 "
        "128-bit FMA pipes: the A710-class model's figure is reported, and rescaled to 4 pipes"),
    "cortex-x2": McaModel(
        "cortex-a710", _N2, 2, 2.0, True,
        "-mcpu=cortex-x2 selects the 2-pipe Neoverse-N2 model; the X2 has 4 FMA pipes: the model's figure "
        "is reported, and rescaled to 4 pipes"),
    "cortex-x3": McaModel(
        "cortex-a710", _N2, 2, 2.0, True,
        "-mcpu=cortex-x3 selects the 2-pipe Neoverse-N2 model; the X3 has 4 FMA pipes: the model's figure "
        "is reported, and rescaled to 4 pipes"),
}


def model_for(core) -> McaModel:
    """The table entry for a core description, or the closest class default for a core the
    table does not know (a user's own description): in-order -> the A55 model (unreliable),
    out-of-order -> the A710-class model rescaled to the core's FMA pipes."""
    isa = isa_for(core)
    if isa != "neon":
        raise OperatorError(f"llvm-mca analysis is for AArch64 NEON cores; {core.name} is {isa}")
    known = MODELS.get(core.name)
    if known is not None:
        return known
    if core.pipeline == "in_order":
        return McaModel("cortex-a55", _A55, 2, core.fma_per_cycle / 2, False,
                        f"{core.name} is not in the model table; in-order class default (the A55 model), "
                        f"rescaled to its {core.fma_per_cycle:g} FMA pipe(s); unreliable")
    return McaModel("cortex-a710", _N2, 2, core.fma_per_cycle / 2, True,
                    f"{core.name} is not in the model table; out-of-order class default (the A710-class "
                    f"model), rescaled to its {core.fma_per_cycle:g} FMA pipe(s)")


def models_markdown() -> str:
    """MODELS as a Markdown table (docs/arm-mca.md carries it; a unit test keeps them equal)."""
    rows = ["| core | llvm-mca -mcpu | LLVM 16 model | model q-FMLA/cycle | pipes scale | reliable | why |",
            "|---|---|---|---|---|---|---|"]
    for core, m in MODELS.items():
        rows.append(f"| {core} | `{m.mcpu}` | {m.scheduling_model} | {m.model_fma_per_cycle:g} | "
                    f"{m.pipes_scale:g} | {'yes' if m.reliable else 'no'} | {m.why} |")
    return "\n".join(rows)


# ---------------------------------------------------------------------------------------------
# Assembly: functions, labels, branches, innermost loops.
# ---------------------------------------------------------------------------------------------

_CONDITIONS = "eq|ne|cs|hs|cc|lo|mi|pl|vs|vc|hi|ls|ge|lt|gt|le|al|nv"
_BRANCH_TO_LABEL = re.compile(rf"^(b|b\.?(?:{_CONDITIONS})|cbz|cbnz|tbz|tbnz)$")
_OTHER_CONTROL = re.compile(r"^(bl|blr|br|ret|eret|braa|brab|blraa|blrab|retaa|retab|svc|hvc|brk|udf)$")
_LABEL = re.compile(r"^(\d+|[A-Za-z_.$][\w.$]*):")
_LOCAL_NUMERIC_REF = re.compile(r"^(\d+)([bf])$")   # '1b': the nearest '1:' before, '1f': after
FMA_MNEMONICS = frozenset({"fmla", "fmls", "fmadd", "fmsub", "fnmadd", "fnmsub"})


@dataclass(frozen=True)
class AsmInstruction:
    line: int            # 1-based line number in the assembly file
    mnemonic: str        # lower case
    operands: str
    labels: tuple[str, ...] = ()   # labels defined right before this instruction

    @property
    def text(self) -> str:
        return f"{self.mnemonic}\t{self.operands}" if self.operands else self.mnemonic

    @property
    def is_fma(self) -> bool:
        return self.mnemonic in FMA_MNEMONICS

    @property
    def branch_target(self) -> Optional[str]:
        if not _BRANCH_TO_LABEL.match(self.mnemonic):
            return None
        return self.operands.split(",")[-1].strip() or None

    @property
    def is_control(self) -> bool:
        return bool(_BRANCH_TO_LABEL.match(self.mnemonic) or _OTHER_CONTROL.match(self.mnemonic))


@dataclass(frozen=True)
class AsmFunction:
    name: str
    instructions: tuple[AsmInstruction, ...]


@dataclass(frozen=True)
class AsmLoop:
    function: str
    label: str
    instructions: tuple[AsmInstruction, ...]   # from the label's instruction to the back-branch

    @property
    def fma_count(self) -> int:
        return sum(i.is_fma for i in self.instructions)

    @property
    def first_line(self) -> int:
        return self.instructions[0].line

    def mca_input(self) -> str:
        """The loop as a standalone llvm-mca input: the head label, the instructions, the back-branch."""
        if not self.label.isdigit():
            return f"{self.label}:\n" + "".join(f"\t{i.text}\n" for i in self.instructions)
        # A numeric local label (inline assembly's '1:' ... 'b.ne 1b'): llvm-mca does not resolve
        # 'Nb' references, so the head gets a name and the back-branch points at it.
        head = f".Lxfc_loop_{self.label}"
        *body, branch = self.instructions
        target = branch.branch_target or ""
        operands = branch.operands[: len(branch.operands) - len(target)] + head if target else branch.operands
        back = dataclasses.replace(branch, operands=operands)
        return f"{head}:\n" + "".join(f"\t{i.text}\n" for i in (*body, back))


def _strip_comment(line: str) -> str:
    pos = line.find("//")        # the AArch64 GNU assembler's comment
    return (line[:pos] if pos >= 0 else line).strip()


def parse_functions(asm: str) -> tuple[AsmFunction, ...]:
    """Split GCC AArch64 assembly into functions (a label that is neither '.L...' nor numeric opens
    one) and their instructions; directives and comments are dropped, labels attach to the next
    instruction."""
    functions: list[AsmFunction] = []
    name: Optional[str] = None
    current: list[AsmInstruction] = []
    pending: list[str] = []
    for number, raw in enumerate(asm.splitlines(), start=1):
        line = _strip_comment(raw)
        while line:
            m = _LABEL.match(line)
            if not m:
                break
            label = m.group(1)
            if not label.startswith(".L") and not label.isdigit():
                if name is not None:
                    functions.append(AsmFunction(name, tuple(current)))
                name, current, pending = label, [], []
            else:
                pending.append(label)
            line = line[m.end():].strip()
        if not line or line.startswith("."):     # empty, or an assembler directive
            continue
        parts = line.split(None, 1)
        if name is None:
            name = "<top>"
        current.append(AsmInstruction(number, parts[0].lower(), " ".join(parts[1].split()) if len(parts) > 1 else "",
                                      tuple(pending)))
        pending = []
    if name is not None:
        functions.append(AsmFunction(name, tuple(current)))
    return tuple(functions)


def innermost_loops(function: AsmFunction) -> tuple[AsmLoop, ...]:
    """Every backward branch to a label of this function whose body holds no other control
    transfer (labels inside are fine: rotated loops)."""
    code = function.instructions
    where = {label: i for i, ins in enumerate(code) for label in ins.labels}
    loops = []
    for j, ins in enumerate(code):
        target = ins.branch_target
        if not target:
            continue
        numeric = _LOCAL_NUMERIC_REF.match(target)
        if numeric:   # 'b.hs 1b': the nearest '1:' at or before the branch
            label = numeric.group(1)
            i = next((k for k in range(j, -1, -1) if label in code[k].labels), None) \
                if numeric.group(2) == "b" else None
        else:
            label, i = target, where.get(target)
        if i is None or i > j:
            continue
        body = code[i:j + 1]
        if any(b.is_control for b in body[:-1]):
            continue
        loops.append(AsmLoop(function.name, label, body))
    return tuple(loops)


def find_fma_loop(asm: str) -> AsmLoop:
    """The innermost loop with the most FMA instructions (ties: the first in the file)."""
    best: Optional[AsmLoop] = None
    for function in parse_functions(asm):
        for loop in innermost_loops(function):
            if loop.fma_count and (best is None or loop.fma_count > best.fma_count):
                best = loop
    if best is None:
        raise XfcError("llvm-mca: the kernel's assembly has no innermost loop with FMA instructions")
    return best


# ---------------------------------------------------------------------------------------------
# What the loop's instructions are.
# ---------------------------------------------------------------------------------------------

_STACK = re.compile(r"\[\s*(sp|x29)\b")
_FP_SCALAR = re.compile(r"^[qdshb]\d+$")
_VECTOR = re.compile(r"^v\d+(\.\d*[bhsd])?(\[\d+\])?$")
_IMMEDIATE = re.compile(r"^#?-?(0x[0-9a-f]+|\d)")


def _operands(operands: str) -> list[str]:
    """Top-level operands: commas inside [...] (memory) and {...} (register lists) do not split."""
    out, depth, start = [], 0, 0
    for pos, ch in enumerate(operands):
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(operands[start:pos].strip())
            start = pos + 1
    out.append(operands[start:].strip())
    return [o for o in out if o]


def _registers(operands: str) -> list[str]:
    """Register operands before the memory operand, lower case; '{v0.4s, v1.4s}' lists flattened,
    lane indices kept ('v6.s[1]')."""
    regs = []
    for op in _operands(operands):
        if op.startswith("["):
            break
        if op.startswith("{"):
            inner = op[1:op.index("}")] if "}" in op else op[1:]
            regs += [r.strip().lower() for r in inner.split(",") if r.strip()]
        else:
            regs.append(op.lower())
    return regs


def _register_class(reg: str) -> str:
    """q/d/s/h/b for FP/SIMD scalar views, q or d for v-registers by arrangement, x/w for GPRs."""
    if _FP_SCALAR.match(reg):
        return reg[0]
    if reg.startswith("v"):
        arrangement = reg.split(".", 1)[1] if "." in reg else "16b"
        if arrangement in ("b", "h", "s", "d"):      # one lane: ld1 {v0.s}[1]
            return arrangement
        return "d" if arrangement in ("2s", "4h", "8b", "1d") else "q"
    if reg.startswith(("x", "w")):
        return reg[0]
    return "other"


def _is_fp_register(reg: str) -> bool:
    return bool(_FP_SCALAR.match(reg) or _VECTOR.match(reg))


@dataclass(frozen=True)
class LoopCounts:
    """Instruction counts of one loop iteration."""

    instructions: int
    fma: int
    loads: int                    # every load, stack reloads included
    stores: int                   # every store, spill stores included
    spill_stores: int             # sp/x29-relative stores of q/d/s (FP/SIMD) registers
    stack_reloads: int            # sp/x29-relative loads of q/d/s (FP/SIMD) registers
    gpr_stack_accesses: int       # sp/x29-relative loads and stores of x/w registers
    register_moves: int           # FP/SIMD register-to-register copies (mov v.16b, fmov, ins)
    loads_by_class: tuple[tuple[str, int], ...]   # destination class (q, d, s, x, ...) -> loads
    other: tuple[tuple[str, int], ...]            # mnemonic -> count: neither FMA nor memory access
                                                  # (loop control included)

    @property
    def overhead(self) -> int:
        """Instructions per iteration that are not FMAs."""
        return self.instructions - self.fma


def _is_register_move(ins: AsmInstruction) -> bool:
    if ins.mnemonic not in ("mov", "fmov", "orr", "ins", "dup"):
        return False
    regs = _registers(ins.operands)
    if ins.mnemonic == "orr":      # 'orr v0.16b, v1.16b, v1.16b' is a move
        return len(regs) == 3 and regs[1] == regs[2] and all(_VECTOR.match(r) for r in regs)
    if len(regs) != 2 or _IMMEDIATE.match(regs[1]):
        return False
    return _is_fp_register(regs[0]) and (_is_fp_register(regs[1]) or ins.mnemonic in ("fmov", "ins"))


def count_instructions(loop: AsmLoop) -> LoopCounts:
    loads = stores = spill_st = stack_ld = gpr_stack = moves = 0
    by_class: Counter = Counter()
    other: Counter = Counter()
    body = loop.instructions
    for ins in body:
        m = ins.mnemonic
        is_load = m.startswith("ld") and m not in ("ldadd",)
        is_store = m.startswith("st") and m not in ("stadd",)
        if is_load or is_store:
            regs = [r for r in _registers(ins.operands) if r not in ("xzr", "wzr")]
            stack = bool(_STACK.search(ins.operands))
            fp = any(_is_fp_register(r) for r in regs)
            if is_load:
                loads += 1
                by_class[_register_class(regs[0]) if regs else "other"] += 1
            else:
                stores += 1
            if stack and fp:
                if is_load:
                    stack_ld += 1
                else:
                    spill_st += 1
            elif stack:
                gpr_stack += 1
        elif not ins.is_fma:
            other[m] += 1
            moves += _is_register_move(ins)
    return LoopCounts(instructions=len(body), fma=loop.fma_count, loads=loads, stores=stores,
                      spill_stores=spill_st, stack_reloads=stack_ld, gpr_stack_accesses=gpr_stack,
                      register_moves=moves, loads_by_class=tuple(sorted(by_class.items())),
                      other=tuple(sorted(other.items(), key=lambda kv: (-kv[1], kv[0]))))


# ---------------------------------------------------------------------------------------------
# Tools.
# ---------------------------------------------------------------------------------------------

def require_llvm_mca() -> str:
    path = shutil.which(LLVM_MCA)
    if path is None:
        raise ToolchainError(f"'{LLVM_MCA}' was not found on PATH; install it with: apt-get install -y "
                             f"{LLVM_MCA_PACKAGE}")
    return path


def require_tools() -> None:
    """ToolchainError (exit 3, one line) unless llvm-mca-16 and the aarch64 cross compiler exist."""
    from ..toolchain.tools import ARM_CC, require_tool
    require_llvm_mca()
    require_tool(ARM_CC)


def _run_tool(argv: list[str], what: str, timeout: float, cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
    try:
        proc = procs.run(argv, timeout=timeout, cwd=str(cwd) if cwd else None)
    except subprocess.TimeoutExpired:
        raise ToolchainError(f"{what} timed out after {timeout:.0f} s") from None
    except OSError as exc:
        raise ToolchainError(f"{what} could not start '{argv[0]}': {exc}") from None
    if proc.returncode != 0:
        text = (proc.stderr or proc.stdout or "").strip().splitlines()
        first = next((ln for ln in text if "error" in ln.lower()), text[0] if text else "")
        raise ToolchainError(f"{what} failed (exit {proc.returncode}): {first.strip()[:300]}")
    return proc


@functools.lru_cache(maxsize=None)
def _version_line(tool: str) -> str:
    proc = _run_tool([tool, "--version"], f"{tool} --version", VERSION_TIMEOUT_S)
    lines = [ln.strip() for ln in (proc.stdout or proc.stderr).splitlines() if ln.strip()]
    version = next((ln for ln in lines if "version" in ln.lower()), lines[0] if lines else "")
    return version or "unknown"


def compiler_version() -> str:
    from ..toolchain.tools import ARM_CC, require_tool
    return _version_line(require_tool(ARM_CC))


def llvm_mca_version() -> str:
    return _version_line(require_llvm_mca())


# ---------------------------------------------------------------------------------------------
# Compile, extract, measure.
# ---------------------------------------------------------------------------------------------

class _Memo:
    """A small thread-safe LRU memo: a tile-DB build asks for each kernel once or twice, so a few
    dozen entries are plenty and memory stays bounded."""

    def __init__(self, size: int = 64):
        self.size = size
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key):
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        return None

    def put(self, key, value) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


_ASM_CACHE = _Memo()
_MCA_CACHE = _Memo()


def assembly_command(rendered, kernel_c: Path, asm_out: Path) -> list[str]:
    """xfc's ARM build command (xfc.toolchain.cpu.arm_compile_command) for the kernel alone, with -S:
    the same compiler and flags, no harness, the output an assembly file."""
    from ..toolchain.cpu import arm_compile_command
    harness = Path(f"{rendered.function_name}_harness.c")
    argv = arm_compile_command(rendered, kernel_c, harness, asm_out)
    if argv.count(harness.name) != 1:
        raise XfcError(f"llvm-mca: cannot find the harness in the ARM build command {argv}")
    argv.remove(harness.name)
    return argv[:1] + ["-S"] + argv[1:]


def compile_to_assembly(rendered, timeout_s: float = 180.0) -> str:
    """The kernel's AArch64 assembly, compiled with xfc's ARM build flags (cached per source,
    command and compiler version)."""
    from ..toolchain.tools import ARM_CC, require_tool
    require_tool(ARM_CC)
    probe = assembly_command(rendered, Path("kernel.c"), Path("kernel.s"))
    key = (hashlib.sha256(rendered.source.encode()).hexdigest(), tuple(probe), compiler_version())
    cached = _ASM_CACHE.get(key)
    if cached is not None:
        return cached
    with tempfile.TemporaryDirectory(prefix="xfc-mca-") as tmp:
        work = Path(tmp)
        (work / "kernel.c").write_text(rendered.source)
        # with the precompiled <arm_neon.h> (xfc.toolchain.pch): the same assembly, a third of the time
        from ..toolchain.cpu import compile_with_pch
        compile_with_pch(probe, f"aarch64 compile (-S) of {rendered.function_name}", (rendered.source,), cwd=work)
        asm = (work / "kernel.s").read_text()
    _ASM_CACHE.put(key, asm)
    return asm


def run_llvm_mca(loop_text: str, mcpu: str, iterations: int = MCA_ITERATIONS) -> dict:
    """llvm-mca-16's JSON report for the loop text (cached per text, -mcpu, iterations, version;
    the cached dict is shared: read it, do not change it). LLVM 16's llvm-mca has -json."""
    tool = require_llvm_mca()
    key = (loop_text, mcpu, iterations, llvm_mca_version())
    cached = _MCA_CACHE.get(key)
    if cached is not None:
        return cached
    with tempfile.TemporaryDirectory(prefix="xfc-mca-") as tmp:
        path = Path(tmp) / "loop.s"
        path.write_text(loop_text)
        proc = _run_tool([tool, "-mtriple=aarch64", f"-mcpu={mcpu}", f"-iterations={iterations}", "-json", str(path)],
                         f"{LLVM_MCA} -mcpu={mcpu}", MCA_TIMEOUT_S)
    try:
        report = json.loads(proc.stdout)
        report["CodeRegions"][0]["SummaryView"]["TotalCycles"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise ToolchainError(f"{LLVM_MCA} -mcpu={mcpu}: unexpected output (not its -json report): "
                             f"{proc.stdout.strip()[:120]!r}") from None
    _MCA_CACHE.put(key, report)
    return report


def _resource_name(raw: str) -> str:
    """'N2UnitV0' stays; LLVM writes unit i of a group as 'N2UnitL01.' + chr(i): 'N2UnitL01.1'."""
    base, dot, suffix = raw.partition(".")
    if dot and len(suffix) == 1 and ord(suffix) < 32:
        return f"{base}.{ord(suffix)}"
    return raw.replace("\x00", "")


@dataclass(frozen=True)
class McaRun:
    instructions: int
    iterations: int
    total_cycles: int
    block_rthroughput: float
    pressure: tuple[tuple[str, float], ...]        # resource -> cycles per iteration, file order
    fma_resources: tuple[str, ...]                 # resources the loop's FMA instructions use
    total_cycles_twice: Optional[int] = None       # the same loop run 2 x iterations (steady_state_run)

    @property
    def cycles_per_iteration_with_fill(self) -> float:
        return self.total_cycles / self.iterations

    @property
    def cycles_per_iteration(self) -> float:
        """Steady state, (cycles(2N) - cycles(N)) / N, where the 2N run is known; else cycles(N) / N."""
        if self.total_cycles_twice is None:
            return self.cycles_per_iteration_with_fill
        return (self.total_cycles_twice - self.total_cycles) / self.iterations

    @property
    def fill_cycles(self) -> float:
        """The fixed pipeline fill and drain inside cycles(N): cycles(N) - N x steady state."""
        return self.total_cycles - self.iterations * self.cycles_per_iteration


def parse_mca_json(report: dict, loop: AsmLoop) -> McaRun:
    region = report["CodeRegions"][0]
    summary = region["SummaryView"]
    names = [_resource_name(r) for r in report["TargetInfo"]["Resources"]]
    n = len(region["Instructions"])
    if n != len(loop.instructions):
        raise ToolchainError(f"{LLVM_MCA}: read {n} instructions of the loop, expected {len(loop.instructions)}")
    pressure: dict[str, float] = {}
    fma_units: set[str] = set()
    for entry in region["ResourcePressureView"]["ResourcePressureInfo"]:
        name = names[entry["ResourceIndex"]]
        index = entry["InstructionIndex"]
        if index == n:           # the per-iteration total row
            pressure[name] = pressure.get(name, 0.0) + float(entry["ResourceUsage"])
        elif index < n and loop.instructions[index].is_fma and entry["ResourceUsage"] > 0:
            fma_units.add(name)
    ordered = tuple((name, round(pressure[name], 4)) for name in dict.fromkeys(names) if name in pressure)
    return McaRun(instructions=n, iterations=int(summary["Iterations"]), total_cycles=int(summary["TotalCycles"]),
                  block_rthroughput=float(summary["BlockRThroughput"]), pressure=ordered,
                  fma_resources=tuple(sorted(fma_units)))


def steady_state_run(report: dict, report_twice: dict, loop: AsmLoop) -> McaRun:
    """McaRun of the N-iteration report with the 2N-iteration report's total cycles attached
    (pressure and the rest per iteration are the N run's)."""
    run = parse_mca_json(report, loop)
    twice = parse_mca_json(report_twice, loop)
    if twice.iterations != 2 * run.iterations or twice.total_cycles < run.total_cycles:
        raise ToolchainError(f"{LLVM_MCA}: the {twice.iterations}-iteration run ({twice.total_cycles} cycles) does not "
                             f"extend the {run.iterations}-iteration run ({run.total_cycles} cycles)")
    return dataclasses.replace(run, total_cycles_twice=twice.total_cycles)


# ---------------------------------------------------------------------------------------------
# The result.
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class McaResult:
    """llvm-mca's view of one kernel's inner FMA loop on one core (a static estimate)."""

    core: str
    model: str                    # llvm-mca -mcpu
    scheduling_model: str
    model_note: str               # MODELS[core].why
    reliable: bool
    function: str                 # the assembly function holding the loop
    loop_label: str
    counts: LoopCounts
    iterations: int               # llvm-mca -iterations N (the loop also runs 2N times)
    cycles_per_iteration: float   # the model's steady state: (cycles(2N) - cycles(N)) / N
    block_rthroughput: float
    fma_per_cycle: float          # the model's
    core_fma_per_cycle: float     # the described core's FMA pipes (fma_per_cycle)
    pipe_share: float             # fma_per_cycle / core_fma_per_cycle
    bottleneck: str               # the resource with the most pressure per iteration
    bottleneck_cycles: float
    fma_resources: tuple[str, ...]
    fma_pipe_work: float          # cycles per iteration the FMA resources are busy, summed
    pressure: tuple[tuple[str, float], ...]
    pipes_scale: float
    scaled_cycles_per_iteration: Optional[float]   # rescaled to the core's FMA pipes (None: scale 1)
    scaled_arithmetic: str
    compiler: str
    llvm_mca: str
    loop_text: str = field(repr=False, default="")
    cycles_per_iteration_with_fill: float = 0.0   # cycles(N) / N, pipeline fill and drain included
    fill_cycles: float = 0.0                      # cycles(N) - N x cycles_per_iteration
    scope: str = ""                               # what the loop stands for when not the whole kernel


    @property
    def source(self) -> str:
        return f"llvm-mca:{self.model}"

    @property
    def scaled_fma_per_cycle(self) -> Optional[float]:
        if self.scaled_cycles_per_iteration is None:
            return None
        return self.counts.fma / self.scaled_cycles_per_iteration

    @property
    def estimate_cycles_per_iteration(self) -> float:
        """The figure for the described core: rescaled where the model's pipes differ, else the model's."""
        return self.scaled_cycles_per_iteration if self.scaled_cycles_per_iteration is not None \
            else self.cycles_per_iteration

    @property
    def estimate_fma_per_cycle(self) -> float:
        return self.counts.fma / self.estimate_cycles_per_iteration

    @property
    def estimate_pipe_share(self) -> float:
        return self.estimate_fma_per_cycle / self.core_fma_per_cycle

    def as_dict(self) -> dict:
        c = self.counts
        out = {
            "what": "static estimate from llvm-mca's scheduling model, not a timing",
            "source": self.source, "core": self.core, "model": self.model,
            "scheduling_model": self.scheduling_model, "model_note": self.model_note, "reliable": self.reliable,
            "function": self.function, "loop_label": self.loop_label,
            "instructions_per_iteration": c.instructions, "fma_per_iteration": c.fma,
            "cycles_per_iteration": round(self.cycles_per_iteration, 3),
            "cycles_per_iteration_with_fill": round(self.cycles_per_iteration_with_fill, 3),
            "fill_cycles": round(self.fill_cycles, 3),
            "block_rthroughput": self.block_rthroughput,
            "fma_per_cycle": round(self.fma_per_cycle, 3), "core_fma_per_cycle": self.core_fma_per_cycle,
            "pipe_share": round(self.pipe_share, 4),
            "bottleneck": self.bottleneck, "bottleneck_cycles_per_iteration": self.bottleneck_cycles,
            "fma_resources": list(self.fma_resources), "fma_pipe_work": self.fma_pipe_work,
            "pipes_scale": self.pipes_scale,
            "scaled_cycles_per_iteration": (None if self.scaled_cycles_per_iteration is None
                                            else round(self.scaled_cycles_per_iteration, 3)),
            "scaled_fma_per_cycle": (None if self.scaled_fma_per_cycle is None
                                     else round(self.scaled_fma_per_cycle, 3)),
            "scaled_arithmetic": self.scaled_arithmetic,
            "estimate_fma_per_cycle": round(self.estimate_fma_per_cycle, 3),
            "estimate_pipe_share": round(self.estimate_pipe_share, 4),
            "loads": c.loads, "loads_by_class": dict(c.loads_by_class), "stores": c.stores,
            "spill_stores": c.spill_stores, "stack_reloads": c.stack_reloads,
            "gpr_stack_accesses": c.gpr_stack_accesses, "register_moves": c.register_moves,
            "other_instructions": dict(c.other), "overhead_instructions": c.overhead,
            "resource_pressure": dict(self.pressure), "iterations": self.iterations,
            "compiler": self.compiler, "llvm_mca": self.llvm_mca,
        }
        if self.scope:
            out["scope"] = self.scope
        return out

    def summary_lines(self) -> list[str]:
        c = self.counts
        lines = [f"llvm-mca ({self.model}, {self.scheduling_model}; static estimate, not a timing): loop "
                 f"{self.loop_label} in {self.function}: {c.instructions} instructions, {c.fma} FMA, "
                 f"{self.cycles_per_iteration:.1f} cycles per iteration (steady state; "
                 f"{self.fill_cycles:.0f} cycles of pipeline fill per {self.iterations} iterations)",
                 f"  {self.fma_per_cycle:.2f} FMA/cycle = {self.pipe_share:.0%} of the core's "
                 f"{self.core_fma_per_cycle:g} FMA pipe(s); bottleneck {self.bottleneck} "
                 f"({self.bottleneck_cycles:g} cycles/iteration)",
                 f"  spills (FP/SIMD registers): {c.spill_stores} store(s), {c.stack_reloads} reload(s); "
                 f"register moves: {c.register_moves}",
                 f"  non-FMA instructions: {c.overhead} = {c.loads} load(s) ("
                 + ", ".join(f"{k} {v}" for k, v in c.loads_by_class) + f") + {c.stores} store(s) + "
                 + f"{sum(n for _, n in c.other)} other ("
                 + (", ".join(f"{k} {v}" for k, v in c.other) or "none") + ")"]
        if self.scaled_cycles_per_iteration is not None:
            lines.append(f"  rescaled to the core's pipes: {self.scaled_fma_per_cycle:.2f} FMA/cycle = "
                         f"{self.estimate_pipe_share:.0%} ({self.scaled_arithmetic})")
        if self.scope:
            lines.insert(1, f"  scope: {self.scope}")
        if not self.reliable:
            lines.append(f"  UNRELIABLE for {self.core}: {self.model_note}")
        return lines


_WRITES_NOTHING = frozenset({"cmp", "cmn", "tst", "ccmp", "ccmn", "fcmp", "fcmpe", "prfm", "nop"})


def _written_registers(ins: AsmInstruction) -> list[str]:
    """Registers an instruction writes (base names: v3, x1): load lists, else the first operand."""
    if ins.is_control or ins.mnemonic.startswith("st") or ins.mnemonic in _WRITES_NOTHING:
        return []
    regs = [r.split(".")[0].split("[")[0] for r in _registers(ins.operands)]
    if ins.mnemonic.startswith("ld"):
        return regs
    return regs[:1]


def _view(reg: str) -> str:
    """q3, d3, s3 and v3 are one register."""
    return "v" + reg[1:] if _FP_SCALAR.match(reg) else reg


def _chain_cycles(loop: AsmLoop, latency: int) -> float:
    """A latency bound: FMAs per iteration into one accumulator that nothing else in the loop
    writes (a loop-carried chain) x the FMA latency. Accumulators reset by a move or a reload
    start a new chain each iteration and bound nothing."""
    fma_writes: Counter = Counter()
    other_writes: set[str] = set()
    for ins in loop.instructions:
        written = [_view(r) for r in _written_registers(ins)]
        if ins.is_fma:
            fma_writes.update(written[:1])
        else:
            other_writes.update(written)
    carried = [n for reg, n in fma_writes.items() if reg not in other_writes]
    return float(max(carried) * latency) if carried else 0.0


def _rescale(run: McaRun, loop: AsmLoop, counts: LoopCounts, model: McaModel,
             core) -> tuple[Optional[float], float, str]:
    """(cycles per iteration on the core's FMA pipes or None, FMA-pipe work, the arithmetic).

    The FMA-pipe work W is the summed pressure of the resources the loop's FMAs use, in cycles
    per iteration; the model spreads it over its own FMA pipes P (model_fma_per_cycle, after
    normalising units that work in pairs). On a core with s = pipes_scale times as many pipes:
      s > 1 (X cores): cycles >= max(W / (P s), the busiest other resource, the longest
            loop-carried accumulator chain x FMA latency): a bound, not a simulation; decode and
            rename width are left out (a hot loop runs from the macro-op cache), and the
            instructions per FMA are stated instead;
      s < 1 (A55 model for A55/A510): cycles = max(the model's cycles, W / (P s)).
    """
    work = sum(p for name, p in run.pressure if name in run.fma_resources)
    scale = model.pipes_scale
    if scale == 1 or not run.fma_resources:
        return None, work, ""
    # Pipe-cycles of FMA work per q-form FMA in this model (the A57 model's FMLA uses W and X
    # together): normalise so that W / units_per_fma counts issue slots of one FMA pipe.
    units = len(run.fma_resources)
    pipes = model.model_fma_per_cycle
    slot_work = work * pipes / units           # FMA-pipe work in one-pipe cycles
    fma_bound = slot_work / (pipes * scale)
    target = pipes * scale
    if scale > 1:
        others = [(n, p) for n, p in run.pressure if n not in run.fma_resources]
        other_name, other = max(others, key=lambda x: x[1]) if others else ("none", 0.0)
        chain = _chain_cycles(loop, core.fma_latency_cycles)
        cycles = max(fma_bound, other, chain)
        text = (f"FMA-pipe work {slot_work:.2f} pipe-cycles / {target:g} pipes = {fma_bound:.2f}; busiest other "
                f"unit {other_name} {other:.2f}; loop-carried FMA chain {chain / core.fma_latency_cycles:.0f} x "
                f"{core.fma_latency_cycles} = {chain:.0f}; bound {cycles:.2f} cycles/iteration -> {counts.fma} / "
                f"{cycles:.2f} = {counts.fma / cycles:.2f} FMA/cycle (front end not modelled: "
                f"{counts.instructions / counts.fma:.2f} instructions per FMA)")
    else:
        cycles = max(run.cycles_per_iteration, fma_bound)
        text = (f"FMA-pipe work {slot_work:.2f} pipe-cycles / {target:g} pipe(s) = {fma_bound:.2f}; model "
                f"{run.cycles_per_iteration:.2f}; corrected {cycles:.2f} cycles/iteration -> {counts.fma} / "
                f"{cycles:.2f} = {counts.fma / cycles:.2f} FMA/cycle")
    return cycles, work, text


def analyze_loop(loop: AsmLoop, core, model: Optional[McaModel] = None, iterations: int = MCA_ITERATIONS,
                 compiler: str = "") -> McaResult:
    """Run llvm-mca-16 on an extracted loop for a core description."""
    model = model or model_for(core)
    text = loop.mca_input()
    run = steady_state_run(run_llvm_mca(text, model.mcpu, iterations), run_llvm_mca(text, model.mcpu, 2 * iterations),
                           loop)
    counts = count_instructions(loop)
    cycles = run.cycles_per_iteration
    bottleneck, bottleneck_cycles = max(run.pressure, key=lambda x: x[1]) if run.pressure else ("none", 0.0)
    scaled, work, arithmetic = _rescale(run, loop, counts, model, core)
    fma_per_cycle = counts.fma / cycles if cycles > 0 else 0.0
    return McaResult(core=core.name, model=model.mcpu, scheduling_model=model.scheduling_model, model_note=model.why,
                     reliable=model.reliable, function=loop.function, loop_label=loop.label, counts=counts,
                     iterations=run.iterations, cycles_per_iteration=cycles, block_rthroughput=run.block_rthroughput,
                     fma_per_cycle=fma_per_cycle, core_fma_per_cycle=float(core.fma_per_cycle),
                     pipe_share=fma_per_cycle / core.fma_per_cycle, bottleneck=bottleneck,
                     bottleneck_cycles=bottleneck_cycles, fma_resources=run.fma_resources,
                     fma_pipe_work=round(work, 4), pressure=run.pressure, pipes_scale=model.pipes_scale,
                     scaled_cycles_per_iteration=scaled, scaled_arithmetic=arithmetic, compiler=compiler,
                     llvm_mca=llvm_mca_version(), loop_text=text,
                     cycles_per_iteration_with_fill=run.cycles_per_iteration_with_fill, fill_cycles=run.fill_cycles)


def analyze_kernel(rendered, core, model: Optional[McaModel] = None, iterations: int = MCA_ITERATIONS) -> McaResult:
    """Compile a rendered CPU kernel (xfc.cpu.codegen.render_cpu_kernel) with xfc's ARM flags and
    run llvm-mca-16 on its innermost FMA loop, for a core description (xfc.hardware.CpuCore)."""
    if rendered.plan.isa not in ("neon", "neon_fp16"):   # neon_fp16: FMLA .8h (xfc/cpu/fp16.py)
        raise OperatorError(f"llvm-mca analysis needs a NEON kernel; {rendered.function_name} is {rendered.plan.isa}")
    model = model or model_for(core)
    require_llvm_mca()
    rendered, scope = gemm_stage_kernel(rendered)
    loop = find_fma_loop(compile_to_assembly(rendered))
    result = analyze_loop(loop, core, model, iterations, compiler=compiler_version())
    return dataclasses.replace(result, scope=scope) if scope else result


def gemm_stage_kernel(rendered) -> tuple:
    """(the kernel whose FMA loop is analysed, scope text). A Winograd kernel's input and output
    transforms have FMA loops of their own, and the GEMM micro-kernel is inlined into the parallel
    region, so the loop with the most FMAs may be a transform. Its GEMM stage is analysed instead:
    the same micro-kernel (templates/cpu/gemm_ukernel.j2) under the same schedule, compiled in the
    matmul kernel of one of its (m+2)^2 GEMMs. Any other kernel is analysed as it is."""
    plan = rendered.plan
    if plan.lowering != "winograd":
        return rendered, ""
    from ..cpu.codegen import render_cpu_kernel
    from ..cpu.winograd import gemm_problem
    problem = gemm_problem(plan.spec, plan.winograd_m)
    gemm_plan = dataclasses.replace(plan, spec=problem, lowering="gemm", winograd_m=0,
                                    function_name=f"{plan.function_name}_gemm_stage")
    a = plan.winograd_m + 2
    scope = (f"GEMM stage of the Winograd F({plan.winograd_m}x{plan.winograd_m},3x3) plan: one of its {a * a} "
             f"GEMMs (M={problem.m} N={problem.n} K={problem.k}), same micro-kernel and schedule, compiled as a "
             f"matmul kernel; the transforms are not in this figure")
    return render_cpu_kernel(gemm_plan), scope


def analyze_synthesis(result) -> McaResult:
    """analyze_kernel for a CpuSynthesis (xfc.cpu.synth.synthesize_cpu's result)."""
    from ..cpu.codegen import render_cpu_kernel
    return analyze_kernel(render_cpu_kernel(result.plan), result.cluster.core)


def predicted_gflops(result: McaResult, clock_ghz: float, lanes: int) -> float:
    """GFLOP/s of one core running only this loop: FMA per cycle (on the core's pipes) x lanes x 2 x clock."""
    return result.estimate_fma_per_cycle * lanes * 2 * clock_ghz
