#!/usr/bin/env python3
"""Predicted network time on every shipped SoC, per cluster, thread count and dtype (issue 33 item 5).

MobileNetV2 and ResNet-18 (benchmarks/nets.py, exported at run time; needs torch: `make bench-setup`)
are lowered as `xfc model --emit lib` lowers them, in fp32 and in fp16, and (quantized by onnxruntime's
quantize_static: QDQ, per-channel 7-bit weights, uint8 activations) in int8, and for every SoC description
in hardware_descriptions/soc/, every cluster, 1 thread and all its cores, and each dtype the
cluster's cores run (fp16: FP16 arithmetic; the Cortex-A53 has none), xfc.model.runtime.predict sums
the static cost model's prediction over the network's kernel calls. Nothing runs on a phone: these
are predictions, to compare SoCs and dtypes before owning the phones, and they leave out the runtime
ops (an fp16 network runs its residual Adds and activations as separate ops) and thread wake-ups.

    .venv/bin/python benchmarks/predict_socs.py [--only mobilenet_v2,resnet18]

writes benchmarks/results/predict_socs.json (with the machine) and predict_socs.md (the table).
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from machine import machine_facts
from nets import export, network_arguments, torch_missing

NETWORKS = ("mobilenet_v2", "resnet18")
TITLE = "# Predicted network kernel time per SoC, cluster, thread count and dtype (ms)"


def predict_all(path: Path, arch: str, quantized: Path) -> list[dict]:
    from xfc.api import load_hardware
    from xfc.hardware.load import SHIPPED_ROOT
    from xfc.model.load import load_model
    from xfc.model.runtime.predict import network_predictions
    from xfc.model.runtime.quantized_program import lower_quantized
    loaded = load_model(path)
    q_loaded = load_model(quantized)
    int8_program = lower_quantized(q_loaded, arch).program
    rows = []
    for soc in sorted((SHIPPED_ROOT / "soc").glob("*.yaml")):
        hw = load_hardware(soc.stem)
        for row in network_predictions(loaded, arch, hw) + network_predictions(q_loaded, arch, hw,
                                                                                 program=int8_program):
            rows.append({"network": arch, "soc": hw.name, **row})
    return rows


def table(rows: list[dict]) -> str:
    """One line per network, SoC and cluster: fp32, fp16 and int8 at 1 thread and on every core."""
    keys = sorted({(r["network"], r["soc"], r["cluster"], r["core"], r["cores"]) for r in rows},
                  key=lambda k: (k[0], k[1], ("prime", "big", "mid", "little").index(k[2])))
    by = {(r["network"], r["soc"], r["cluster"], r["dtype"], r["threads"]): r for r in rows}

    def cell(key, dtype, threads):
        r = by.get((*key[:3], dtype, threads))
        return "-" if r is None or r["predicted_ms"] is None else f"{r['predicted_ms']:.3g}"

    out = ["| network | SoC | cluster | fp32 1 thread | fp32 all cores | fp16 1 thread | fp16 all cores | "
           "int8 1 thread | int8 all cores |",
           "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for key in keys:
        net, soc, role, core, cores = key
        out.append(f"| {net} | {soc} | {role}: {cores}x {core} | {cell(key, 'fp32', 1)} | {cell(key, 'fp32', cores)} | "
                   f"{cell(key, 'fp16', 1)} | {cell(key, 'fp16', cores)} | {cell(key, 'int8', 1)} | "
                   f"{cell(key, 'int8', cores)} |")
    return "\n".join(out)


def main(argv=None) -> int:
    args = network_arguments(__doc__, NETWORKS, argv)
    if torch_missing("predict_socs", "make bench-setup"):
        return 3
    from xfc.model.runtime.predict import PREDICTION_WHAT
    from xfc.outputs import write_json_result, write_owned_file
    started = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory(prefix="xfc-predict-") as tmp:
        for arch in args.only:
            path = Path(tmp) / f"{arch}.onnx"
            print(f"[predict_socs] exporting {arch} (random weights) and predicting on every SoC", file=sys.stderr)
            export(arch, path, args.size)
            from xfc.model.quantized_peer import quantize_with_onnxruntime
            quantized = quantize_with_onnxruntime(path, Path(tmp) / f"{arch}_qdq.onnx", "qdq")
            rows += predict_all(path, arch, quantized)
    text = table(rows)
    doc = {"what": PREDICTION_WHAT, "networks": f"benchmarks/nets.py at {args.size}x{args.size}, random weights",
           "command": "benchmarks/predict_socs.py", "seconds": round(time.perf_counter() - started, 1),
           "machine": machine_facts(), "rows": rows}
    write_json_result(args.results / "predict_socs.json", doc, kind="predict-socs")
    md = (f"{TITLE}\n\n{PREDICTION_WHAT}.\n\n"
          f"Reproduce: `.venv/bin/python benchmarks/predict_socs.py` (needs torch: `make bench-setup`).\n\n{text}\n")
    # atomically, and only over a table this script wrote
    write_owned_file(args.results / "predict_socs.md", md, lambda existing: existing.read_text(errors="replace").startswith(TITLE))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
