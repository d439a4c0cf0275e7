"""The workload suite used by tests and benchmarks (batch 1, fp32): name -> (op, shape, options)."""
from __future__ import annotations

from .spec import OperatorSpec, make_spec

SUITE = {
    "mm_512": ("matmul", dict(m=512, n=512, k=512), {}),
    "mm_1024": ("matmul", dict(m=1024, n=1024, k=1024), {}),
    "mm_bert": ("matmul", dict(m=128, n=3072, k=768), {}),
    "conv_r18_c1": ("conv2d", dict(c=3, h=224, w=224, k=64, r=7, s=7), dict(stride=2, pad=3)),
    "conv_r18_l1": ("conv2d", dict(c=64, h=56, w=56, k=64, r=3, s=3), dict(pad=1)),
    "conv_r18_l3": ("conv2d", dict(c=256, h=14, w=14, k=256, r=3, s=3), dict(pad=1)),
    "conv_pw": ("conv2d", dict(c=128, h=28, w=28, k=128, r=1, s=1), {}),
    "conv_s2": ("conv2d", dict(c=128, h=28, w=28, k=256, r=3, s=3), dict(stride=2, pad=1)),
    "dw_mbv2_s1": ("depthwise", dict(c=144, h=56, w=56, r=3, s=3), dict(pad=1)),
    "dw_mbv2_s2": ("depthwise", dict(c=96, h=112, w=112, r=3, s=3), dict(stride=2, pad=1)),
}

# The distinct depthwise layers of MobileNetV2 (torchvision, 224 x 224 input, batch 1): 3x3, pad 1,
# stride 1 or 2, channels 32..960 at 112..7 pixels (the benchmarks' `mbv2_dw` group, issue 33).
MOBILENETV2_DEPTHWISE = {
    f"dw_mbv2_c{c}_{hw}_s{stride}": ("depthwise", dict(c=c, h=hw, w=hw, r=3, s=3), dict(stride=stride, pad=1))
    for c, hw, stride in [(32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1), (192, 28, 2),
                          (384, 14, 1), (576, 14, 1), (576, 14, 2), (960, 7, 1)]
}


def suite_spec(name: str, **epilogue) -> OperatorSpec:
    """The named workload as a spec; epilogue: bias=..., activation=..."""
    op, shape, options = SUITE[name]
    return make_spec(op, shape, **options, **epilogue)
