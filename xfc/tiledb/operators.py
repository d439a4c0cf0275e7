"""Operator-level rows: (fingerprint, operator key, cluster, threads) -> chosen plan, predicted
and measured time, so that a warm `synth` can be a lookup.

  plan_json(plan)                the plan's decisions as canonical JSON (what a lookup returns)
  StaticDbEvaluator.measure_operator (evaluators.py)   the plan the static synthesizer picks and
                                 its predicted time ('static')
  HostOperatorEvaluator          the same plan built with the host gcc, checked against numpy
                                 once, then timed ('host')
  DeviceEvaluator.measure_operator (device.py)   the same plan cross-built and timed on an adb device
  best_operator(db, ...)         the row that answers a lookup: measured > static, as for tiles;
                                 emulated rows never answer

The workloads are the suite of xfc.ops.workloads (batch 1, fp32), at 1 thread and at every core of
the cluster.
"""
from __future__ import annotations

import statistics
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..errors import VerificationError
from ..hardware.model import CpuCluster, HardwareDescription
from ..cpu.synth import synthesize_cpu
from . import hostcc
from .records import OperatorRow, canonical_json
from .store import TileDb


@dataclass(frozen=True)
class OperatorResult:
    plan: str                     # canonical JSON (plan_json)
    predicted_s: Optional[float]
    measured_s: Optional[float]
    gflops: Optional[float]
    repeats: int
    spread: float
    conditions: dict = field(default_factory=dict)
    compiler: str = ""


def plan_json(plan) -> str:
    """The decisions of a CpuKernelPlan a lookup needs (ISA, lowering, the schedule's tile fields) as
    canonical JSON; the code-shape fields follow from them (xfc.cpu.decide)."""
    out = {"isa": plan.isa, "lowering": plan.lowering, "vector_lanes": plan.vector_lanes}
    for name in ("gemm", "depthwise"):
        sched = getattr(plan, name)
        if sched is not None:
            out[name] = sched.tiles()
    return canonical_json(out)


def static_operator(hw: HardwareDescription, cluster: CpuCluster, spec, threads: int) -> OperatorResult:
    result = synthesize_cpu(spec, hw, cluster.role, threads)
    est = result.estimate
    return OperatorResult(plan=plan_json(result.plan), predicted_s=est.predicted_s, measured_s=None,
                          gflops=est.predicted_gflops, repeats=1, spread=0.0)


class HostOperatorEvaluator:
    """Builds the statically synthesized plan on this machine, checks it once against the numpy
    reference (VerificationError otherwise), and times it (median of the repeats)."""

    source = "host"

    def __init__(self, repeats: int = 7, work_dir: Optional[Path] = None):
        self.repeats = repeats
        self.work_dir = work_dir
        self._timing = threading.Lock()

    def measure_operator(self, hw: HardwareDescription, cluster: CpuCluster, spec, threads: int) -> OperatorResult:
        from ..ops.dtypes import FP32, make_operands
        from ..pipeline import stages
        result = synthesize_cpu(spec, hw, cluster.role, threads)
        with tempfile.TemporaryDirectory(prefix="xfc-tiledb-op-", dir=self.work_dir) as tmp:
            built = stages.realize(result.plan, Path(tmp))
            operands = make_operands(spec, FP32, seed=0)
            outcome = stages.verify(built, operands)
            if not outcome.ok:
                raise VerificationError(f"{spec.describe()}: the synthesized kernel differs from the reference "
                                        f"({outcome.check.reason}); not timed")
            with self._timing:
                before = hostcc.snapshot()
                timing = stages.run(built, operands, prepacked=False, repeat=self.repeats, warmup=3)
                after = hostcc.snapshot()
        samples = timing.samples_s
        median = statistics.median(samples)
        conditions = {**hostcc.conditions(before, after), "threads": threads, "value": "median of repeats"}
        return OperatorResult(plan=plan_json(result.plan), predicted_s=result.estimate.predicted_s,
                              measured_s=median, gflops=spec.flops / median / 1e9, repeats=len(samples),
                              spread=(max(samples) - min(samples)) / median, conditions=conditions,
                              compiler=hostcc.compiler_version())


def best_operator(db: TileDb, fingerprint: str, op_key: str, cluster: str, threads: int) -> Optional[OperatorRow]:
    """The row a warm synthesis would use: the highest-ranked source, then the fastest measured
    (or predicted) time, then a stable order. Emulated rows (a virtual device's) never answer."""
    rows = [r for r in db.rows("operator", "fingerprint = ? AND op_key = ? AND cluster = ? AND threads = ?",
                               (fingerprint, op_key, cluster, threads)) if r.rank >= 0]
    if not rows:
        return None
    return min(rows, key=lambda r: (-r.rank, r.measured_s or r.predicted_s or 0.0, r.source, r.origin))
