"""`xfc model NET.onnx`: synthesize xfc kernels for every layer of an ONNX network it can cover.

One concern per module, data flowing one way:

    load.py      read and check the model (onnx), fix dynamic input shapes, infer shapes -> LoadedModel
    mapping.py   ONNX nodes -> xfc layers (OperatorSpec + how to feed it, fused epilogues, folded
                 BatchNormalization) or the reason a node is not covered     -> MappedNetwork (graph.py)
    coverage.py  FLOPs per node, covered share, uncovered nodes grouped by op type
    backend.py   THE SEAM to xfc's kernel pipeline: synthesize one layer (CPU or GPU), build it, run
                 it (host ctypes; qemu-aarch64 or ADB through xfc.runners; PoCL), time it
    bounds.py    per-node error rules (how a rounding-error bound propagates through a node)
    run.py       --verify: run the network with xfc kernels + onnx.reference, compare with
                 onnxruntime under the propagated bound
    bench.py     --bench: time the layers; on the host, match onnxruntime's profiled nodes to them
    library.py   the toolchain per ABI and the C names of --emit lib
    runtime/     --emit lib: the whole network in C (lowering, arena, C runtime, benchmark program,
                 --verify / --bench of the network; see runtime/__init__.py)
    report.py    the report (JSON) and its table
    pipeline.py  load -> map -> synthesize -> build -> verify -> bench -> [library] -> report, into an OutputDir
    xfc/cli/model.py   the `xfc model` sub-command

Only backend.py knows how a kernel is synthesized, rendered, built and run (library.py renders
and compiles the library's objects itself, with the same renderer); pointing them at another
pipeline changes those modules only.
"""
from __future__ import annotations
