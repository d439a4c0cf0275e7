"""xfc: bottom-up, XFC-style synthesis of fast tensor-operator kernels for mobile SoCs.

Python API (the CLI is built on the same calls, through xfc.pipeline):
    import xfc
    hw = xfc.load_hardware("snapdragon.yaml")        # or "host", a bare name, a path
    spec = xfc.make_spec("conv2d", {"c": 64, "h": 56, "w": 56, "k": 64, "r": 3, "s": 3}, pad=1)
    result = xfc.synthesize(spec, hw)                 # pure, deterministic, well under a second
    print(result.explain())
    kernel = xfc.compile(spec, xfc.load_hardware("host"))   # synthesize + render + build
    out = kernel(x, w, bias)                          # on this machine: callable on numpy arrays
"""
from ._version import __version__
from .hardware.load import load as load_hardware
from .ops.spec import make_spec, parse_shape


def synthesize(spec, hw, **kwargs):
    """Synthesize a CPU kernel plan for spec on hw (see xfc.cpu.synth.synthesize_cpu)."""
    from .cpu.synth import synthesize_cpu
    return synthesize_cpu(spec, hw, **kwargs)


def compile(spec, hw, **kwargs):  # noqa: A001  (xfc.compile: the name the README documents)
    """Synthesize, render and build a CPU kernel -> xfc.Kernel (see xfc.pipeline.compile)."""
    from .pipeline import compile as _compile
    return _compile(spec, hw, **kwargs)


def __getattr__(name):
    if name == "Kernel":   # the pipeline (and numpy, the build) load only when asked for
        from .pipeline import Kernel
        return Kernel
    raise AttributeError(f"module 'xfc' has no attribute {name!r}")


__all__ = ["__version__", "load_hardware", "make_spec", "parse_shape", "synthesize", "compile", "Kernel"]
