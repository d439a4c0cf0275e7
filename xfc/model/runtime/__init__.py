"""The whole network in C: `xfc model NET.onnx --emit lib` (issue 32).

One concern per module, data flowing one way:

    fold.py     constant and shape arithmetic folded at load (Shape, Gather, Slice, Concat, Cast, ...)
    lower.py    the folded, mapped network -> a Program: xfc kernel steps (grouped convolutions
                included), runtime op steps and aliases; epilogue fusion (residual Add, activations);
                graph outputs routed into the caller's buffers; unsupported nodes -> one line, exit 2
    program.py  the Program (steps, tensors, aliases, constants)
    arena.py    the activation arena: lifetimes, in place, greedy by size / best fit; the lower bound
    emit.py     the C sources (templates/runtime/*.j2 and the kernels), the weights file, the library,
                the benchmark program, CMakeLists.txt, manifest.json
    execute.py  running the benchmark program: host, qemu-aarch64, a device (ADB)
    check.py    --verify: every step on its own C inputs, and the outputs against onnxruntime
    bench.py    --bench: the program against onnxruntime's whole session.run
    network.py  the `--emit lib` pipeline (xfc/model/pipeline.run_model delegates to it)
    report.py   the lines printed about the network
    api.py      xfc.compile_model: the network as a Python callable (a shared library, ctypes)
"""
