"""`xfc model --verify`: run the whole network and compare it with onnxruntime.

The network runs in the model's (topological) order in numpy: covered layers through their xfc
kernels (host: in-process, weights pre-packed once per layer; ARM: the static aarch64 harness
under qemu-aarch64 or on a device; GPU: OpenCL on PoCL; see backend.py), every other node
through `onnx.reference`.
Two checks, both must hold:

* per layer, the kernel's output against the layer's original ONNX nodes (Conv, then the
  BatchNormalization / bias Add / Relu / Clip it absorbed, unfolded) run by onnx.reference in
  float64 on the same input, under the layer's local bound gamma_{K+2+f} (|W| |x| + |b|)
  (bounds.layer_bound with no incoming error; for a Winograd plan the Winograd bound,
  gamma_{C+4a+3+f} (Mw + |b|)). This checks the kernel and the mapping (feeds,
  transposes, folds, fusions) sharply, at any depth;
* at every graph output, against onnxruntime running the original model on the same inputs,
  under twice the bound propagated through the network (bounds.py). An output downstream of an
  op without an error rule is compared under a stated heuristic tolerance instead, labelled so.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional

import numpy as np

from ..errors import OperatorError, ToolchainError
from . import bounds as B
from .graph import ConvFeed, Layer, MappedNetwork
from .nodes import run_node

HEURISTIC_RTOL = 1e-3   # only where no error rule applies: relative to the output's largest magnitude
VERIFIED_ON = "host (native)"


@dataclass(frozen=True)
class LayerCheck:
    name: str
    kernel: str
    max_abs_error: float             # against the layer's ONNX nodes in float64
    error_to_bound_ratio: float      # against the layer's local bound (<= 1 passes)

    @property
    def ok(self) -> bool:
        return self.error_to_bound_ratio <= 1.0


@dataclass(frozen=True)
class OutputCheck:
    name: str
    shape: tuple[int, ...]
    max_abs_error: float             # |xfc - onnxruntime|
    max_bound: float
    error_to_bound_ratio: float
    bound_kind: str                  # 'derived' (bounds.py) or 'heuristic' (no rule on the path)
    max_abs_output: float            # largest |output| (onnxruntime): how tight the bound is
    derived_max_bound: Optional[float] = None   # the uncapped derived bound where compare capped it at the heuristic

    @property
    def ok(self) -> bool:
        return self.error_to_bound_ratio <= 1.0


@dataclass(frozen=True)
class Verification:
    outputs: tuple[OutputCheck, ...]
    layers: tuple[LayerCheck, ...]
    reference_nodes: int             # nodes run by onnx.reference
    no_rule_ops: tuple[str, ...]     # op types without an error rule on some output's path
    reference: str                   # what the outputs were compared with
    where: str = VERIFIED_ON
    seed: int = 0

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.outputs) and all(c.ok for c in self.layers)


def make_feeds(net: MappedNetwork, seed: int = 0) -> dict[str, np.ndarray]:
    """Deterministic inputs: floats uniform in [-1, 1), integers and booleans zero."""
    from onnx import helper
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, shape, elem in net.loaded.inputs:
        dtype = helper.tensor_dtype_to_np_dtype(elem)
        if np.issubdtype(dtype, np.floating):
            feeds[name] = rng.uniform(-1.0, 1.0, size=shape).astype(dtype)
        else:
            feeds[name] = np.zeros(shape, dtype)
    return feeds


def run_onnxruntime(net: MappedNetwork, feeds: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], str]:
    """The original model's outputs from onnxruntime (CPU), and a label saying so."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise ToolchainError("--verify compares with onnxruntime, which is not installed: "
                             "pip install onnxruntime") from None
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(net.loaded.model.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        values = session.run(None, dict(feeds))
    except Exception as exc:
        raise OperatorError(f"{net.loaded.path}: onnxruntime cannot run the model: "
                            f"{' '.join(str(exc).split())[:240]}") from None
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, values)), f"onnxruntime {ort.__version__} (CPUExecutionProvider) on the original model"


def _to_kernel(x, transpose: bool, view, broadcast, shape) -> np.ndarray:
    if transpose:
        x = np.swapaxes(x, -1, -2)
    return np.broadcast_to(np.reshape(x, view), broadcast).reshape(shape)


def _layer_inputs(layer: Layer, values, errors):
    """(in0, e(in0), in1 or None, e(in1)) in the kernel's layout."""
    spec = layer.spec
    feed = layer.feed
    if isinstance(feed, ConvFeed):
        x = values[feed.input_name]
        e = errors[feed.input_name]
        return x.reshape(spec.operand_shapes[0]), e if e is None else np.broadcast_to(e, x.shape).reshape(
            spec.operand_shapes[0]), None, B.ZERO
    a = values[feed.a_name]
    ea = errors[feed.a_name]
    a_k = _to_kernel(a, feed.a_transpose, feed.a_view, feed.a_broadcast, spec.operand_shapes[0])
    ea_k = None if ea is None else _to_kernel(np.broadcast_to(ea, a.shape), feed.a_transpose, feed.a_view,
                                              feed.a_broadcast, spec.operand_shapes[0])
    if feed.b_name is None:
        return a_k, ea_k, None, B.ZERO
    b = values[feed.b_name]
    eb = errors[feed.b_name]
    b_k = _to_kernel(b, feed.b_transpose, feed.b_view, feed.b_broadcast, spec.operand_shapes[1])
    eb_k = None if eb is None else _to_kernel(np.broadcast_to(eb, b.shape), feed.b_transpose, feed.b_view,
                                              feed.b_broadcast, spec.operand_shapes[1])
    return a_k, ea_k, b_k, eb_k


def winograd_m_of(kernel) -> int:
    """The Winograd tile size of a built layer's CPU plan (0: direct, or not a CPU kernel)."""
    synthesis = getattr(kernel, "synthesis", None)
    plan = getattr(getattr(synthesis, "result", None), "plan", None)
    return int(getattr(plan, "winograd_m", 0) or 0)


def _check_layer(layer: Layer, out: np.ndarray, values, x: np.ndarray, weight: np.ndarray, opset: int,
                 kernel: str, winograd_m: int = 0) -> LayerCheck:
    """The kernel's output against the layer's original ONNX nodes run in float64 (module docstring)."""
    feeds = {}
    for node in layer.onnx_nodes:
        for name in node.input:
            if name and name not in feeds:
                value = values[name]
                feeds[name] = value.astype(np.float64) if value.dtype.kind == "f" else value
        results = run_node(node, feeds, opset)
        feeds.update(zip([n for n in node.output if n], results))
    expected = np.asarray(feeds[layer.output], np.float64)
    local = B.layer_bound(layer.spec, x, B.ZERO, weight, B.ZERO, layer.bias_magnitude, layer.fold_units,
                          winograd_m)
    got = np.asarray(out, np.float64).reshape(expected.shape)
    if not np.all(np.isfinite(got)):
        return LayerCheck(name=layer.name, kernel=kernel, max_abs_error=float("inf"), error_to_bound_ratio=float("inf"))
    diff = np.abs(got - expected)
    return LayerCheck(name=layer.name, kernel=kernel, max_abs_error=float(diff.max(initial=0.0)),
                      error_to_bound_ratio=float(np.max(diff / local.reshape(expected.shape), initial=0.0)))


def _last_uses(net: MappedNetwork) -> dict[str, int]:
    last = {}
    for index, step in enumerate(net.steps):
        if isinstance(step, Layer):
            feed = step.feed
            names = [feed.input_name] if isinstance(feed, ConvFeed) else [feed.a_name, feed.b_name]
        else:
            names = list(step.node.input)
        for n in names:
            if n:
                last[n] = index
    return last


def execute(net: MappedNetwork, kernels: Mapping, feeds: Mapping[str, np.ndarray],
            progress: Optional[Callable[[str], None]] = None):
    """Run the network; returns (values, errors, layer checks, op types without an error rule).

    kernels maps each layer's spec to an object with prepack / run_packed / __call__
    (backend.LayerKernel); values and errors hold the graph outputs.
    """
    say = progress or (lambda msg: None)
    loaded = net.loaded
    values: dict[str, np.ndarray] = {**loaded.constants, **feeds}
    errors: dict[str, Optional[np.ndarray]] = {name: B.ZERO for name in values}
    keep = set(loaded.outputs)
    last = _last_uses(net)
    checks, no_rule = [], set()
    names = {spec: getattr(k, "name", "?") for spec, k in kernels.items()}
    total = len(net.layers)
    done = 0
    for index, step in enumerate(net.steps):
        if isinstance(step, Layer):
            done += 1
            kernel = kernels[step.spec]
            slow = getattr(kernel, "where", VERIFIED_ON) != VERIFIED_ON    # a process (qemu, adb, PoCL) per call
            if slow or (total >= 20 and (done % 10 == 0 or done == total)):
                say(f"verify: layer {done}/{total} ({step.name})")
            x, ex, b, eb = _layer_inputs(step, values, errors)
            if b is None:
                weight = step.weight
                out = kernel.run_packed(x, kernel.prepack(weight), step.bias)
            else:
                weight = np.ascontiguousarray(b, np.float32)
                out = kernel(x, weight, step.bias)
            wm = winograd_m_of(kernel)
            checks.append(_check_layer(step, out, values, x, weight, loaded.opset, names[step.spec], wm))
            bound = None if ex is None or eb is None else B.layer_bound(
                step.spec, x, ex, weight, eb, step.bias_magnitude, step.fold_units, wm)
            values[step.output] = out.reshape(step.out_shape)
            errors[step.output] = None if bound is None else bound.reshape(step.out_shape)
        else:
            node = step.node
            ins = [values[n] if n else None for n in node.input]
            try:
                outs = run_node(node, {n: values[n] for n in node.input if n}, loaded.opset)
            except Exception as exc:
                raise OperatorError(f"{loaded.path}: onnx.reference cannot run node '{step.name}' "
                                    f"({step.op_type}): {' '.join(str(exc).split())[:200]}") from None
            in_bounds = [errors[n] if n else B.ZERO for n in node.input]
            out_bounds = B.propagate(node, loaded.opset, ins, in_bounds, outs)
            if any(e is None for e in out_bounds) and all(e is not None for e in in_bounds):
                no_rule.add(step.op_type)
            for name, value, e in zip([n for n in node.output if n], outs, out_bounds):
                values[name] = value
                errors[name] = e
        # Free intermediates after their last reader; constants stay (a layer's absorbed nodes,
        # checked in _check_layer, may share them with nodes that ran before).
        for n in [n for n, i in last.items() if i == index and n not in keep and n not in feeds
                  and n not in loaded.constants]:
            values.pop(n, None)
            errors.pop(n, None)
    return values, errors, tuple(checks), tuple(sorted(no_rule))


def compare(name: str, got: np.ndarray, expected: np.ndarray, error, *, cap_at_heuristic: bool = False) -> OutputCheck:
    """|got - expected| against 2 e (both are fp32 evaluations within e of exact), or a stated
    heuristic tolerance where e is unknown. cap_at_heuristic (fp32): where 2 e exceeds the heuristic
    tolerance, the tolerance is the bound there (the kind stays 'derived': every step on the path has
    a rule; derived_max_bound keeps the uncapped figure). Carried through a deep network with random
    weights, the worst case reaches 1e14-1e49 times the outputs, or overflows float64: a bound no
    output could exceed, while fp32 networks agree with onnxruntime to ~1e-7 of their largest output."""
    expected64 = np.asarray(expected, np.float64)
    got64 = np.asarray(got, np.float64).reshape(expected64.shape)
    heuristic = HEURISTIC_RTOL * float(np.max(np.abs(expected64), initial=0.0)) + B.TINY
    derived_max = None
    if error is None:
        bound = np.full(expected64.shape, heuristic)
        kind = "heuristic"
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            bound = 2.0 * np.broadcast_to(np.asarray(error, np.float64), expected64.shape) + B.TINY
        kind = "derived"
        loose = ~np.isfinite(bound) | (bound > heuristic)
        if cap_at_heuristic and np.any(loose):
            derived_max = float(np.max(bound, initial=0.0))
            bound = np.where(loose, heuristic, bound)
    if not np.all(np.isfinite(got64)):
        err, ratio = float("inf"), float("inf")
    else:
        diff = np.abs(got64 - expected64)
        err = float(diff.max(initial=0.0))
        ratio = float(np.max(diff / bound, initial=0.0))
    return OutputCheck(name=name, shape=tuple(expected64.shape), max_abs_error=err,
                       max_bound=float(bound.max(initial=0.0)), error_to_bound_ratio=ratio, bound_kind=kind,
                       max_abs_output=float(np.max(np.abs(expected64), initial=0.0)), derived_max_bound=derived_max)


def verify_network(net: MappedNetwork, kernels: Mapping, *, seed: int = 0,
                   progress: Optional[Callable[[str], None]] = None, where: str = VERIFIED_ON) -> Verification:
    """Run the network with xfc kernels + onnx.reference and compare with onnxruntime."""
    feeds = make_feeds(net, seed)
    expected, label = run_onnxruntime(net, feeds)
    with np.errstate(over="ignore", invalid="ignore"):   # carried bounds may overflow: compare() caps them
        values, errors, checks, no_rule = execute(net, kernels, feeds, progress)
    outputs = tuple(compare(name, values[name], expected[name], errors[name], cap_at_heuristic=True)
                    for name in net.loaded.outputs)
    return Verification(outputs=outputs, layers=checks, reference_nodes=len(net.uncovered), no_rule_ops=no_rule,
                        reference=label, seed=seed, where=where)
