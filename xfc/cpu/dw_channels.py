"""Geometry of the int8 depthwise 'channels' layout (templates/cpu/int8_depthwise.c.j2): groups of 16
channels in the lanes, a quad plane Q whose entries hold 4 adjacent input columns of each channel, a
transposed input T and output O. Shared by the x86 planner (int8_synth), the AArch64 one (int8_arm)
and int8_codegen, so that the buffers the planners judge are the ones the kernels allocate."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..ops.spec import DepthwiseSpec

CHANNEL_GROUP = 16      # channels per group: one byte each in T and O, one 4-byte lane of a Q entry
Q_ENTRY_BYTES = 4 * CHANNEL_GROUP


def channels_q_step(spec: DepthwiseSpec) -> int:
    """Input columns between two columns of the 'channels' layout's quad plane Q: the stride where it
    divides 4 (then every quad an output reads, at ow x stride + 4q, starts on a multiple of it, and
    the columns in between are never read), else 1."""
    return spec.stride_w if 4 % spec.stride_w == 0 else 1


def channels_q_columns(spec: DepthwiseSpec) -> int:
    """Columns of Q: the quads at input columns j x step - pad_left up to the last an output reads."""
    last = (spec.out_w - 1) * spec.stride_w + 4 * (math.ceil(spec.s / 4) - 1)
    return last // channels_q_step(spec) + 1


def channels_q_rows(spec: DepthwiseSpec) -> int:
    """Rows of Q: input rows -pad_top up to the last an output reads."""
    return (spec.out_h - 1) * spec.stride_h + (spec.r - 1) * spec.dilation_h + 1


@dataclass(frozen=True)
class ChannelsBuffers:
    """One thread's buffers for one group of channels, in pixels of CHANNEL_GROUP bytes (Q: entries of
    Q_ENTRY_BYTES). x86 keeps T flat (the plane's pixels in order, read 64 bytes at a time, padding
    masked when Q is built) and moves 64 pixels per transpose; AArch64 keeps T as the padded plane
    (its padding the zero point, so Q needs no masks) and moves 16."""
    q_rows: int
    q_cols: int
    chunk_pixels: int          # pixels per transpose in and out: 64 (x86) or 16 (AArch64)
    in_chunks: int
    out_chunks: int
    t_rows: int                # AArch64: rows of the padded T; x86: 0 (T flat)
    t_cols: int                # AArch64: columns of the padded T; x86: 0
    t_pre: int                 # x86: pixels of T before pixel 0 (the left padding's reads); AArch64: 0
    t_pixels: int              # pixels of T

    @property
    def bytes(self) -> int:
        return (self.t_pixels + self.out_chunks * self.chunk_pixels) * CHANNEL_GROUP + \
            self.q_rows * self.q_cols * Q_ENTRY_BYTES


def channels_buffers(spec: DepthwiseSpec, aarch64: bool) -> ChannelsBuffers:
    """The layout's per-thread buffers for spec (x86 or AArch64, see ChannelsBuffers)."""
    q_rows, q_cols, step = channels_q_rows(spec), channels_q_columns(spec), channels_q_step(spec)
    chunk = 16 if aarch64 else 64
    in_chunks, out_chunks = math.ceil(spec.h * spec.w / chunk), math.ceil(spec.out_h * spec.out_w / chunk)
    if aarch64:
        # every input row written, every quad read (up to column (q_cols - 1) x step + 3)
        t_rows = max(q_rows, spec.pad_top + spec.h)
        t_cols = max(spec.pad_left + spec.w, (q_cols - 1) * step + 4)
        return ChannelsBuffers(q_rows, q_cols, chunk, in_chunks, out_chunks, t_rows, t_cols, 0, t_rows * t_cols)
    # the whole chunks the transpose stores, and the last quad's 64-byte read: from pixel
    # (h - 1) x w - pad_left + (q_cols - 1) x step, 4 pixels (one pixel of slack past it)
    t_pre = spec.pad_left
    last_read = (spec.h - 1) * spec.w - spec.pad_left + (q_cols - 1) * step + 4
    return ChannelsBuffers(q_rows, q_cols, chunk, in_chunks, out_chunks, 0, 0, t_pre,
                           t_pre + max(in_chunks * chunk, last_read) + 1)
