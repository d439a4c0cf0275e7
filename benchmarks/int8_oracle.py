#!/usr/bin/env python3
"""xfc's int8 oracle (xfc/model/quantized.py) against onnxruntime on quantized MobileNetV2 and ResNet-18.

Each network (benchmarks/nets.py, random weights, exported at run time; needs torch: `make
bench-setup`) is quantized with onnxruntime.quantization.quantize_static (pre-processing, per-channel
int8 weights, uint8 activations, 4 random calibration inputs) in both formats (QDQ, QOperator) and
with 7-bit (reduce_range) and 8-bit weights. Every quantized tensor a step writes is compared with
onnxruntime's (optimized session, and for QDQ also with graph optimizations off: the graph computed
as written, in fp32), in steps of its quantization: the share equal, the largest difference, the
first step that differs, and the graph output's largest difference.

    .venv/bin/python benchmarks/int8_oracle.py [--only mobilenet_v2,resnet18]

writes benchmarks/results/int8_oracle.json (with the machine). Correctness figures, not timings.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

from machine import machine_facts
from nets import export, network_arguments, torch_missing

NETWORKS = ("mobilenet_v2", "resnet18")


def compare(network, ours: dict, theirs: dict, output: str) -> dict:
    from xfc.model.quantized import lsb_differences
    compared = equal = worst = 0
    first = None
    for step in network.steps:
        name = step.outputs[0]
        if name not in network.tensors or name not in theirs or name not in ours:
            continue
        diff = np.abs(np.asarray(ours[name], np.int64).reshape(-1) - np.asarray(theirs[name], np.int64).reshape(-1))
        compared += diff.size
        equal += int(np.count_nonzero(diff == 0))
        worst = max(worst, int(diff.max(initial=0)))
        if first is None and diff.any():
            first = f"{step.kind} '{step.name}': {int(np.count_nonzero(diff))} of {diff.size} differ, up to {int(diff.max())}"
    lsb = lsb_differences(network, ours, theirs, output)
    return {"quantized_values_compared": compared, "share_equal": round(equal / compared, 6) if compared else None,
            "largest_difference_lsb": worst, "first_difference": first,
            "output_largest_difference_lsb": round(float(lsb.max()), 4),
            "output_share_within_1_lsb": round(float(np.mean(lsb <= 1 + 1e-6)), 6)}


def main(argv=None) -> int:
    args = network_arguments(__doc__, NETWORKS, argv)
    if torch_missing("int8_oracle", "make bench-setup"):
        return 3
    import onnxruntime
    from xfc.model import quantized as Q
    from xfc.model.load import load_model
    from xfc.model.quantized_peer import onnxruntime_step_values, quantize_with_onnxruntime
    from xfc.outputs import write_json_result
    rows = []
    with tempfile.TemporaryDirectory(prefix="xfc-int8-oracle-") as tmp:
        for arch in args.only:
            src = Path(tmp) / f"{arch}.onnx"
            export(arch, src, args.size)
            for fmt in ("qdq", "qoperator"):
                for reduce_range in (True, False):
                    path = Path(tmp) / f"{arch}_{fmt}_{'7' if reduce_range else '8'}bit.onnx"
                    print(f"[int8_oracle] {path.name}", file=sys.stderr, flush=True)
                    quantize_with_onnxruntime(src, path, fmt, reduce_range=reduce_range)
                    loaded = load_model(path)
                    network = Q.recognise(loaded)
                    name, shape, _ = loaded.inputs[0]
                    feeds = {name: np.random.default_rng(1).standard_normal(shape).astype(np.float32)}
                    ours = Q.run(network, feeds)
                    row = {"network": arch, "format": fmt, "weight_bits": 7 if reduce_range else 8,
                           "steps": dict(network.counts()),
                           "onnxruntime_optimized": compare(network, ours, onnxruntime_step_values(path, network, feeds, True),
                                                            loaded.outputs[0])}
                    if fmt == "qdq":
                        row["onnxruntime_as_written"] = compare(network, ours,
                                                                onnxruntime_step_values(path, network, feeds, False),
                                                                loaded.outputs[0])
                    rows.append(row)
                    print(f"  {row}", file=sys.stderr, flush=True)
    doc = {"what": "xfc's int8 oracle (exact integer arithmetic, xfc/model/quantized.py) against onnxruntime on the "
                   "same quantized models and inputs; quantized tensors compared in steps of their quantization",
           "command": "benchmarks/int8_oracle.py", "onnxruntime": onnxruntime.__version__,
           "networks": f"benchmarks/nets.py at {args.size}x{args.size}, random weights", "machine": machine_facts(),
           "rows": rows}
    write_json_result(args.results / "int8_oracle.json", doc, kind="int8-oracle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
