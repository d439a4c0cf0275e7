"""xfc: bottom-up, XFC-style synthesis of fast tensor-operator kernels for mobile SoCs.

Python API (used by the CLI):
    import xfc
    hw = xfc.load_hardware("snapdragon.yaml")        # or "host", a bare name, a path
    spec = xfc.make_spec("conv2d", {"c": 64, "h": 56, "w": 56, "k": 64, "r": 3, "s": 3}, pad=1)
    result = xfc.synthesize(spec, hw)                 # pure, deterministic, well under a second
    print(result.explain())
"""
from ._version import __version__
from .hardware.load import load as load_hardware
from .ops.spec import make_spec, parse_shape


def synthesize(spec, hw, **kwargs):
    """Synthesize a CPU kernel plan for spec on hw (see xfc.cpu.synth.synthesize_cpu)."""
    from .cpu.synth import synthesize_cpu
    return synthesize_cpu(spec, hw, **kwargs)


__all__ = ["__version__", "load_hardware", "make_spec", "parse_shape", "synthesize"]
