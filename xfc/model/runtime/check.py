"""`xfc model --emit lib --verify`: the C network's own values, checked step by step and at its outputs.

The benchmark program runs the network once with `--dump` (every step's output, as the C code
computed it) and writes the graph outputs. Two checks, both must hold (as run.py's for the
per-layer kernels):

* per step, on the step's own inputs as the C network computed them: the step's ONNX nodes (a
  kernel's Conv / Gemm / MatMul with what it absorbed and fused -- BatchNormalization, bias Add,
  residual Add, activations -- unfolded) run by onnx.reference in float64, against the C output
  under the step's local bound: a kernel's bounds.layer_bound (the Winograd bound for a Winograd
  plan), + gamma_2 (|r| + |y|) for a residual, then the activation's rule
  (xfc.ops.reference.activation_bound); a runtime op's bounds.propagate rule with exact inputs;
  steps that only move data (materialized operands, output copies) exactly. An op without a rule is
  judged under run.HEURISTIC_RTOL, labelled heuristic;
* at every graph output, against onnxruntime on the original model with the same inputs, under
  twice the bound propagated through the network (the same rules, carrying each step's input
  bounds), capped (fp32) at the heuristic tolerance wherever it is looser (run.compare: a deep
  network's worst case), or the labelled heuristic where some step on the path has no rule.

An fp16 program (`--dtype fp16`) is checked the same way, with what differs spelled out:
* a kernel step on its own fp16 input against its ONNX nodes (unfolded, float64, as for fp32), under
  the fp16 kernel bound of xfc.ops.fp16 on what the kernel read (the folded weights and bias
  rounded to fp16; the running bound of its plan's KC slices, depthwise: classical) + the layer
  rule of the folding with exact inputs + |x| |W - W16| + |b - b16|, then the activation's rule;
  the carried bound is the same with e(x) through |W|;
* a runtime op computes in fp32 and rounds its result to fp16 once: its rule, with every constant
  it reads off by its own rounding to fp16, plus u16 |y| + eta (u16 = 2^-11 (1 + 2^-12), eta = 2^-25:
  xfc.ops.fp16) where the op is not pure data movement (a max, a copy, a ReLU of fp16 values are exact);
* the input cast must equal the input rounded to nearest fp16 exactly (its error, carried, is that
  rounding); the output cast is exact.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import numpy as np

from ...ops import fp16 as F16
from ...ops.dtypes import FP32
from ...ops.reference import activate, activation_bound, reference
from ...ops.spec import Epilogue, MatmulSpec
from .. import bounds as B
from ..nodes import run_node
from ..run import HEURISTIC_RTOL, OutputCheck, compare
from .program import KernelStep, OpStep, Program


@dataclass(frozen=True)
class StepCheck:
    index: int
    name: str
    op: str
    max_abs_error: float
    error_to_bound_ratio: float
    bound_kind: str                  # 'derived', 'exact' (data movement) or 'heuristic'

    @property
    def ok(self) -> bool:
        return self.error_to_bound_ratio <= 1.0


@dataclass(frozen=True)
class NetworkVerification:
    outputs: tuple[OutputCheck, ...]
    steps: tuple[StepCheck, ...]
    no_rule_ops: tuple[str, ...]
    reference: str
    where: str
    emulated: bool
    seed: int
    dtype: str = "fp32"
    agreement: tuple = ()            # an fp16 program: per output, what it measured against the fp32 model

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.outputs) and all(c.ok for c in self.steps)

    def to_dict(self, bound_note: str) -> dict:
        """The report's 'verification' (the keys run.py's report has, plus the per-step checks)."""
        from dataclasses import asdict
        failed = [f"{c.index}:{c.name}" for c in self.steps if not c.ok]
        return {"verified": self.ok, "verified_on": self.where, "emulated": self.emulated,
                "reference": self.reference, "seed": self.seed, "bound": bound_note,
                "outputs": [{**asdict(c), "ok": c.ok} for c in self.outputs],
                "layers_checked": len(self.steps), "layers_failed": failed,
                "worst_layer_ratio": max((c.error_to_bound_ratio for c in self.steps), default=0.0),
                "steps": [{**asdict(c), "ok": c.ok} for c in self.steps],
                "nodes_run_by_onnx_reference": 0, "ops_without_error_rule": list(self.no_rule_ops),
                "dtype": self.dtype,
                **({("agreement_with_onnxruntime" if self.dtype == "int8" else "agreement_with_fp32"): list(self.agreement)}
                   if self.agreement else {})}


BOUND_NOTE = ("every step of the C network is checked on its own C inputs against its ONNX nodes run in float64 by "
              "onnx.reference, under the step's local bound (kernels: gamma_(K+2+f) (|W||x| + |b|), the Winograd bound "
              "for Winograd plans, + gamma_2 (|r| + |y|) for a fused residual, then the activation's rule; runtime ops: "
              "xfc/model/bounds.py; data movement: exact); the graph outputs are compared with onnxruntime under 2 e, e "
              "propagated through the network with the same rules")
BOUND_NOTE_FP16 = ("fp16 network: every step of the C network is checked on its own C inputs against its ONNX nodes "
                   "in float64 under its local bound (kernels: xfc.ops.fp16's bound on the fp16 weights they read, "
                   "running over the plan's KC slices, + the folding's layer rule + the weight and bias roundings to "
                   "fp16; runtime ops: the fp32 rules of xfc/model/bounds.py with fp16 constants, + one rounding to "
                   "fp16; casts: exact); the graph outputs are compared with onnxruntime running the fp32 model under "
                   "2 e, e propagated with the same rules plus the weight roundings (a worst case that grows with "
                   "depth: weak on deep networks, see agreement_with_fp32 for what was measured)")


def agreement(name: str, got: np.ndarray, expected: np.ndarray) -> dict:
    """How an fp16 output compares with the fp32 model's (measured, not a bound): the largest error
    relative to the largest |output|, and for outputs with a class axis (the last, > 1) the share of
    rows whose argmax agrees."""
    got64 = np.asarray(got, np.float64).reshape(expected.shape)
    ref = np.asarray(expected, np.float64)
    peak = float(np.max(np.abs(ref), initial=0.0))
    out = {"name": name, "max_abs_error": float(np.max(np.abs(got64 - ref), initial=0.0)),
           "relative_to_largest_output": float(np.max(np.abs(got64 - ref), initial=0.0)) / peak if peak else 0.0}
    if ref.ndim >= 1 and ref.shape[-1] > 1:
        rows = ref.reshape(-1, ref.shape[-1]), got64.reshape(-1, ref.shape[-1])
        same = int(np.sum(np.argmax(rows[0], axis=1) == np.argmax(rows[1], axis=1)))
        out.update(argmax_rows=int(rows[0].shape[0]), argmax_agree=same)
    return out


def _move(step: OpStep, x: np.ndarray, out_shape) -> np.ndarray:
    """A data-movement step (strided_copy, expand, copy) applied to x in numpy."""
    flat = np.ascontiguousarray(x).reshape(-1)
    p = step.params
    if step.op == "copy":
        return flat.reshape(out_shape).copy()
    if step.op == "strided_copy":
        view = np.lib.stride_tricks.as_strided(flat[p["offset"]:], shape=p["dims"],
                                               strides=[s * flat.itemsize for s in p["strides"]])
    else:   # expand
        view = np.lib.stride_tricks.as_strided(flat, shape=p["dims"], strides=[s * flat.itemsize for s in p["a_strides"]])
    return np.array(view).reshape(out_shape)


# Runtime ops whose fp16 result is one of their fp16 inputs (or a clamp of it): no rounding at the store
# (Clip's bounds and Pad's value are fp32 parameters stored into fp16: rounded, so not listed)
EXACT_IN_FP16 = frozenset({"maxpool", "global_maxpool", "concat", "split", "strided_copy", "resize_nearest", "copy",
                           "expand", "relu"})


def fp16_rounding(y) -> np.ndarray:
    """One rounding of the float64 value y to fp16 (with the fp32 step before it): u16 |y| + eta."""
    return F16.OP_UNIT_ROUNDOFF * np.abs(np.asarray(y, np.float64)) + F16.UNDERFLOW_ETA


def as_fp16(a) -> np.ndarray:
    """The values an fp16 program holds for fp32 weights, biases or constants (float64)."""
    return np.asarray(a, np.float32).astype(np.float16).astype(np.float64)


class ShapeMismatch(Exception):
    """The reference operator computes a step's output in another shape than the lowered network has."""


def _as_step_shape(value, shape, what: str) -> np.ndarray:
    """The reference's value of a step output, in the program's shape; ShapeMismatch when the two
    differ in more than size-1 axes (a reshape would silently reorder or fail)."""
    value = np.asarray(value, np.float64)
    if [d for d in value.shape if d != 1] != [d for d in shape if d != 1]:
        raise ShapeMismatch(f"{what}: the reference computes shape {list(value.shape)}, the lowered network has "
                            f"{list(shape)}")
    return value.reshape(shape)


class _Walk:
    def __init__(self, program: Program, opset: int, feeds: Mapping[str, np.ndarray], constants: Mapping,
                 winograd: Mapping, kc: Optional[Mapping] = None):
        self.program = program
        self.narrow = program.dtype != FP32       # fp16: the rules above add the roundings to fp16
        self.kc = kc or {}                        # spec -> KC of its GEMM plan (fp16 running bound; None: classical)
        # an ONNX tensor the program holds under another name: a graph input or output of an fp16
        # program is X@fp16 between the steps (lower.cast_boundaries); the nodes name X
        self.internal: dict[str, str] = {}
        for st in program.steps:
            if isinstance(st, OpStep) and st.op == "cast":
                outer, inner = (st.inputs[0], st.outputs[0]) if st.params["to"] != FP32.name else \
                    (st.outputs[0], st.inputs[0])
                self.internal[outer] = inner
        self.onnx_name = {inner: outer for outer, inner in self.internal.items()}
        self.winograd = winograd                 # spec -> Winograd tile size of its plan (0: direct)
        self.opset = opset
        self.constants = constants               # the folded model's constants (ONNX node inputs)
        self.values: dict[str, np.ndarray] = {k: np.asarray(v, np.float32) for k, v in feeds.items()}
        self.errors: dict[str, Optional[np.ndarray]] = {k: B.ZERO for k in feeds}
        self.no_rule: set[str] = set()

    def value(self, name: str) -> np.ndarray:
        if name in self.values:
            return self.values[name]
        if name in self.program.aliases:
            root, offset = self.program.aliases[name]
            flat = self.value(root).reshape(-1)
            v = flat[offset:offset + self.program.floats(name)].reshape(self.program.shapes[name])
            self.values[name] = v
            return v
        return np.asarray(self.constants[name])

    def error(self, name: str):
        if name in self.errors:
            return self.errors[name]
        if name in self.program.aliases:
            root, offset = self.program.aliases[name]
            e = self.error(root)
            if e is None or np.ndim(e) == 0:
                return e
            flat = np.broadcast_to(e, self.value(root).shape).reshape(-1)
            return flat[offset:offset + self.program.floats(name)].reshape(self.program.shapes[name])
        return B.ZERO   # constants

    # -- one step ---------------------------------------------------------------------------

    def run_nodes(self, nodes, feeds: dict) -> dict:
        for node in nodes:
            for n in node.input:
                if n and n not in feeds:
                    v = self.value(self.internal.get(n, n))
                    feeds[n] = v.astype(np.float64) if v.dtype.kind == "f" else v
            outs = run_node(node, feeds, self.opset)
            feeds.update(zip([o for o in node.output if o], outs))
        return feeds

    def kernel(self, step: KernelStep, got: np.ndarray) -> tuple[StepCheck, Optional[np.ndarray]]:
        """(the check, the propagated bound of the output: None where some input's bound is unknown)."""
        if self.narrow:
            return self.kernel_fp16(step, got)
        spec, layer = step.spec, step.layer
        x = self.value(step.input)
        ex = self.error(step.input)
        weight = layer.weight if step.weight_tensor is None else self.value(step.weight_tensor)
        ew = B.ZERO if step.weight_tensor is None else self.error(step.weight_tensor)
        plain = type(spec)(**spec.shape_dict(), epilogue=Epilogue(bias=spec.epilogue.bias))
        wm = int(self.winograd.get(spec, 0))
        local, carried, pre = self._layer_bounds(step, plain, x, ex, weight, ew, wm)
        r = None
        if step.residual is not None:
            r = self.value(step.residual).astype(np.float64).reshape(pre.shape)
            er = self.error(step.residual)
            pre = pre + r
            local = local + B.gamma(2) * (np.abs(r) + np.abs(pre))
            carried = None if carried is None or er is None else \
                carried + np.broadcast_to(er, r.shape) + B.gamma(2) * (np.abs(r) + np.abs(pre))
        act, alpha = spec.epilogue.activation, spec.epilogue.alpha
        local = activation_bound(local, pre, act, alpha)
        carried = None if carried is None else activation_bound(carried, pre, act, alpha)
        out_shape = self.program.shapes[step.output]
        feeds = self.run_nodes(step.onnx_nodes, {})
        expected = _as_step_shape(feeds[step.output] if step.output in feeds else feeds[step.onnx_nodes[-1].output[0]],
                                  out_shape, f"'{step.output}'")
        check = _judge(got, expected, local.reshape(out_shape), "derived")
        return check, None if carried is None else carried.reshape(out_shape)

    def kernel_fp16(self, step: KernelStep, got: np.ndarray) -> tuple[StepCheck, Optional[np.ndarray]]:
        """An fp16 kernel step (module docstring), against its ONNX nodes (unfolded, float64) on its own
        fp16 input: the fp16 kernel's bound on what it read (the weights and bias rounded to fp16, or a
        B the network computed), + the layer rule of the folding with exact inputs, + |x| |W - W16| +
        |b - b16|; then the activation's rule (fp16 kernels fuse bias, relu, relu6 only)."""
        spec, layer = step.spec, step.layer
        if step.residual is not None or spec.epilogue.extended:
            raise ValueError(f"fp16 kernel step '{step.name}': the lowering gives fp16 kernels no residual and "
                             f"bias / relu / relu6 only")
        plain = type(spec)(**spec.shape_dict(), epilogue=Epilogue(bias=spec.epilogue.bias))
        bare = type(spec)(**spec.shape_dict())
        kc = self.kc.get(spec)
        x = self.value(step.input).astype(np.float64)
        ex = self.error(step.input)
        e_full = None if ex is None else np.broadcast_to(np.asarray(ex, np.float64), x.shape)
        g, cg, kg = step.groups, getattr(plain, "c", 0), getattr(plain, "k", 0)
        if step.weight_tensor is None:     # constant weights: the fp32 ones rounded to fp16 in the weights file
            w32 = np.asarray(layer.weight, np.float64)
            w16, ew = as_fp16(w32), B.ZERO
        else:                              # B computed by the network: already fp16 values
            w32 = w16 = np.asarray(self.value(step.weight_tensor), np.float64).reshape(plain.operand_shapes[1])
            ew = self.error(step.weight_tensor)
        b32 = np.asarray(layer.bias, np.float64)
        b16 = as_fp16(b32)
        axis = 2 if isinstance(spec, MatmulSpec) else 1     # the output channels
        local_rows, carried_rows, pre_rows = [], [], []
        for item in range(x.shape[0] if g > 1 else 1):
            per = ([], [], [])
            for j in range(g):
                if g > 1:
                    xs, es = x[item:item + 1, j * cg:(j + 1) * cg], \
                        None if e_full is None else e_full[item:item + 1, j * cg:(j + 1) * cg]
                    ws, ws16, bs, bs16 = (w32[j * kg:(j + 1) * kg], w16[j * kg:(j + 1) * kg],
                                          b32[j * kg:(j + 1) * kg], b16[j * kg:(j + 1) * kg])
                    mag = layer.bias_magnitude[j * kg:(j + 1) * kg]
                else:
                    xs = x.reshape(plain.operand_shapes[0])
                    es = None if e_full is None else e_full.reshape(xs.shape)
                    ws, ws16 = w32.reshape(plain.operand_shapes[1]), w16.reshape(plain.operand_shapes[1])
                    bs, bs16, mag = b32, b16, layer.bias_magnitude
                fb = F16.fp16_bound(plain, xs, ws16, bs16, kc)
                pre = reference(plain, xs, ws16, bs16)
                bias_rounding = (np.abs(bs - bs16).reshape([-1 if a == axis else 1 for a in range(pre.ndim)])
                                 if spec.epilogue.bias else 0.0)
                per[0].append(fb.bound + B.layer_bound(plain, xs, B.ZERO, ws, B.ZERO, mag, layer.fold_units, 0)
                              + reference(bare, np.abs(xs), np.abs(ws - ws16), None) + bias_rounding)
                per[2].append(pre)
                if es is None or ew is None:
                    per[1].append(None)
                    continue
                per[1].append(fb.bound + B.layer_bound(plain, xs, es, ws, ew, mag, layer.fold_units, 0)
                              + reference(bare, np.abs(xs) + es, np.abs(ws - ws16), None) + bias_rounding)
            local_rows.append(np.concatenate(per[0], axis=1) if g > 1 else per[0][0])
            carried_rows.append(None if any(c is None for c in per[1]) else
                                (np.concatenate(per[1], axis=1) if g > 1 else per[1][0]))
            pre_rows.append(np.concatenate(per[2], axis=1) if g > 1 else per[2][0])
        local, pre = np.concatenate(local_rows, axis=0), np.concatenate(pre_rows, axis=0)
        carried = None if any(c is None for c in carried_rows) else np.concatenate(carried_rows, axis=0)
        act, alpha = spec.epilogue.activation, spec.epilogue.alpha
        out_shape = self.program.shapes[step.output]
        feeds = self.run_nodes(step.onnx_nodes, {})
        name = self.onnx_name.get(step.output, step.output)
        expected = _as_step_shape(feeds[name] if name in feeds else feeds[step.onnx_nodes[-1].output[0]],
                                  out_shape, f"'{name}'")
        local = activation_bound(local, pre, act, alpha)
        carried = None if carried is None else activation_bound(carried, pre, act, alpha)
        check = _judge(got, expected, local.reshape(out_shape), "derived")
        return check, None if carried is None else carried.reshape(out_shape)

    def _layer_bounds(self, step: KernelStep, plain, x, ex, weight, ew, wm):
        """(local bound, carried bound or None, the float64 pre-activation) in the output's layout."""
        layer = step.layer
        if step.groups == 1:
            xk = x.reshape(plain.operand_shapes[0])
            exk = None if ex is None else np.broadcast_to(ex, x.shape).reshape(plain.operand_shapes[0])
            wk = np.asarray(weight).reshape(plain.operand_shapes[1])
            ewk = ew if ew is None or np.ndim(ew) == 0 else np.broadcast_to(ew, np.shape(weight)).reshape(wk.shape)
            local = B.layer_bound(plain, xk, B.ZERO, wk, B.ZERO, layer.bias_magnitude, layer.fold_units, wm)
            carried = None if exk is None or ewk is None else B.layer_bound(
                plain, xk, exk, wk, ewk, layer.bias_magnitude, layer.fold_units, wm)
            pre = reference(plain, xk, wk, layer.bias)
            return local, carried, pre
        # grouped: one kernel per group and batch item; bounds per group, stacked along channels
        g = step.groups
        n = x.shape[0]
        cg, kg = plain.c, plain.k
        locals_, carrieds, pres = [], [], []
        e_full = None if ex is None else np.broadcast_to(ex, x.shape)
        for item in range(n):
            per = ([], [], [])
            for j in range(g):
                xs = x[item:item + 1, j * cg:(j + 1) * cg]
                ws = layer.weight[j * kg:(j + 1) * kg]
                bs = layer.bias[j * kg:(j + 1) * kg]
                mag = layer.bias_magnitude[j * kg:(j + 1) * kg]
                per[0].append(B.layer_bound(plain, xs, B.ZERO, ws, B.ZERO, mag, layer.fold_units, wm))
                per[1].append(None if e_full is None else B.layer_bound(
                    plain, xs, e_full[item:item + 1, j * cg:(j + 1) * cg], ws, B.ZERO, mag, layer.fold_units, wm))
                per[2].append(reference(plain, xs, ws, bs))
            locals_.append(np.concatenate(per[0], axis=1))
            carrieds.append(None if e_full is None else np.concatenate(per[1], axis=1))
            pres.append(np.concatenate(per[2], axis=1))
        carried = None if e_full is None else np.concatenate(carrieds, axis=0)
        return np.concatenate(locals_, axis=0), carried, np.concatenate(pres, axis=0)

    def op(self, step: OpStep, gots: Sequence[np.ndarray]) -> tuple[list[StepCheck], list]:
        shapes = [self.program.shapes[t] for t in step.outputs]
        if step.op == "cast":     # to the program's dtype: rounded to nearest, exactly; back: exact
            x = self.value(step.inputs[0]).astype(np.float64).reshape(shapes[0])
            e = self.error(step.inputs[0])
            expected = as_fp16(x) if step.params["to"] != FP32.name else x
            if e is not None and step.params["to"] != FP32.name:
                e = np.broadcast_to(np.asarray(e, np.float64), x.shape) + np.abs(expected - x)
            return [_judge(gots[0], expected, np.zeros(shapes[0]), "exact")], [e]
        if not step.onnx_nodes:   # data movement the lowering added: exact
            x = self.value(step.inputs[0])
            expected = _move(step, x.astype(np.float64), shapes[0])
            e = self.error(step.inputs[0])
            moved = e if e is None or np.ndim(e) == 0 else _move(step, np.broadcast_to(e, x.shape), shapes[0])
            return [_judge(gots[0], expected, np.zeros(shapes[0]), "exact")], [moved]
        # local: the nodes on exact inputs; carried: the same rules with the inputs' bounds
        feeds = self.run_nodes(step.onnx_nodes, {})
        local_e: dict = {}
        carried_e: dict = {}
        if self.narrow:   # the constants the op reads are fp16: each off by its own rounding
            for name in step.constants:
                if name in feeds:
                    local_e[name] = carried_e[name] = np.abs(as_fp16(feeds[name]) - np.asarray(feeds[name], np.float64))
        kind = "derived"
        for node in step.onnx_nodes:
            ins = [feeds.get(n) if n else None for n in node.input]
            outs = [feeds[o] for o in node.output if o]
            loc = B.propagate(node, self.opset, ins, [local_e.get(n, B.ZERO) if n else B.ZERO for n in node.input], outs)
            car = B.propagate(node, self.opset, ins, [carried_e.get(n, self.error(self.internal.get(n, n))) if n
                                                      else B.ZERO for n in node.input], outs)
            if any(v is None for v in loc):
                kind = "heuristic"
                self.no_rule.add(node.op_type)
            for o, lv, cv in zip([o for o in node.output if o], loc, car):
                local_e[o] = lv
                carried_e[o] = cv
        checks, carried = [], []
        for t, got, shape in zip(step.outputs, gots, shapes):
            name = self.onnx_name.get(t, t)
            expected = _as_step_shape(feeds[name], shape, f"'{name}'")
            bound = local_e.get(name)
            if kind == "heuristic" or bound is None:
                bound = np.full(shape, HEURISTIC_RTOL * float(np.max(np.abs(expected), initial=0.0)) + B.TINY)
                kind = "heuristic"
            else:
                bound = np.broadcast_to(np.asarray(bound, np.float64), shape) + B.TINY
            c = carried_e.get(name)
            if self.narrow and step.op == "affine":   # y = x s16 + t16: the scale and shift rounded to fp16
                extra, extra_carried = self._affine_fp16(step)
                bound = bound + extra
                c = None if c is None or extra_carried is None else np.broadcast_to(np.asarray(c, np.float64), shape) \
                    + extra_carried
            if self.narrow and step.op not in EXACT_IN_FP16:   # the result rounded to fp16 once
                bound = bound + fp16_rounding(expected)
                c = None if c is None else np.broadcast_to(np.asarray(c, np.float64), shape) + fp16_rounding(expected)
            checks.append(_judge(got, expected, bound, kind))
            carried.append(None if c is None else np.broadcast_to(np.asarray(c, np.float64), shape))
        return checks, carried


    def _affine_fp16(self, step: OpStep) -> tuple[np.ndarray, Optional[np.ndarray]]:
        """|x| |s - s16| + |t - t16| for a BatchNormalization run as an affine op in an fp16 program
        (local: x as computed; carried: |x| + e(x)). s, t: the fp32 scale and shift lower.py made."""
        p = step.params
        x = np.abs(self.value(step.inputs[0]).astype(np.float64)).reshape(p["outer"], p["c"], p["inner"])
        scale, shift = (np.asarray(self.program.constants[n], np.float64).reshape(1, -1, 1) for n in step.constants)
        ds, dt = np.abs(scale - as_fp16(scale)), np.abs(shift - as_fp16(shift))
        shape = self.program.shapes[step.outputs[0]]
        local = (x * ds + dt).reshape(shape)
        e = self.error(step.inputs[0])
        if e is None:
            return local, None
        reach = x + np.broadcast_to(np.asarray(e, np.float64), shape).reshape(x.shape)
        return local, (reach * ds + dt).reshape(shape)


def _judge(got, expected, bound, kind) -> StepCheck:
    got64 = np.asarray(got, np.float64).reshape(expected.shape)
    if not np.all(np.isfinite(got64)):
        return StepCheck(-1, "", "", float("inf"), float("inf"), kind)
    diff = np.abs(got64 - expected)
    if kind != "exact" and not np.all(np.isfinite(bound)):   # a local bound that overflowed checks nothing: fail
        return StepCheck(-1, "", "", float(diff.max(initial=0.0)), float("inf"), f"{kind} (bound not finite)")
    ratio = float(np.max(diff / (np.asarray(bound) + B.TINY), initial=0.0)) if kind != "exact" else \
        (0.0 if not np.any(diff) else float("inf"))
    return StepCheck(-1, "", "", float(diff.max(initial=0.0)), ratio, kind)


def _walk_steps(program: Program, walk: "_Walk", dumps, checks: list) -> None:
    """Check every step on its own C inputs in order (verify_program), carrying the values and bounds."""
    for i, step in enumerate(program.steps):
        gots = [np.asarray(d, np.float32).reshape(program.shapes[t]) for d, t in zip(dumps[i], step.outputs)]
        try:
            if isinstance(step, KernelStep):
                check, carried = walk.kernel(step, gots[0])
                step_checks, carried_list = [check], [carried]
            else:
                step_checks, carried_list = walk.op(step, gots)
        except ShapeMismatch as exc:   # a failed step (the outputs and report are kept), not a crash
            mismatch = StepCheck(-1, "", "", float("inf"), float("inf"), f"shape mismatch ({exc})")
            step_checks, carried_list = [mismatch] * len(step.outputs), [None] * len(step.outputs)
        for t, got, c, e in zip(step.outputs, gots, step_checks, carried_list):
            checks.append(StepCheck(i, step.name, step.label, c.max_abs_error, c.error_to_bound_ratio, c.bound_kind))
            walk.values[t] = got
            walk.errors[t] = e


def verify_program(program: Program, opset: int, constants: Mapping, feeds: Mapping[str, np.ndarray],
                   dumps: Sequence[Sequence[np.ndarray]], outputs: Sequence[np.ndarray],
                   expected: Mapping[str, np.ndarray], reference_label: str, *, winograd: Mapping,
                   where: str, emulated: bool, seed: int, kc: Optional[Mapping] = None) -> NetworkVerification:
    """The checks of the module docstring. dumps[i]: the outputs of step i as the C network wrote them;
    outputs: its graph outputs; expected: onnxruntime's; winograd: spec -> Winograd tile size (0: direct);
    kc: spec -> KC of its GEMM plan (None: not a GEMM plan), for the fp16 kernels' running bound."""
    walk = _Walk(program, opset, feeds, constants, winograd, kc)
    checks = []
    # the carried bounds of a deep network may overflow float64: inf, which compare() caps (fp32); a
    # local bound that overflows fails its step (_judge)
    with np.errstate(over="ignore", invalid="ignore"):
        _walk_steps(program, walk, dumps, checks)
    results, agreed = [], []
    for j, name in enumerate(program.outputs):
        got = outputs[j].reshape(expected[name].shape)
        results.append(compare(name, got, expected[name], walk.error(name), cap_at_heuristic=not walk.narrow))
        if walk.narrow:
            agreed.append(agreement(name, got, expected[name]))
    return NetworkVerification(outputs=tuple(results), steps=tuple(checks), no_rule_ops=tuple(sorted(walk.no_rule)),
                               reference=reference_label, where=where, emulated=emulated, seed=seed,
                               dtype=program.dtype.name, agreement=tuple(agreed))


# ---------------------------------------------------------------------------------------------
# int8 programs (quantized models)
# ---------------------------------------------------------------------------------------------

INT8_LSB_SHARE = 0.999       # onnxruntime's outputs: within 1 LSB on at least this share of the elements
BOUND_NOTE_INT8 = ("int8 network: every step of the C network is checked on its own C inputs against xfc's QLinear "
                   "oracle (xfc.model.quantized: int32 accumulators, fp32 requantization rounding half to even, the "
                   "requantizing Add and GlobalAveragePool in fp32 without contraction, quantize and dequantize as "
                   "ONNX defines them) and must equal it byte for byte; each graph output is compared with onnxruntime "
                   "running the same quantized model: within 1 LSB of the output's quantization on at least 99.9% of "
                   "its elements (error_to_bound_ratio: the share beyond 1 LSB over 0.1%). onnxruntime may differ by a "
                   "step where it rounds otherwise (fused multiply-adds in its requantization, the order of a sum, ties "
                   "carried to later layers) and by more where its own u8 x s8 kernels saturate 16-bit pair sums (x86 "
                   "without VNNI, 8-bit weights: quantize with reduce_range)")


def _int8_expected(network, step, values):
    """The oracle's output of one step of an int8 program on the C network's own inputs."""
    from .. import quantized as Q
    t = network.tensors
    if isinstance(step, KernelStep):
        return Q.run_layer(step.layer.qstep, values[step.input], t[step.input], t[step.output])
    x = values[step.inputs[0]]
    if step.op == "quantize":
        return Q.quantize(x, t[step.outputs[0]])
    if step.op == "dequantize":
        return Q.dequantize(x, t[step.inputs[0]])
    if step.op == "qadd":
        return Q.run_add(x, values[step.inputs[1]], t[step.inputs[0]], t[step.inputs[1]], t[step.outputs[0]])
    if step.op == "qgap":
        return Q.run_gap(x, t[step.inputs[0]], t[step.outputs[0]])
    if step.op == "qmaxpool":
        main = next(n for n in step.onnx_nodes if n.op_type == "MaxPool")
        return Q.run_move(main, {main.input[0]: x}, network.loaded.opset)
    raise ValueError(f"no int8 oracle for runtime op {step.op}")


def lsb_agreement(network, name: str, got: np.ndarray, expected: np.ndarray) -> OutputCheck:
    """A graph output against onnxruntime's, in steps of the output's quantization (INT8_LSB_SHARE rule)."""
    from ..quantized import lsb_differences
    lsb = lsb_differences(network, {name: got}, {name: expected}, name)
    beyond = float(np.mean(lsb > 1.0 + 1e-6)) if lsb.size else 0.0
    return OutputCheck(name=name, shape=tuple(np.shape(expected)), max_abs_error=float(lsb.max(initial=0.0)),
                       max_bound=1.0, error_to_bound_ratio=beyond / (1.0 - INT8_LSB_SHARE), bound_kind="lsb",
                       max_abs_output=float(np.max(np.abs(expected), initial=0.0)))


def verify_int8_program(lowered, feeds: Mapping[str, np.ndarray], dumps: Sequence[Sequence[np.ndarray]],
                        outputs: Sequence[np.ndarray], expected: Mapping[str, np.ndarray], reference_label: str, *,
                        where: str, emulated: bool, seed: int) -> NetworkVerification:
    """BOUND_NOTE_INT8's checks. lowered: quantized_program.QuantizedLowered; dumps[i]: step i's outputs as
    the C network wrote them (bytes widened to fp32, dequantized values as fp32); expected: onnxruntime's."""
    program, network = lowered.program, lowered.network
    values: dict[str, np.ndarray] = {k: np.asarray(v, np.float32) for k, v in feeds.items()}
    act = np.uint8 if program.activation_type == "uint8" else np.int8

    def value(name):
        root, _offset = program.root(name)
        return values[root].reshape(program.shapes[name])

    checks = []
    for i, step in enumerate(program.steps):
        out = step.outputs[0]
        wide = np.asarray(dumps[i][0], np.float32).reshape(program.shapes[out])
        got = wide if program.element_type(out) == FP32 else wide.astype(act)
        inputs = {t: value(t) for t in step.inputs}
        expected_step = _int8_expected(network, step, inputs)
        expected_step = np.asarray(expected_step).reshape(program.shapes[out])
        diff = np.abs(got.astype(np.float64) - expected_step.astype(np.float64))
        worst = float(diff.max(initial=0.0))
        checks.append(StepCheck(i, step.name, step.label, worst, 0.0 if worst == 0.0 else float("inf"), "exact"))
        values[out] = got
    results = []
    for j, name in enumerate(program.outputs):
        got = np.asarray(outputs[j], np.float32).reshape(expected[name].shape)
        results.append(lsb_agreement(network, name, got, expected[name]))
    agreed = tuple({**agreement(c.name, np.asarray(outputs[j], np.float32).reshape(expected[c.name].shape),
                                expected[c.name]),
                    "max_lsb": c.max_abs_error, "share_beyond_1_lsb": c.error_to_bound_ratio * (1 - INT8_LSB_SHARE)}
                   for j, c in enumerate(results))
    return NetworkVerification(outputs=tuple(results), steps=tuple(checks), no_rule_ops=(), reference=reference_label,
                               where=where, emulated=emulated, seed=seed, dtype="int8", agreement=agreed)
