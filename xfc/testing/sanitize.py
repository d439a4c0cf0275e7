"""Host kernels under AddressSanitizer + UndefinedBehaviorSanitizer, on edge-case shapes.

Guard zones (xfc/guards.py) see writes just outside the buffers xfc hands a kernel; they do not
see reads, writes far away, or anything inside the scratch the kernel allocates itself (packing
buffers, the staged image). This module builds each kernel with its harness main() as a
sanitized executable,

    gcc -O3 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer ...

(an ASan shared object cannot be loaded into an unsanitized Python), runs it on raw input files
for both entry points (weights packed per call, and pre-packed), and calls a case clean only if
the process exits 0 with no sanitizer report, the harness's own guards and NaN pre-fill hold,
and the output passes check_output.

`make sanitize` (scripts/sanitize.py) runs EDGE_CASES for every host ISA the machine can run and
writes benchmarks/results/sanitize.json; tests/test_sanitize.py runs a small subset.
"""
from __future__ import annotations

import platform
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Optional

from ..toolchain.cpu import SANITIZE_FLAGS  # noqa: F401  (re-exported: the flags of a sanitized build, build/cpu.py)
from ..toolchain.tools import HOST_CC
from ..cpu.plans import hand_plan
from ..errors import DeviceError, ToolchainError, VerificationError
from ..ops.spec import make_spec

SANITIZER_ENV = {
    # abort_on_error=0 keeps the exit status (1) instead of a signal; leaks are errors too
    "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:halt_on_error=1:detect_stack_use_after_return=1",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
}
RUN_TIMEOUT_S = 300


def host_isas(cpu_flags: Optional[set[str]] = None) -> list[str]:
    """ISAs of xfc's host dialects that this machine can execute, widest first."""
    if cpu_flags is None:
        cpu_flags = set()
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("flags"):
                    cpu_flags = set(line.split(":", 1)[1].split())
                    break
        except OSError:
            pass
    from ..hardware.host import supported_isas
    return list(supported_isas(cpu_flags))


@dataclass(frozen=True)
class EdgeCase:
    """One shape with the tile overrides that put its edges where they hurt."""

    name: str
    op: str
    shape: tuple[tuple[str, int], ...]
    options: tuple[tuple[str, object], ...] = ()
    plan: tuple[tuple[str, object], ...] = ()   # hand_plan overrides (mr, nr, kc, a_pack, ...)

    def spec(self):
        return make_spec(self.op, dict(self.shape), **dict(self.options))


def _case(name, op, shape, plan=(), **options):
    return EdgeCase(name, op, tuple(shape.items()), tuple(options.items()), tuple(plan))


# Ragged M/N/K around MR/NR/lanes/k-unroll, several KC slices, tails of every kind, stride 2,
# dilation, asymmetric pads, batch > 1, epilogues; run with 1, 2 and 3 threads.
EDGE_CASES: tuple[EdgeCase, ...] = (
    _case("mm_1x1x1", "matmul", dict(m=1, n=1, k=1)),
    _case("mm_ragged_tiles", "matmul", dict(m=15, n=33, k=17), bias=True, activation="relu6"),
    _case("mm_k_not_unrolled", "matmul", dict(m=7, n=9, k=5, batch=3), bias=True, activation="relu"),
    _case("mm_kc_slices", "matmul", dict(m=29, n=47, k=300), (("kc", 64),), bias=True),
    _case("mm_small_tiles_batch", "matmul", dict(m=13, n=31, k=41, batch=2), (("mr", 3), ("nr", 0),
                                                                               ("mc", 6), ("nc", 0), ("kc", 16))),
    _case("mm_packed_a", "matmul", dict(m=17, n=23, k=70, batch=2), (("a_pack", "packed"), ("kc", 32))),
    _case("conv_pointwise_ragged", "conv2d", dict(c=5, h=7, w=9, k=11, r=1, s=1), bias=True),
    _case("conv_stride2_asym_pad", "conv2d", dict(n=2, c=3, h=11, w=10, k=7, r=3, s=3),
          stride=2, pad=(1, 0, 2, 1), bias=True, activation="relu"),
    _case("conv_dilated", "conv2d", dict(c=4, h=12, w=13, k=9, r=3, s=2), dilation=(2, 3), pad=(2, 1, 1, 0)),
    _case("conv_5x5_kc", "conv2d", dict(n=2, c=9, h=9, w=8, k=13, r=5, s=5), (("kc", 40),), pad=2,
          activation="relu6", bias=True),
    _case("conv_transposed_packed", "conv2d", dict(n=2, c=6, h=9, w=7, k=19, r=3, s=3),
          (("transposed", True), ("a_pack", "packed")), stride=(2, 1), pad=(1, 1, 0, 2), bias=True),
    _case("conv_pointwise_transposed_spanning", "conv2d", dict(n=2, c=5, h=5, w=9, k=19, r=1, s=1),
          (("transposed", True), ("mr", 4)), bias=True, activation="relu6"),
    _case("conv_transposed_im2col_direct", "conv2d", dict(c=5, h=8, w=12, k=21, r=3, s=3),
          (("transposed", True), ("mr", 4)), pad=(1, 1, 1, 1), activation="relu"),
    _case("dw_ragged", "depthwise", dict(n=2, c=5, h=9, w=11, r=3, s=3), stride=2, pad=(1, 0, 2, 1),
          bias=True, activation="relu6"),
    _case("dw_dilated_wide", "depthwise", dict(c=3, h=10, w=37, r=3, s=5), dilation=(2, 1), pad=(2, 2, 1, 3)),
    _case("dw_7x7_stride2", "depthwise", dict(c=4, h=15, w=19, r=7, s=7), stride=2, pad=3, bias=True),
    # stride-2 rows long enough for whole deinterleaved vectors and a masked last one of 1 and of 16
    # lanes (phases of 33 and 32 columns), the last row ending where the input buffer does
    _case("dw_stride2_long_rows", "depthwise", dict(c=3, h=5, w=65, r=3, s=3), stride=2, bias=True),
    _case("conv_stride2_long_rows", "conv2d", dict(c=2, h=5, w=64, k=5, r=1, s=1), stride=2),
)
THREADS = (1, 2, 3)


def plan_for(case: EdgeCase, isa: str, threads: int):
    """hand_plan with the case's overrides; 0 means "the ISA's lanes" for nr / nc (tile-sized)."""
    from ..cpu.isa import ISA_TABLE
    overrides = dict(case.plan)
    lanes = ISA_TABLE[isa].hand_lanes
    for key in ("nr", "nc"):
        if overrides.get(key) == 0:
            overrides[key] = lanes
    name = f"xfc_san_{case.name}_{isa}_t{threads}"
    return hand_plan(case.spec(), isa, threads, function_name=name, **overrides)


@dataclass(frozen=True)
class SanitizeResult:
    case: str
    isa: str
    threads: int
    entry: str            # 'per-call' or 'pre-packed'
    clean: bool
    detail: str           # '' when clean; else the first sanitizer / guard / verification line
    spec: str = ""


def sanitize_case(case: EdgeCase, isa: str, threads: int, work_dir: Path,
                  fault=None) -> list[SanitizeResult]:
    """Build one case with ASan + UBSan and run both entry points through the chain
    (xfc.pipeline.stages, sanitized=True). fault: a deliberately wrong kernel (tests only)."""
    from ..ops.dtypes import FP32, make_operands
    from ..pipeline import stages
    plan = plan_for(case, isa, threads)
    spec = plan.spec
    built = stages.realize(plan, work_dir, fault=fault, sanitized=True)
    operands = make_operands(spec, FP32, seed=1)
    results = []
    for entry in stages.ENTRY_POINTS:
        try:
            run = stages.run(built, operands, prepacked=entry == "pre-packed", env=SANITIZER_ENV.items())
            verdict = stages.judge(plan, [run.output], operands)
            detail = "" if verdict.ok else f"output check: {verdict.reason}"
        except (VerificationError, ToolchainError, DeviceError) as exc:
            # '==123==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x...' -> the kind only
            detail = re.sub(r"==\d+==ERROR: (\w+Sanitizer: [\w-]+).*", r"\1", str(exc))
        results.append(SanitizeResult(case.name, isa, threads, entry, not detail, detail, spec.describe()))
    return results


def run_all(isas: Iterable[str], cases: Iterable[EdgeCase] = EDGE_CASES, threads: Iterable[int] = THREADS,
            work_dir: Optional[Path] = None, progress=None) -> dict:
    """Every case x ISA x thread count; returns the JSON-ready summary."""
    say = progress or (lambda msg: None)
    own = work_dir is None
    work_dir = Path(tempfile.mkdtemp(prefix="xfc-sanitize-")) if own else Path(work_dir)
    results: list[SanitizeResult] = []
    try:
        for isa in isas:
            for case in cases:
                for t in threads:
                    try:
                        got = sanitize_case(case, isa, t, work_dir)
                    except ToolchainError as exc:
                        got = [SanitizeResult(case.name, isa, t, "build", False, str(exc), case.spec().describe())]
                    results.extend(got)
                    bad = [r for r in got if not r.clean]
                    say(f"{isa:8s} {case.name:32s} t{t}: " + ("clean" if not bad else f"NOT CLEAN: {bad[0].detail}"))
    finally:
        if own:
            shutil.rmtree(work_dir, ignore_errors=True)
    return {
        "xfc_sanitize": 1,
        "flags": " ".join(SANITIZE_FLAGS),
        "env": SANITIZER_ENV,
        "machine": platform.machine(),
        "compiler": _compiler_version(),
        "isas": sorted({r.isa for r in results}, key=["avx512", "avx2", "generic"].index),
        "runs": len(results),
        "clean": all(r.clean for r in results),
        "not_clean": [asdict(r) for r in results if not r.clean],
        "results": [asdict(r) for r in results],
    }


def _compiler_version() -> str:
    try:
        return subprocess.run([HOST_CC, "--version"], capture_output=True, text=True,
                              timeout=30).stdout.splitlines()[0]
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return "unknown"
