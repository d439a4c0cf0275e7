"""Guard zones and a never-written pre-fill around the buffers a kernel is given (host side, numpy).

A kernel that writes outside its output, or leaves part of it unwritten, must not pass because
the bytes around or under the output happened to hold the right values. So every buffer a host
kernel sees (inputs, output, pre-packed weights) is the interior of a larger allocation:

    [ guard: g words of GUARD_BITS ][ interior: n elements ][ guard: g words of GUARD_BITS ]

- Float outputs and pre-packed weights start as PREFILL_BITS (a quiet NaN): any element the kernel
  does not write stays NaN and fails the finiteness check of the verdict. Integer outputs (int8
  kernels) have no such value: they start as a caller-chosen byte, and the caller runs the kernel
  twice with two different bytes (xfc.runners.host: an element that differs was never written).
- Guards hold GUARD_BITS (a signalling-NaN bit pattern no arithmetic produces) in every 32-bit
  word; after every call each guard is compared bit for bit, and a change names the buffer and
  the side.
- Inputs are copied into the interior, so a float kernel that reads past an input reads NaN,
  which reaches the output if the value is used.

Sizes are counted in 32-bit words ("floats" in messages, as in the C harness of
templates/cpu/harness.c.j2, which uses the same constants and guard size); a buffer of another
element type gets the guard of the words it spans. Reads and writes beyond the guard zones, and
inside scratch the kernel allocates itself, are the sanitizer target's job (`make sanitize`).
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import VerificationError

GUARD_BITS = 0x7FA5A5A5      # signalling NaN with a recognisable payload
PREFILL_BITS = 0x7FC0DEAD    # quiet NaN: "never written"
PADDING_BYTE = 0xA5          # the bytes between a non-word-sized interior and its guard
GUARD_MIN_FLOATS = 64
GUARD_MAX_FLOATS = 1 << 16


def guard_floats(n: int) -> int:
    """Guard size for a buffer of n floats: as large as the buffer (a stray row or tile of an
    output lands inside it), at least 64 and at most 65536 floats, a multiple of 16 (keeps the
    interior 64-byte aligned relative to the allocation). Same formula as XFC_GUARD_FLOATS in C."""
    g = max(GUARD_MIN_FLOATS, min(int(n), GUARD_MAX_FLOATS))
    return (g + 15) // 16 * 16


class GuardedBuffer:
    """n elements of dtype (default float32) with guard zones on both sides. `.data` is the interior.
    fill: the interior's values; else a float buffer starts as the never-written NaN and any
    other type as the byte `prefill`."""

    def __init__(self, n: int, name: str, fill=None, dtype=np.float32, prefill: int = 0):
        self.n, self.name, self.dtype = int(n), name, np.dtype(dtype)
        self._words = math.ceil(self.n * self.dtype.itemsize / 4)
        self.guard = guard_floats(self._words)
        self._raw = np.empty(self._words + 2 * self.guard, np.uint32)
        self._raw[:self.guard] = GUARD_BITS
        self._raw[self.guard + self._words:] = GUARD_BITS
        interior = self._raw[self.guard:self.guard + self._words].view(np.uint8)
        self._interior_bytes = interior[:self.n * self.dtype.itemsize]
        self._padding = interior[self.n * self.dtype.itemsize:]   # up to the next word: a guard of its own
        self._padding[:] = PADDING_BYTE
        self.data = self._interior_bytes.view(self.dtype)
        self._prefill_byte = int(prefill) & 0xFF
        if fill is None:
            self.prefill()
        else:
            self.data[...] = np.asarray(fill, self.dtype).reshape(-1)

    @classmethod
    def copy_of(cls, array: np.ndarray, name: str) -> "GuardedBuffer":
        array = np.asarray(array)
        return cls(array.size, name, fill=array, dtype=array.dtype)

    def prefill(self, byte=None) -> None:
        """Reset the interior to "never written" (before every call that writes it): the NaN for
        floats, the pre-fill byte (or `byte`) for other types. Padding up to the word stays as set."""
        if self.dtype == np.float32:
            self.data.view(np.uint32)[:] = PREFILL_BITS
        else:
            self._interior_bytes[:] = self._prefill_byte if byte is None else int(byte) & 0xFF

    def violation(self) -> str:
        """'' if both guards are intact, else e.g. 'wrote 3 floats past the end of out'."""
        before = np.flatnonzero(self._raw[:self.guard] != GUARD_BITS)
        after = np.flatnonzero(self._raw[self.guard + self._words:] != GUARD_BITS)
        parts = []
        if before.size:
            parts.append(f"wrote {before.size} float(s) before the start of {self.name}, "
                         f"up to {self.guard - int(before[0])} floats before it")
        if after.size:
            parts.append(f"wrote {after.size} float(s) past the end of {self.name}, "
                         f"up to {int(after[-1]) + 1} floats past it")
        padding = np.flatnonzero(self._padding != PADDING_BYTE)
        if padding.size:
            parts.append(f"wrote {padding.size} byte(s) past the end of {self.name}, "
                         f"up to {int(padding[-1]) + 1} bytes past it")
        return "; ".join(parts)

    def check(self, who: str) -> None:
        """VerificationError (one line) if a guard changed."""
        problem = self.violation()
        if problem:
            raise VerificationError(f"{who}: {problem} (guard zones of {self.guard} floats)")

    def shaped(self, shape) -> np.ndarray:
        """A copy of the interior in the given shape (the guarded allocation stays private)."""
        return self.data.reshape(shape).copy()
