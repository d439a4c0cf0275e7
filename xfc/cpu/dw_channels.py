"""Geometry of the int8 depthwise 'channels' layout (templates/cpu/int8_depthwise.c.j2): 16 channels in
the lanes, a quad plane Q whose entries hold 4 adjacent input columns of each channel. Shared by the
x86 planner (int8_synth), the AArch64 one (int8_arm) and int8_codegen, none of which imports another
for it."""
from __future__ import annotations

import math

from ..ops.spec import DepthwiseSpec


def channels_q_step(spec: DepthwiseSpec) -> int:
    """Input columns between two columns of the 'channels' layout's quad plane Q: the stride where it
    divides 4 (then every quad an output reads, at ow x stride + 4q, starts on a multiple of it, and
    the columns in between are never read), else 1."""
    return spec.stride_w if 4 % spec.stride_w == 0 else 1


def channels_q_columns(spec: DepthwiseSpec) -> int:
    """Columns of Q: the quads at input columns j x step - pad_left up to the last an output reads."""
    last = (spec.out_w - 1) * spec.stride_w + 4 * (math.ceil(spec.s / 4) - 1)
    return last // channels_q_step(spec) + 1
