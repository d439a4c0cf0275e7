"""Plan the activation arena ahead of time from tensor lifetimes.

Every tensor that is neither a graph input (the caller's buffer, read only) nor a graph output
(the caller's buffer) lives in one arena, allocated once at create. Aliases (program.py) share
their root's buffer. The plan, as TFLite's arena planner and XNNPACK's memory planner do it:

1. Lifetimes: a buffer is live from the step that first writes it to the last step that reads it
   or one of its aliases (steps in program order; both ends inclusive).
2. In place: an elementwise op (OpStep.inplace) writes into an input's buffer when that input has
   the output's size, lives in the arena and is read for the last time by this op; a kernel with a
   residual epilogue writes into the residual's buffer on the same conditions (and when the residual
   is not also its input or B operand), else the residual is copied into its output first. Merged
   buffers are one buffer whose lifetime is the union.
3. Placement: buffers by size, largest first (ties: earlier first write); each takes the smallest
   gap between already placed buffers whose lifetimes overlap its own where it fits (best fit), else
   the end. Offsets and sizes are multiples of ALIGN_FLOATS elements (64 bytes of fp32).
   Cache-aware placement: a buffer a streaming step writes (a depthwise kernel or an elementwise
   op: few operations per element) prefers a place whose previous tensor no contraction (a
   convolution or matmul kernel) read last, and a contraction's output prefers a place one did.
   With several threads a contraction reads its whole input (each thread needs every channel of
   its pixels), so that tensor's lines end up in every core's cache, and the next step writing
   there first takes them back from the other cores: a contraction hides that behind its
   arithmetic, a streaming step does not. Measured on MobileNetV2 at 2 threads (Zen 4 VM, the
   benchmark program's per-step profile, `xfc model mobilenet_v2.onnx --hw host --threads 2 --emit lib
   --bench --profile` before and after this rule, alternated): the 7x7 depthwise steps 0.029-0.030 ms
   where the projection had read, 0.014-0.017 ms where the expansion had written; the expansions
   that took the other places 0.082 -> 0.097 ms; whole network 3.79-4.02 -> 3.65-3.88 ms in quiet
   rounds, 7.0-7.7 -> 6.5-6.8 ms in the VM's slow rounds (its vCPUs without a shared cache, most
   likely: benchmarks/cpu_share.py); 1 thread
   unchanged. The places tried are gap starts and the edges of buffers placed before, inside the
   arena so far. Three placements are made (with the preference by first write and by size,
   without it by size) and the smallest arena wins (ties: in that order), so the preference never
   costs memory. MobileNetV3 at 2 threads showed no clear change in the same kind of run.

Sizes and offsets count elements of the program's dtype (fp32: floats; fp16: halves); the bytes
are element_bytes times as many.

The lower bound reported beside the arena is the largest total size of buffers live at one step
(TVM's memory pressure): no placement of these buffers can be smaller.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ...ops.spec import DepthwiseSpec
from .program import KernelStep, OpStep, Program

ALIGN_FLOATS = 16            # elements: 64 bytes of fp32, 32 of fp16
TAIL_PAD_FLOATS = 64         # after the last buffer: room for a vector read past a tensor's end


def _round(n: int) -> int:
    return (n + ALIGN_FLOATS - 1) // ALIGN_FLOATS * ALIGN_FLOATS


@dataclass(frozen=True)
class Place:
    where: str                    # 'arena', 'input' or 'output'
    index: int                    # input / output index (arena: 0)
    offset: int                   # floats from the base (arena base, or the caller's buffer)


@dataclass(frozen=True)
class ArenaPlan:
    places: Mapping[str, Place]           # every tensor (aliases included)
    arena_floats: int                     # the arena's size (tail padding included)
    lower_bound_floats: int               # largest total of buffers live at one step
    buffers: int                          # arena buffers after in-place merging
    inplace_steps: frozenset              # indexes of OpSteps writing into an input's buffer
    residual_inplace: frozenset           # indexes of KernelSteps whose output is their residual's buffer
    lifetimes: Mapping[str, tuple[int, int]]   # arena root tensor -> (first write, last read)
    element_bytes: int = 4                # of the program's dtype: arena_floats counts elements of it

    @property
    def arena_bytes(self) -> int:
        return self.element_bytes * self.arena_floats

    @property
    def lower_bound_bytes(self) -> int:
        return self.element_bytes * self.lower_bound_floats

    @property
    def ratio(self) -> float:
        planned = self.arena_floats - TAIL_PAD_FLOATS
        return planned / self.lower_bound_floats if self.lower_bound_floats else 1.0


class _Groups:
    """Union-find over root tensors: in-place merges."""

    def __init__(self):
        self.parent: dict[str, str] = {}

    def find(self, t: str) -> str:
        self.parent.setdefault(t, t)
        while self.parent[t] != t:
            self.parent[t] = self.parent[self.parent[t]]
            t = self.parent[t]
        return t

    def merge(self, keep: str, other: str) -> None:
        self.parent[self.find(other)] = self.find(keep)


def _is_contraction(step) -> bool:
    """A convolution or matmul kernel: with several threads each reads its whole input."""
    return isinstance(step, KernelStep) and not isinstance(step.spec, DepthwiseSpec)


def _is_streaming(step) -> bool:
    """A step with few operations per element written: a depthwise kernel, an elementwise op."""
    return isinstance(step, OpStep) or (isinstance(step, KernelStep) and isinstance(step.spec, DepthwiseSpec))


def _place(order, program: Program, prefer_clean: bool) -> tuple[dict[str, int], int]:
    """Offsets of the buffers placed in `order` (step 3) and the arena's extent; prefer_clean: the
    cache-aware placement."""
    placed: list[tuple[int, int, int, int]] = []   # (offset, size, begin, end)
    offsets: dict[str, int] = {}
    extent = 0                                      # the arena so far

    def after_contraction(offset: int, size: int, begin: int) -> bool:
        """Whether the last buffer placed in [offset, offset + size) before step `begin` was last
        read by a contraction."""
        before = [(e, b) for o, s, b, e in placed if e < begin and o < offset + size and offset < o + s]
        return bool(before) and _is_contraction(program.steps[max(before)[0]])

    for g, size, begin, end in order:
        busy = sorted((o, o + s) for o, s, b, e in placed if not (e < begin or end < b))
        fits, cursor = [], 0   # (gap, start) of every gap between busy buffers where this one fits
        for lo, hi in busy:
            if lo - cursor >= size:
                fits.append((lo - cursor, cursor))
            cursor = max(cursor, hi)
        offset = min(fits)[1] if fits else cursor   # best fit (ties: the lowest), else the end
        if prefer_clean:
            # places that are free now at the edges of buffers placed before (where an earlier
            # tensor lay), inside the arena so far: a streaming step's output takes one no
            # contraction read last; a contraction's output takes one a contraction read last
            # (it hides the transfer and leaves the others to the streaming steps)
            limit = max(extent, offset + size)
            edges = sorted({0, cursor} | {e for o, s, _, _ in placed for e in (o, o + s)})
            want_dirty = not _is_streaming(program.steps[begin])
            good = [c for c in edges if c + size <= limit and all(c + size <= lo or hi <= c for lo, hi in busy)
                    and after_contraction(c, size, begin) == want_dirty]
            if good and offset not in good:
                offset = good[0]
        offsets[g] = offset
        placed.append((offset, size, begin, end))
        extent = max(extent, offset + size)
    return offsets, extent


def plan_arena(program: Program) -> ArenaPlan:
    """The arena plan of a program (module docstring)."""
    roots = [t for t in program.shapes if t not in program.aliases]
    inputs = {t: i for i, t in enumerate(program.inputs)}
    # a graph output that is a view of another tensor (a Reshape or Flatten last) has that tensor's
    # buffer: route_outputs left it a view only where the whole buffer is the output's
    outputs: dict[str, int] = {}
    for j, t in enumerate(program.outputs):
        r, off = program.root(t)
        if off == 0 and r not in inputs and r not in outputs:
            outputs[r] = j
    in_arena = {t for t in roots if t not in inputs and t not in outputs}
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, step in enumerate(program.steps):
        for t in step.inputs:
            r = program.root(t)[0]
            last[r] = max(last.get(r, -1), i)
        for t in step.outputs:
            r = program.root(t)[0]
            first.setdefault(r, i)
            last.setdefault(r, i)   # written but never read: lives for its own step
    groups = _Groups()
    group_last = dict(last)
    inplace_steps, residual_inplace = set(), set()

    def can_share(src: str, dst: str, step_index: int) -> bool:
        rs, rd = groups.find(program.root(src)[0]), program.root(dst)[0]
        return (program.root(src)[0] in in_arena and rd in in_arena and rd not in groups.parent
                and program.root(src)[1] == 0 and program.root(dst)[1] == 0
                and program.floats(program.root(src)[0]) == program.floats(rd)
                and group_last.get(rs, -1) == step_index)

    for i, step in enumerate(program.steps):
        if isinstance(step, OpStep) and step.inplace and len(step.outputs) == 1:
            for src in step.inputs:
                if can_share(src, step.outputs[0], i):
                    keep = groups.find(program.root(src)[0])
                    out_root = program.root(step.outputs[0])[0]
                    groups.merge(keep, out_root)
                    group_last[keep] = max(group_last.get(keep, i), last.get(out_root, i))
                    inplace_steps.add(i)
                    break
        elif isinstance(step, KernelStep) and step.residual is not None:
            others = {program.root(t)[0] for t in (step.input, step.weight_tensor) if t}
            if program.root(step.residual)[0] not in others and can_share(step.residual, step.output, i):
                keep = groups.find(program.root(step.residual)[0])
                out_root = program.root(step.output)[0]
                groups.merge(keep, out_root)
                group_last[keep] = max(group_last.get(keep, i), last.get(out_root, i))
                residual_inplace.add(i)
    # buffers: groups of arena roots
    members: dict[str, list[str]] = {}
    for t in sorted(in_arena, key=lambda t: (first.get(t, 0), t)):
        members.setdefault(groups.find(t), []).append(t)
    buffers = []
    for g, ts in members.items():
        begin = min(first.get(t, 0) for t in ts)
        end = max(last.get(t, first.get(t, 0)) for t in ts)
        size = _round(max(program.floats(t) for t in ts))
        buffers.append((g, size, begin, end))
    order = sorted(buffers, key=lambda b: (-b[1], b[2], b[0]))
    # the cache-aware placement only where it costs no memory (greedy placements interfere)
    by_time = sorted(buffers, key=lambda b: (b[2], -b[1], b[0]))
    offsets, arena = min((_place(o, program, prefer_clean) for o, prefer_clean in
                          ((by_time, True), (order, True), (order, False))), key=lambda placement: placement[1])
    steps = len(program.steps)
    bound = max((sum(s for _, s, b, e in buffers if b <= i <= e) for i in range(steps)), default=0)
    places: dict[str, Place] = {}
    for t in program.shapes:
        r, off = program.root(t)
        if r in inputs:
            places[t] = Place("input", inputs[r], off)
        elif r in outputs:
            places[t] = Place("output", outputs[r], off)
        else:
            places[t] = Place("arena", 0, offsets[groups.find(r)] + off)
    lifetimes = {t: (first.get(t, 0), last.get(t, first.get(t, 0))) for t in sorted(in_arena)}
    return ArenaPlan(places=places, arena_floats=arena + TAIL_PAD_FLOATS if arena else 0, lower_bound_floats=bound,
                     buffers=len(buffers), inplace_steps=frozenset(inplace_steps),
                     residual_inplace=frozenset(residual_inplace), lifetimes=lifetimes,
                     element_bytes=program.dtype.element_bytes)
