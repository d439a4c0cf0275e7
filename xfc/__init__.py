"""xfc: bottom-up, XFC-style synthesis of fast tensor-operator kernels for mobile SoCs.

Python API (the CLI is built on the same calls, through xfc.pipeline):
    import xfc
    hw = xfc.load_hardware("snapdragon.yaml")        # or "host", a bare name, a path
    spec = xfc.make_spec("conv2d", {"c": 64, "h": 56, "w": 56, "k": 64, "r": 3, "s": 3}, pad=1)
    result = xfc.synthesize(spec, hw)                 # deterministic, milliseconds; tile_db="auto" as xfc synth
    print(result.explain())
    kernel = xfc.compile(spec, xfc.load_hardware("host"))   # synthesize + render + build
    out = kernel(x, w, bias)                          # on this machine: callable on numpy arrays
    net = xfc.compile_model("mobilenet.onnx", threads=1)   # the whole network, one C call per inference
    logits = net(image)
"""
from ._version import __version__
from .ops.spec import make_spec, parse_shape


def load_hardware(name, *, remeasure=False):
    """A hardware description: a shipped name, a file, or 'host' described as `xfc hw show host`
    describes it (measured by the host probe; see xfc.api)."""
    from .api import load_hardware as _load
    return _load(name, remeasure=remeasure)


def synthesize(spec, hw, **kwargs):
    """Plan a CPU kernel for spec on hw as `xfc synth` does, tile database included (xfc.api.synthesize:
    tile_db='auto' | PATH | 'off', cluster, threads, lowering)."""
    from .api import synthesize as _synthesize
    return _synthesize(spec, hw, **kwargs)


def compile(spec, hw, **kwargs):  # noqa: A001  (xfc.compile: the name the README documents)
    """Synthesize, render and build a CPU kernel -> xfc.Kernel (xfc.api.compile; the same options)."""
    from .api import compile as _compile
    return _compile(spec, hw, **kwargs)


def compile_model(model, hw="host", **kwargs):
    """A whole ONNX network (a file or an onnx.ModelProto) compiled for this machine -> a callable
    network, `net(x) -> y`, one C call per inference (xfc.api.compile_model; threads=, input_shapes=)."""
    from .api import compile_model as _compile_model
    return _compile_model(model, hw, **kwargs)


def __getattr__(name):
    if name == "Kernel":   # the pipeline (and numpy, the build) load only when asked for
        from .pipeline import Kernel
        return Kernel
    raise AttributeError(f"module 'xfc' has no attribute {name!r}")


__all__ = ["__version__", "load_hardware", "make_spec", "parse_shape", "synthesize", "compile", "compile_model",
           "Kernel"]
