"""Predicted time of a lowered network's kernels on every cluster of a description (issue 33 item 5).

For each cluster of the description, each thread count in (1, every core of the cluster) and each
dtype the cluster runs (fp32; fp16 where its cores have FP16 arithmetic, xfc.cpu.config), every
distinct kernel of the network is synthesized for that cluster and thread count (pure, milliseconds)
and its cost-model prediction is added once per call (a grouped convolution calls its kernel per
group and batch item). What is predicted is the kernels' time: the runtime ops (pooling, a residual
Add or an activation left unfused, casts) are not modelled, and neither is the time to wake threads
between steps. A prediction, never a measurement: the report says which.
"""
from __future__ import annotations

from typing import Optional

from ...errors import OperatorError
from ...ops.dtypes import FP32, DType

PREDICTION_WHAT = ("the network's kernel calls summed, each synthesized for the cluster and thread count and "
                   "predicted by xfc's static cost model; runtime ops and thread wake-ups not included; not a "
                   "measurement")


def dtypes_for(cluster, target_arch: str, asked: Optional[DType] = None) -> list[str]:
    """The dtypes whose network kernels this cluster runs: fp32 always, fp16 with FP16 arithmetic,
    int8 always (a quantized model: its program is int8 only)."""
    from ...cpu.config import fp16_refusal
    names = ["fp32"] if fp16_refusal(cluster.core, target_arch, cluster.role) else ["fp32", "fp16"]
    return [n for n in names + ["int8"] if asked is None or n == asked.name]


def predict_kernels(program, hw, cluster_role: str, threads: int, dtype: str) -> float:
    """Seconds of the program's kernel calls on one cluster at one thread count (static cost model;
    int8: the int8 planners' issue models)."""
    from ..backend import synthesize_layer
    from .program import spec_of
    seconds = {}
    for key in program.distinct_kernels():
        seconds[key] = synthesize_layer(spec_of(key), hw, cluster=cluster_role, threads=threads, dtype=dtype,
                                        quant=key[1] if isinstance(key, tuple) else None).predicted_s
    return sum(seconds[step.kernel_key] * step.groups * step.batch for step in program.kernel_steps)


def predict_network(lowered_by_dtype, hw) -> list[dict]:
    """Rows {cluster, core, cores, threads, dtype, predicted_ms} for every cluster of hw, thread count
    1 and all its cores, and each dtype in lowered_by_dtype (name -> Program) the cluster runs."""
    rows = []
    for cluster in hw.clusters:
        for dtype in dtypes_for(cluster, hw.target_arch):
            program = lowered_by_dtype.get(dtype)
            if program is None:
                continue
            for threads in sorted({1, cluster.count}):
                try:
                    ms = predict_kernels(program, hw, cluster.role, threads, dtype) * 1e3
                except OperatorError as exc:   # a kernel this cluster cannot build: said, not hidden
                    rows.append({"cluster": cluster.role, "core": cluster.core.name, "cores": cluster.count,
                                 "threads": threads, "dtype": dtype, "predicted_ms": None, "refused": str(exc)})
                    continue
                rows.append({"cluster": cluster.role, "core": cluster.core.name, "cores": cluster.count,
                             "threads": threads, "dtype": dtype, "predicted_ms": float(f"{ms:.5g}")})
    return rows


def network_predictions(loaded, name: str, hw, dtype: DType = FP32, program=None) -> list[dict]:
    """predict_network for a loaded model: lowered once per dtype the description's clusters run
    (dtype: the one the library is built for comes first; both fp32 and fp16 are predicted where
    the cores have FP16 arithmetic). program: the model already lowered for dtype (not lowered again)."""
    from .lower import lower_network
    from ...ops.dtypes import dtype_named
    if program is not None and program.dtype.name == "int8":      # a quantized model runs in int8 only
        return predict_network({"int8": program}, hw)
    wanted = {d for c in hw.clusters for d in dtypes_for(c, hw.target_arch)} - {"int8"}
    lowered = {d: program if program is not None and d == dtype.name else
               lower_network(loaded, name, dtype=dtype_named(d)).program for d in sorted(wanted)}
    rows = predict_network(lowered, hw)
    return sorted(rows, key=lambda r: (r["dtype"] != dtype.name, r["dtype"]))
