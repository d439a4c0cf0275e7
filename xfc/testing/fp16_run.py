"""One fp16 CPU kernel, end to end, for tests and the sweep: the chain of xfc.pipeline.stages
(plan, render, build static for AArch64, run both entry points under qemu-aarch64 with the core's
-cpu model, judge each output under the derived fp16 bound of xfc/ops/fp16.py), without an output
directory, with caller-chosen inputs and an optional test mutant, as a row for the sweep.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from ..ops.dtypes import FP16, make_operands
from ..ops.fp16 import Fp16Bound
from ..pipeline import stages
from ..pipeline.synth import plan_cpu

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
    """Build and run spec's fp16 kernel for hw under qemu through the chain (xfc.pipeline.stages);
    inputs (a, b, bias) default to make_inputs(spec, seed); they are rounded to fp16 (the kernel's
    and the reference's values). mutant: a deliberately wrong kernel (xfc/cpu/mutants.py, tests only)."""
    from .mutants import mutate
    synthesis, _ = plan_cpu(spec, hw, FP16, cluster=cluster, threads=threads)
    plan = synthesis.plan
    fault = (lambda rendered: mutate(rendered, mutant)) if mutant else None
    built = stages.realize(plan, work, fault=fault)
    operands = make_operands(spec, FP16, seed=seed, arrays=inputs)
    outcome = stages.verify(built, operands, timeout_s=RUN_TIMEOUT_S)
    outs = tuple(m.output for m in outcome.runs.values())
    result = outcome.check
    equal = bool(np.array_equal(outs[0], outs[1], equal_nan=True))
    bound = _bound(spec, plan, operands)      # the bound the outputs were judged under (for the sweep's row)
    return Fp16Case(spec_text=spec.describe(), plan_summary=plan_summary(plan), qemu_cpu=built.runner.cpu,
                    ok=result.ok and equal, entry_points_equal=equal,
                    max_abs_error=result.report["max_abs_error"], error_to_bound_ratio=result.worst_ratio,
                    failure=result.reason + ("" if equal else "; the two entry points disagree"),
                    bound=bound, outputs=outs)


def _bound(spec, plan, operands) -> Fp16Bound:
    from ..ops.fp16 import fp16_bound
    a, b, bias = operands.arrays
    return fp16_bound(spec, a, b, bias, plan.gemm.kc if plan.gemm is not None else None)
