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
  bounds), or the labelled heuristic where some step on the path has no rule.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import numpy as np

from ...ops.reference import activation_bound, reference
from ...ops.spec import Epilogue
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
                "nodes_run_by_onnx_reference": 0, "ops_without_error_rule": list(self.no_rule_ops)}


BOUND_NOTE = ("every step of the C network is checked on its own C inputs against its ONNX nodes run in float64 by "
              "onnx.reference, under the step's local bound (kernels: gamma_(K+2+f) (|W||x| + |b|), the Winograd bound "
              "for Winograd plans, + gamma_2 (|r| + |y|) for a fused residual, then the activation's rule; runtime ops: "
              "xfc/model/bounds.py; data movement: exact); the graph outputs are compared with onnxruntime under 2 e, e "
              "propagated through the network with the same rules")


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


class _Walk:
    def __init__(self, program: Program, opset: int, feeds: Mapping[str, np.ndarray], constants: Mapping,
                 winograd: Mapping):
        self.program = program
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
                    v = self.value(n)
                    feeds[n] = v.astype(np.float64) if v.dtype.kind == "f" else v
            outs = run_node(node, feeds, self.opset)
            feeds.update(zip([o for o in node.output if o], outs))
        return feeds

    def kernel(self, step: KernelStep, got: np.ndarray) -> tuple[StepCheck, Optional[np.ndarray]]:
        """(the check, the propagated bound of the output: None where some input's bound is unknown)."""
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
        expected = np.asarray(feeds[step.output] if step.output in feeds else feeds[step.onnx_nodes[-1].output[0]],
                              np.float64).reshape(out_shape)
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
        kind = "derived"
        for node in step.onnx_nodes:
            ins = [feeds.get(n) if n else None for n in node.input]
            outs = [feeds[o] for o in node.output if o]
            loc = B.propagate(node, self.opset, ins, [local_e.get(n, B.ZERO) if n else B.ZERO for n in node.input], outs)
            car = B.propagate(node, self.opset, ins, [carried_e.get(n, self.error(n)) if n else B.ZERO
                                                      for n in node.input], outs)
            if any(v is None for v in loc):
                kind = "heuristic"
                self.no_rule.add(node.op_type)
            for o, lv, cv in zip([o for o in node.output if o], loc, car):
                local_e[o] = lv
                carried_e[o] = cv
        checks, carried = [], []
        for t, got, shape in zip(step.outputs, gots, shapes):
            expected = np.asarray(feeds[t], np.float64).reshape(shape)
            bound = local_e.get(t)
            if kind == "heuristic" or bound is None:
                bound = np.full(shape, HEURISTIC_RTOL * float(np.max(np.abs(expected), initial=0.0)) + B.TINY)
                kind = "heuristic"
            else:
                bound = np.broadcast_to(np.asarray(bound, np.float64), shape) + B.TINY
            checks.append(_judge(got, expected, bound, kind))
            c = carried_e.get(t)
            carried.append(None if c is None else np.broadcast_to(np.asarray(c, np.float64), shape))
        return checks, carried


def _judge(got, expected, bound, kind) -> StepCheck:
    got64 = np.asarray(got, np.float64).reshape(expected.shape)
    if not np.all(np.isfinite(got64)):
        return StepCheck(-1, "", "", float("inf"), float("inf"), kind)
    diff = np.abs(got64 - expected)
    ratio = float(np.max(diff / (np.asarray(bound) + B.TINY), initial=0.0)) if kind != "exact" else \
        (0.0 if not np.any(diff) else float("inf"))
    return StepCheck(-1, "", "", float(diff.max(initial=0.0)), ratio, kind)


def verify_program(program: Program, opset: int, constants: Mapping, feeds: Mapping[str, np.ndarray],
                   dumps: Sequence[Sequence[np.ndarray]], outputs: Sequence[np.ndarray],
                   expected: Mapping[str, np.ndarray], reference_label: str, *, winograd: Mapping,
                   where: str, emulated: bool, seed: int) -> NetworkVerification:
    """The checks of the module docstring. dumps[i]: the outputs of step i as the C network wrote them;
    outputs: its graph outputs; expected: onnxruntime's; winograd: spec -> Winograd tile size (0: direct)."""
    walk = _Walk(program, opset, feeds, constants, winograd)
    checks = []
    for i, step in enumerate(program.steps):
        gots = [np.asarray(d, np.float32).reshape(program.shapes[t]) for d, t in zip(dumps[i], step.outputs)]
        if isinstance(step, KernelStep):
            check, carried = walk.kernel(step, gots[0])
            step_checks, carried_list = [check], [carried]
        else:
            step_checks, carried_list = walk.op(step, gots)
        for t, got, c, e in zip(step.outputs, gots, step_checks, carried_list):
            checks.append(StepCheck(i, step.name, step.label, c.max_abs_error, c.error_to_bound_ratio, c.bound_kind))
            walk.values[t] = got
            walk.errors[t] = e
    results = []
    for j, name in enumerate(program.outputs):
        results.append(compare(name, outputs[j].reshape(expected[name].shape), expected[name], walk.error(name)))
    return NetworkVerification(outputs=tuple(results), steps=tuple(checks), no_rule_ops=tuple(sorted(walk.no_rule)),
                               reference=reference_label, where=where, emulated=emulated, seed=seed)
