"""`xfc model NET.onnx`: synthesize xfc kernels for every layer of an ONNX network it can cover.

One concern per module, data flowing one way:

    load.py      read and check the model (onnx), fix dynamic input shapes, infer shapes -> LoadedModel
    mapping.py   ONNX nodes -> xfc layers (OperatorSpec + how to feed it, fused epilogues, folded
                 BatchNormalization) or the reason a node is not covered     -> MappedNetwork (graph.py)
    coverage.py  FLOPs per node, covered share, uncovered nodes grouped by op type
    backend.py   THE SEAM to xfc's kernel pipeline: synthesize one layer, build one layer's kernel
    bounds.py    per-node error rules (how a rounding-error bound propagates through a node)
    run.py       --verify on the host: run the network with xfc kernels + onnx.reference, compare
                 with onnxruntime under the propagated bound
    report.py    the report (JSON) and its table
    pipeline.py  load -> map -> synthesize -> build -> verify -> report, into an OutputDir
    cli.py       the `xfc model` sub-command

Only backend.py knows how a kernel is synthesized, rendered and built; pointing it at another
pipeline changes that module only.
"""
from __future__ import annotations
