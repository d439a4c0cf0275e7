"""`xfc bench`: a CPU kernel for an ARM description, timed on a device or under QEMU through the
chain (stages.py): synthesize -> cross-build a static aarch64 harness (in a private temporary
directory) -> run both entry points pinned to the cluster's CPUs through `runner` (ADB, the virtual
device; default: local qemu-aarch64) -> verify each against the float64 reference."""
from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Optional

from ..errors import VerificationError
from ..ops.dtypes import FP32, make_operands
from . import stages
from .report import Report, measurement_dict, report_core
from .synth import synthesize_timed


def run_bench(spec, hw, runner=None, *, cluster=None, threads=None, repeat=10, warmup=2, timeout_s=300.0, seed=0,
              progress=None, device: str = "qemu", device_identity: Optional[dict] = None) -> Report:
    """Returns the Report (measurement: the pre-packed entry point's device run, as `xfc synth`
    reports it; measurement_packing_per_call: the weights packed inside every call; failure: why an
    output is wrong, if one is); device_identity: what the caller read from the device (recorded as
    is). The caller decides on the verdict."""
    say = progress or (lambda msg: None)
    result, synth_s = synthesize_timed(spec, hw, cluster, threads)
    cluster = result.cluster
    say(f"synthesized in {synth_s * 1e3:.1f} ms for the {cluster.role} cluster ({cluster.count}x {cluster.core.name})")
    with tempfile.TemporaryDirectory(prefix="xfc-bench-") as tmp:
        built = stages.realize(result.plan, Path(tmp), runner=runner)
        say(f"built {built.artifact.name} in {built.build_seconds:.2f} s; running on {device} ...")
        try:
            outcome = stages.verify(built, make_operands(spec, FP32, seed=seed), repeat=repeat, warmup=warmup,
                                    cpu_ids=tuple(cluster.cpu_ids), timeout_s=timeout_s)
        except VerificationError as exc:   # a guard zone: reported like a wrong result
            outcome, failure = None, str(exc)
    runs = outcome.runs if outcome is not None else {}
    timing, per_call = runs.get("pre-packed"), runs.get("per-call")
    ok = outcome is not None and outcome.ok
    failure = None if ok else (outcome.check.reason if outcome is not None else failure)
    report = {
        **report_core("bench", "cpu", spec, hw.name, result.report().get("tiles"), result.estimate.predicted_gflops),
        "verified": bool(ok), "failure": failure,
        "max_abs_error": outcome.check.report.get("max_abs_error") if outcome else None,
        "error_to_bound_ratio": outcome.check.report.get("error_to_bound_ratio") if outcome else None,
        "measurement": measurement_dict(timing, "pre-packed once (untimed)") if timing else None,
        "measurement_packing_per_call": measurement_dict(per_call, "packed inside every call") if per_call else None,
        "cluster": cluster.role, "cpu_ids": list(cluster.cpu_ids), "synthesis_seconds": synth_s,
        "build_seconds": built.build_seconds, "gflops": timing.gflops if timing else None,
        "prediction_note": "static cost model, not a measurement", "device_identity": device_identity,
    }
    rep = Report.of("bench", report, hardware=hw.name, measurement=timing, per_call=per_call)
    return rep if ok else replace(rep, failure=failure)
