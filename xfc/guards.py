"""Guard zones and NaN pre-fill around the buffers a kernel is given (host side, numpy).

A kernel that writes outside its output, or leaves part of it unwritten, must not pass because
the bytes around or under the output happened to hold the right values. So every buffer a host
kernel sees (inputs, output, pre-packed weights) is the interior of a larger allocation:

    [ guard: GUARD_BITS x g ][ interior: n floats ][ guard: GUARD_BITS x g ]

- Outputs and pre-packed weights start as PREFILL_BITS (a quiet NaN): any element the kernel
  does not write stays NaN and fails the finiteness check of the verdict.
- Guards hold GUARD_BITS (a signalling-NaN bit pattern no arithmetic produces); after every
  call each guard is compared bit for bit, and a change names the buffer and the side.
- Inputs are copied into the interior, so a kernel that reads past an input reads NaN, which
  reaches the output if the value is used.

The C harness (templates/cpu/harness.c.j2) does the same with the same constants and the same
guard size; reads and writes beyond the guard zones, and inside scratch the kernel allocates
itself, are the sanitizer target's job (xfc/sanitize.py, `make sanitize`).
"""
from __future__ import annotations

import numpy as np

from .errors import VerificationError

GUARD_BITS = 0x7FA5A5A5      # signalling NaN with a recognisable payload
PREFILL_BITS = 0x7FC0DEAD    # quiet NaN: "never written"
GUARD_MIN_FLOATS = 64
GUARD_MAX_FLOATS = 1 << 16


def guard_floats(n: int) -> int:
    """Guard size for a buffer of n floats: as large as the buffer (a stray row or tile of an
    output lands inside it), at least 64 and at most 65536 floats, a multiple of 16 (keeps the
    interior 64-byte aligned relative to the allocation). Same formula as XFC_GUARD_FLOATS in C."""
    g = max(GUARD_MIN_FLOATS, min(int(n), GUARD_MAX_FLOATS))
    return (g + 15) // 16 * 16


class GuardedBuffer:
    """n fp32 values with guard zones on both sides. `.data` is the interior (a float32 view)."""

    def __init__(self, n: int, name: str, fill=None):
        self.n, self.name = int(n), name
        self.guard = guard_floats(self.n)
        self._raw = np.empty(self.n + 2 * self.guard, np.uint32)
        self._raw[:self.guard] = GUARD_BITS
        self._raw[self.guard + self.n:] = GUARD_BITS
        self.data = self._raw[self.guard:self.guard + self.n].view(np.float32)
        if fill is None:
            self._raw[self.guard:self.guard + self.n] = PREFILL_BITS
        else:
            self.data[...] = np.asarray(fill, np.float32).reshape(-1)

    @classmethod
    def copy_of(cls, array: np.ndarray, name: str) -> "GuardedBuffer":
        return cls(np.asarray(array).size, name, fill=array)

    def prefill(self) -> None:
        """Reset the interior to the never-written NaN (before every call that writes it)."""
        self._raw[self.guard:self.guard + self.n] = PREFILL_BITS

    def violation(self) -> str:
        """'' if both guards are intact, else e.g. 'wrote 3 floats past the end of out'."""
        before = np.flatnonzero(self._raw[:self.guard] != GUARD_BITS)
        after = np.flatnonzero(self._raw[self.guard + self.n:] != GUARD_BITS)
        parts = []
        if before.size:
            parts.append(f"wrote {before.size} float(s) before the start of {self.name}, "
                         f"up to {self.guard - int(before[0])} floats before it")
        if after.size:
            parts.append(f"wrote {after.size} float(s) past the end of {self.name}, "
                         f"up to {int(after[-1]) + 1} floats past it")
        return "; ".join(parts)

    def check(self, who: str) -> None:
        """VerificationError (one line) if a guard changed."""
        problem = self.violation()
        if problem:
            raise VerificationError(f"{who}: {problem} (guard zones of {self.guard} floats)")

    def shaped(self, shape) -> np.ndarray:
        """A copy of the interior in the given shape (the guarded allocation stays private)."""
        return self.data.reshape(shape).copy()
