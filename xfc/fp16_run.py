"""One fp16 CPU kernel, end to end, for tests and the sweep: synthesize (xfc/cpu/fp16.py), render,
build (aarch64-linux-gnu-gcc -static), run both entry points under qemu-aarch64 with the core's
-cpu model, and judge each output under the derived fp16 bound (xfc/ops/fp16.py).

`xfc synth --dtype fp16` goes through xfc.pipeline.run_cpu instead (outputs, reports); this is
the same chain without an output directory, with caller-chosen inputs and an optional test mutant.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from .build.cpu import build_arm
from .cpu.codegen import render_cpu_kernel
from .cpu.fp16 import synthesize_fp16
from .ops.fp16 import Fp16Bound, check_fp16_output, to_fp16_values
from .ops.reference import make_inputs
from .runners.base import RunSpec
from .runners.qemu import QemuRunner, qemu_cpu_models

RUN_TIMEOUT_S = 900


@dataclass(frozen=True)
class Fp16Case:
    """The outcome of one kernel: the verdict of each entry point (per call, pre-packed)."""

    spec_text: str
    plan_summary: dict
    qemu_cpu: str
    ok: bool
    entry_points_equal: bool
    max_abs_error: float
    error_to_bound_ratio: float
    failure: str
    bound: Fp16Bound
    outputs: tuple[np.ndarray, np.ndarray]

    def as_row(self) -> dict:
        return {"spec": self.spec_text, **self.plan_summary, "qemu_cpu": self.qemu_cpu, "ok": self.ok,
                "entry_points_equal": self.entry_points_equal, "max_abs_error": self.max_abs_error,
                "error_to_bound_ratio": self.error_to_bound_ratio, "failure": self.failure,
                "bound_kind": self.bound.kind, "kc": self.bound.kc,
                "classical_vacuous": not self.bound.classical_gamma < 1.0}


def plan_summary(plan) -> dict:
    sched = plan.schedule
    return {"lowering": plan.lowering, "lanes": plan.vector_lanes, "isa": plan.isa, "tiles": sched.tiles(),
            "ukernel": sched.ukernel}


def run_fp16_case(spec, hw, work: Path, *, cluster: Optional[str] = None, threads: Optional[int] = None,
                  seed: int = 0, inputs=None, mutant: Optional[str] = None) -> Fp16Case:
    """Build and run spec's fp16 kernel for hw under qemu; inputs (a, b, bias) default to
    make_inputs(spec, seed); they are rounded to fp16 (the kernel's and the reference's values)."""
    result = synthesize_fp16(spec, hw, cluster, threads)
    plan = result.plan
    rendered = render_cpu_kernel(plan)
    if mutant:   # TEST-ONLY: a deliberately wrong kernel (xfc/cpu/mutants.py)
        from .cpu.mutants import mutate
        rendered = mutate(rendered, mutant)
    binary = build_arm(rendered, work)
    a, b, bias = to_fp16_values(*(inputs if inputs is not None else make_inputs(spec, seed)))
    cpu = plan.qemu_cpu if plan.qemu_cpu in qemu_cpu_models() else "max"
    runner = QemuRunner(cpu=cpu)
    outs = tuple(runner.execute(RunSpec(harness=binary, inputs=(a, b, bias), repeat=1, warmup=0,
                                        timeout_s=RUN_TIMEOUT_S, output_shape=tuple(spec.output_shape),
                                        protocol="times-file", prepacked=prepacked, march=plan.gcc_march,
                                        input_shapes=tuple(tuple(s) for s in spec.operand_shapes))).output
                 for prepacked in (False, True))
    kc = plan.gemm.kc if plan.gemm is not None else None
    checked = [check_fp16_output(spec, out, a, b, bias, kc) for out in outs]
    verdicts = [v for v, _ in checked]
    equal = bool(np.array_equal(outs[0], outs[1], equal_nan=True))
    return Fp16Case(spec_text=spec.describe(), plan_summary=plan_summary(plan), qemu_cpu=cpu,
                    ok=all(v.ok for v in verdicts) and equal, entry_points_equal=equal,
                    max_abs_error=max(v.max_abs_error for v in verdicts),
                    error_to_bound_ratio=max(v.worst_ratio for v in verdicts),
                    failure="; ".join(dict.fromkeys(v.reason for v in verdicts if not v.ok))
                    + ("" if equal else "; the two entry points disagree"),
                    bound=checked[0][1], outputs=outs)
