"""The recorded machine the calibration tests fit to, and 'measurements' that are the cost model's
own predictions under known constants (so a fit can be checked to recover them exactly)."""
from __future__ import annotations

from dataclasses import replace

from xfc.cpu.synth import synthesize_cpu
from xfc.hardware.host import X86_64_V4_FLAGS, HostMeasurement, describe_host
from xfc.tiledb.calibrate import Measured, predicted_s

FACTS = {"flags": set(X86_64_V4_FLAGS), "model name": "Recorded CPU", "cpu MHz": "3000.000"}
HW = describe_host(FACTS, {"L3": {"size_kib": 32768, "line_bytes": 64, "ways": 16, "shared_by_cores": 2}}, 2,
                   "x86_64", measured=HostMeasurement(3.0, ((256, 2.0), (512, 1.0)), 4.0, "2026-01-01T00:00:00Z", True))
CLUSTER = HW.cluster()


def synthetic_items(cases, truth, threads=(1, 2), winograd_vectors="tiles") -> list[Measured]:
    """'Measurements' of `cases` (TrainingCases) at each thread count: the plan each synthesizes,
    timed as the model predicts it under the constants `truth`. winograd_vectors: the Winograd
    plans' vector axis (default over tiles: the plans these objective tests were designed around;
    None: the synthesizer's choice)."""
    items = []
    for case in cases:
        for t in threads:
            plan = synthesize_cpu(case.spec, HW, CLUSTER.role, t, lowering=case.lowering,
                                  winograd_m=case.winograd_m,
                                  winograd_vectors=winograd_vectors if case.lowering == "winograd" else None).plan
            item = Measured(spec=case.spec, threads=t, plan=plan, measured_s=1.0, spread=0.0)
            items.append(replace(item, measured_s=predicted_s(item, HW, CLUSTER, truth)))
    return items
