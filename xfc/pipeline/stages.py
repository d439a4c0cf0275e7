"""The one chain every CPU kernel goes through, whatever its dtype and whoever asks for it:

    plan -> render -> fault (tests only) -> build -> run both entry points -> verify -> time

`xfc synth` (run_synth), `xfc bench` (run_bench), xfc.compile, `xfc fuzz`, `xfc model`, the
sanitizer builds and the tile database's operator measurements all call these functions; no other
module builds a kernel and runs it (tests/unit/test_layering.py checks that).

  render(plan)            the renderer of the plan's type (fp32/fp16 plans: cpu.codegen; int8 plans:
                          cpu.qcodegen): a table, not a branch per caller
  realize(plan, dir)      render, apply the fault a test hands in, build for where the plan runs: this
                          machine (a shared library loaded in this process, HostRunner), AArch64 (a
                          static harness under qemu-aarch64 with the plan's CPU model, or the runner
                          given: a phone or the virtual device), or a sanitized host program
  run(built, operands)    one entry point through the runner (RunSpec typed from the operands)
  verify(built, operands) both entry points (weights packed inside the call, and pre-packed once),
                          judged by the dtype's oracle under the plan's own bound (Winograd plans:
                          theirs; fp16 GEMM plans: the running bound of their KC; int8: byte for byte)
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Optional

from ..toolchain.cpu import build_arm, build_host, build_sanitized
from ..toolchain.tools import RUN_TIMEOUT_S
from ..cpu.codegen import render_cpu_kernel
from ..cpu.ir import CpuKernelPlan
from ..cpu.int8_codegen import render_int8_kernel
from ..cpu.int8_plan import Int8Plan
from ..errors import OperatorError
from ..ops.dtypes import Check, Operands, check, merge_checks, output_type
from ..runners import Measurement, RunSpec
from ..runners.base import Runner
from ..runners.host import HostKernel, HostRunner
from ..runners.qemu import LocalRunner, QemuRunner, qemu_cpu_models

# plan type -> renderer: the plan says what it is, the table says who spells it
RENDERERS: Mapping[type, Callable] = {CpuKernelPlan: render_cpu_kernel, Int8Plan: render_int8_kernel}
ENTRY_POINTS = ("per-call", "pre-packed")    # weights packed inside every call; packed once by <fn>_prepack


def render(plan):
    """The rendered kernel (sources, function names, ABI) of a CPU plan of any dtype."""
    renderer = RENDERERS.get(type(plan))
    if renderer is None:
        raise OperatorError(f"no renderer for a {type(plan).__name__}")
    return renderer(plan)


@dataclass(frozen=True, eq=False)
class Built:
    """A rendered kernel built for where it runs, and the runner that runs it."""

    rendered: object                 # cpu.codegen.RenderedKernel
    artifact: Path                   # the host .so, or the harness program
    runner: Runner
    build_seconds: float
    compiler: str                    # 'host gcc', 'aarch64-linux-gnu-gcc -static', 'host gcc, sanitized'
    host: Optional[HostKernel] = None   # the kernel loaded in this process (x86-64 builds)

    @property
    def plan(self):
        return self.rendered.plan

    @property
    def where(self) -> str:
        return self.runner.where


def qemu_model(plan) -> str:
    """The qemu-aarch64 -cpu model an AArch64 plan runs on (its core's, else 'max')."""
    cpu = plan.qemu_cpu or "max"
    return cpu if cpu in qemu_cpu_models() else "max"


def build(rendered, directory: Path, *, runner: Optional[Runner] = None, sanitized: bool = False) -> Built:
    """Build rendered into directory for where its plan runs. runner: run an AArch64 harness there
    (a phone or the virtual device) instead of qemu-aarch64. sanitized: a host harness program with
    ASan + UBSan (run by LocalRunner)."""
    plan = rendered.plan
    directory = Path(directory)
    start = time.perf_counter()
    if sanitized:
        artifact = build_sanitized(rendered, directory)
        return Built(rendered, artifact, LocalRunner(), time.perf_counter() - start, "host gcc, sanitized")
    if plan.target_arch == "aarch64":
        artifact = build_arm(rendered, directory)
        return Built(rendered, artifact, runner or QemuRunner(cpu=qemu_model(plan)), time.perf_counter() - start,
                     "aarch64-linux-gnu-gcc -static")
    host = HostKernel(rendered, build_host(rendered, directory))
    return Built(rendered, host.library, HostRunner(host), time.perf_counter() - start, "host gcc", host=host)


def realize(plan, directory: Path, *, fault: Optional[Callable] = None, runner: Optional[Runner] = None,
            sanitized: bool = False) -> Built:
    """render -> fault -> build. fault: a function from a rendered kernel to a (deliberately wrong)
    rendered kernel, handed in by tests and `XFC_TEST_MUTANT` through the command line; never chosen here."""
    rendered = render(plan)
    if fault is not None:
        rendered = fault(rendered)
    return build(rendered, directory, runner=runner, sanitized=sanitized)


def run(built: Built, operands: Operands, *, prepacked: bool, repeat: int = 1, warmup: int = 0,
        cpu_ids: Optional[tuple[int, ...]] = None, timeout_s: float = RUN_TIMEOUT_S, env=()) -> Measurement:
    """One entry point of a built kernel on operands, through its runner."""
    spec, plan = built.plan.spec, built.plan
    abi = built.rendered.abi
    inputs = operands.for_abi(spec)
    if built.host is not None:                  # in process: an optional operand the spec lacks stays out
        inputs = tuple(None if i in abi.optional and operands.arrays[i] is None else x for i, x in enumerate(inputs))
    return built.runner.execute(RunSpec(
        harness=built.artifact, inputs=inputs, repeat=repeat, warmup=warmup, timeout_s=timeout_s,
        output_shape=tuple(spec.output_shape), label=built.rendered.function_name, protocol="times-file",
        march=plan.gcc_march or "", prepacked=prepacked, input_shapes=operands.shapes(spec),
        input_types=tuple(t.str for t in operands.c_types()), output_type=output_type(operands.dtype,
                                                                                     operands.quant).str,
        flops=spec.flops, cpu_ids=cpu_ids, env=tuple(env)))


@dataclass(frozen=True, eq=False)
class Outcome:
    """What verify found: the verdict, and the run of each entry point (outputs, timings)."""

    built: Built
    check: Check
    runs: Mapping[str, Measurement] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.check.ok


def judge(plan, outputs, operands: Operands) -> Check:
    """The dtype's verdict on outputs of plan, under the plan's own bound."""
    kc = plan.gemm.kc if isinstance(plan, CpuKernelPlan) and plan.gemm is not None else None
    return check(plan.spec, outputs, operands, winograd_m=getattr(plan, "winograd_m", 0) or 0, kc=kc)


def verify(built: Built, operands: Operands, *, repeat: int = 1, warmup: int = 0,
           cpu_ids: Optional[tuple[int, ...]] = None, timeout_s: float = RUN_TIMEOUT_S, env=(),
           entry_points=ENTRY_POINTS) -> Outcome:
    """Run each entry point (repeat > 1: timed as it runs) and judge every output. A guard zone that
    changed or an output never written is a VerificationError from the runner (the caller reports it)."""
    runs = {entry: run(built, operands, prepacked=entry == "pre-packed", repeat=repeat, warmup=warmup,
                       cpu_ids=cpu_ids, timeout_s=timeout_s, env=env)
            for entry in entry_points}
    return Outcome(built, merge_checks({entry: judge(built.plan, [m.output], operands) for entry, m in runs.items()}),
                   runs)


def verified_on(built: Built) -> str:
    """Where a kernel was verified, for reports."""
    return "host (native)" if built.host is not None else built.runner.where.split(" (emulated")[0]
