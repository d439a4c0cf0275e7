"""`xfc model --bench`: time every covered layer and compare with onnxruntime's own per-node times.

(ARM descriptions with --device: every distinct layer is timed through the runner -- a device over
ADB, pinned to the cluster's CPUs with its thermal state recorded, or qemu-aarch64 -- and nothing
is compared: emulated figures are labelled so.)

xfc: each distinct layer kernel is timed once (median of repeats, weights pre-packed once and
untimed, as an app with constant weights runs them; backend.time_layer) on the layer's real
weights and a deterministic input, and every layer of that shape is given that time.

onnxruntime: the original model (weights as initializers), CPUExecutionProvider, its default graph
optimizations, intra-op threads = xfc's thread count, sequential execution, profiling on; per
profiled node the median of its kernel time over the timed runs (warm-up runs dropped).
onnxruntime rewrites the graph (folds BatchNormalization into Conv, fuses activations, converts
to its NCHWc layout with generated names), so profiled nodes are matched to xfc layers by name
(match_profiled): the ONNX node names a layer runs, the tensors they write (NCHWc nodes are
named '<output tensor>_nchwc'), a 'fused ' prefix and '/<fusion>' suffixes. Nodes that match no
layer (layout reorders, uncovered ops) are listed and summed separately; the covered sums compare
only layers that matched on both sides.
"""
from __future__ import annotations

import json
import os
import statistics
import tempfile
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

import numpy as np

from ..errors import OperatorError, ToolchainError
from . import backend
from .graph import Layer, MappedNetwork
from .nodes import run_node
from .run import _layer_inputs, make_feeds

NOTE = ("measured on this machine in one process, xfc and onnxruntime one after the other; figures from a "
        "loaded (shared) machine are noisy and say nothing about a quiet one")


NOTE_DEVICE = ("xfc's layers timed through the runner (weights packed by the harness on each call, pinned to the "
               "cluster's CPUs on a device); qemu-aarch64 and the virtual device give emulated figures, never phone "
               "timings; no onnxruntime comparison (it runs on this machine, not on the device)")


@dataclass(frozen=True)
class ProfiledNode:
    name: str                        # onnxruntime's node name (after its graph rewrites)
    op_type: str
    median_s: float


@dataclass(frozen=True)
class LayerBench:
    name: str
    kernel: str
    xfc_s: float
    onnxruntime_s: Optional[float]   # sum of the matched nodes' medians; None: nothing matched
    onnxruntime_nodes: tuple[str, ...]


@dataclass(frozen=True)
class NetworkBench:
    layers: tuple[LayerBench, ...]
    unmatched: tuple[ProfiledNode, ...]
    fused_away: tuple[str, ...]       # uncovered ONNX nodes onnxruntime ran inside other nodes
    threads: int
    repeats: int
    warmup: int
    where: str
    onnxruntime: Optional[str]       # version and settings; None: not compared (ARM kernels on a device / qemu)
    emulated: bool = False
    throttled: tuple[str, ...] = ()  # kernels during whose runs the device throttled
    throttling_known: bool = False

    @property
    def matched(self) -> tuple[LayerBench, ...]:
        return tuple(b for b in self.layers if b.onnxruntime_s is not None)

    def to_dict(self) -> dict:
        matched = self.matched
        return {
            "threads": self.threads, "repeats": self.repeats, "warmup": self.warmup, "xfc_measured_on": self.where,
            "emulated": self.emulated, "throttled_kernels": list(self.throttled) if self.throttling_known else None,
            "onnxruntime": self.onnxruntime, "note": NOTE if self.onnxruntime else NOTE_DEVICE,
            "xfc_covered_seconds": sum(b.xfc_s for b in self.layers),
            "layers_matched": len(matched), "layers": len(self.layers),
            "xfc_matched_seconds": sum(b.xfc_s for b in matched),
            "onnxruntime_matched_seconds": sum(b.onnxruntime_s for b in matched),
            "speedup_matched": (sum(b.onnxruntime_s for b in matched) / sum(b.xfc_s for b in matched)
                                if matched and sum(b.xfc_s for b in matched) > 0 else None),
            "onnxruntime_unmatched": [{"node": n.name, "op": n.op_type, "seconds": n.median_s} for n in self.unmatched],
            "onnxruntime_unmatched_seconds": sum(n.median_s for n in self.unmatched),
            "onnxruntime_fused_away": list(self.fused_away),
            "fused_away_note": ("ONNX nodes outside xfc's layers that onnxruntime ran inside other nodes (not in its "
                                "profile); when fused into a matched node, that node's time covers more work than the "
                                "xfc layer's") if self.fused_away else None,
        }


def time_layers(net: MappedNetwork, kernels: Mapping, feeds: Mapping[str, np.ndarray], *, repeats: int, warmup: int,
                progress: Optional[Callable[[str], None]] = None) -> dict:
    """spec -> LayerTiming, each distinct kernel timed once on its first layer's weights and input.
    The input is the layer's real input when the network ran (values), else the feeds' seeded values."""
    say = progress or (lambda msg: None)
    values = values_of_one_run(net, kernels, feeds)
    timings = {}
    for layer in net.layers:
        if layer.spec in timings:
            continue
        kernel = kernels[layer.spec]
        x, _, b, _ = _layer_inputs(layer, values, _NoErrors())
        say(f"bench: {kernel.name} ({len(timings) + 1}/{len(kernels)}), {repeats} runs")
        if b is None:
            timings[layer.spec] = backend.time_layer(kernel, x, layer.weight, layer.bias, repeats=repeats,
                                                     warmup=warmup, prepacked=True)
        else:
            timings[layer.spec] = backend.time_layer(kernel, x, b, layer.bias, repeats=repeats, warmup=warmup,
                                                     prepacked=False)
    return timings


def values_of_one_run(net: MappedNetwork, kernels: Mapping, feeds: Mapping[str, np.ndarray]) -> dict:
    """Every tensor of one run of the network (xfc kernels + onnx.reference), none freed: each
    layer is then timed on the input it sees in the network."""
    loaded = net.loaded
    values = {**loaded.constants, **feeds}
    no_errors = _NoErrors()
    for step in net.steps:
        if isinstance(step, Layer):
            kernel = kernels[step.spec]
            x, _, b, _ = _layer_inputs(step, values, no_errors)
            out = kernel.run_packed(x, kernel.prepack(step.weight), step.bias) if b is None else kernel(x, b, step.bias)
            values[step.output] = out.reshape(step.out_shape)
        else:
            node = step.node
            outs = run_node(node, {n: values[n] for n in node.input if n}, loaded.opset)
            values.update(zip([n for n in node.output if n], outs))
    return values


class _NoErrors(dict):
    """run._layer_inputs reads error bounds too; timing needs none."""

    def __missing__(self, key):
        return None


def profile_onnxruntime(net: MappedNetwork, feeds: Mapping[str, np.ndarray], *, threads: int, repeats: int,
                        warmup: int) -> tuple[list[ProfiledNode], str]:
    """Per-node median kernel times of onnxruntime running the original model (module docstring)."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise ToolchainError("--bench compares with onnxruntime, which is not installed: pip install onnxruntime") from None
    with tempfile.TemporaryDirectory(prefix="xfc-ort-profile-") as tmp:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(tmp, "ort")
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        try:
            session = ort.InferenceSession(net.loaded.model.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
            for _ in range(warmup + repeats):
                session.run(None, dict(feeds))
        except Exception as exc:
            raise OperatorError(f"{net.loaded.path}: onnxruntime cannot run the model: "
                                f"{' '.join(str(exc).split())[:240]}") from None
        path = session.end_profiling()
        with open(path) as f:
            events = json.load(f)
    durations: dict[str, list[float]] = {}
    ops: dict[str, str] = {}
    for event in events:
        name = event.get("name", "")
        if event.get("cat") == "Node" and name.endswith("_kernel_time"):
            node = name[:-len("_kernel_time")]
            durations.setdefault(node, []).append(float(event["dur"]) * 1e-6)
            ops[node] = event.get("args", {}).get("op_name", "?")
    nodes = [ProfiledNode(name=n, op_type=ops[n], median_s=statistics.median(d[warmup:] or d))
             for n, d in durations.items()]
    label = (f"onnxruntime {ort.__version__} CPUExecutionProvider, default graph optimizations, "
             f"{threads} intra-op thread{'s' if threads != 1 else ''}, per-node profiler")
    return nodes, label


def _keys(net: MappedNetwork, groups) -> dict[str, str]:
    """Names onnxruntime may give the nodes of each group (name, onnx nodes) -> the group's name: a
    node's own name, its outputs, and for a node the model leaves unnamed the one onnxruntime gives
    it, '<op type>_<index in the graph>' (a classifier 'Gemm_6' of an exporter that names no node
    matched no layer, and unnamed pooling nodes were reported as fused away although they ran). The
    index counts the nodes onnxruntime keeps: it turns Constant nodes into initializers first."""
    kept = [n for n in net.loaded.model.graph.node if not (n.op_type == "Constant" and n.domain in ("", "ai.onnx"))]
    unnamed = {tuple(n.output): f"{n.op_type}_{i}" for i, n in enumerate(kept) if not n.name}
    keys = {}
    for group, nodes in groups:
        for node in nodes:
            for name in [node.name or unnamed.get(tuple(node.output), ""), *[o for o in node.output if o]]:
                if name:
                    keys.setdefault(name, group)
    return keys


def _candidates(profiled_name: str) -> list[str]:
    name = profiled_name[len("fused "):] if profiled_name.startswith("fused ") else profiled_name
    candidates = [name] + ([name[:-len("_nchwc")]] if name.endswith("_nchwc") else [])
    while "/" in name:                           # 'fc3/MatMulAddFusion' -> 'fc3' (names may hold '/')
        name = name.rsplit("/", 1)[0]
        candidates.append(name)
    return candidates


def match_profiled(net: MappedNetwork, profiled) -> tuple[dict[str, list], list]:
    """layer name -> the profiled nodes that ran its ONNX nodes; and the nodes that match no layer."""
    keys = _keys(net, ((layer.name, layer.onnx_nodes) for layer in net.layers))
    per_layer: dict[str, list] = {}
    unmatched = []
    for node in profiled:
        layer = next((keys[c] for c in _candidates(node.name) if c in keys), None)
        if layer is None:
            unmatched.append(node)
        else:
            per_layer.setdefault(layer, []).append(node)
    return per_layer, unmatched


def fused_away(net: MappedNetwork, profiled) -> tuple[str, ...]:
    """Nodes xfc leaves to onnx.reference that onnxruntime's profile does not show: it fused them into
    another node (e.g. a residual Add and Relu into an NCHWc Conv), whose time then covers them."""
    keys = _keys(net, ((u.name, [u.node]) for u in net.uncovered))
    seen = {keys[c] for node in profiled for c in _candidates(node.name) if c in keys}
    return tuple(u.name for u in net.uncovered if u.name not in seen)


def bench_network(net: MappedNetwork, kernels: Mapping, *, threads: int, repeats: int = 20, warmup: int = 3,
                  seed: int = 0, compare: bool = True,
                  progress: Optional[Callable[[str], None]] = None) -> NetworkBench:
    """Time the layers; with compare, profile onnxruntime on this machine and match its nodes."""
    say = progress or (lambda msg: None)
    feeds = make_feeds(net, seed)
    timings = time_layers(net, kernels, feeds, repeats=repeats, warmup=warmup, progress=progress)
    profiled, label = [], None
    if compare:
        say(f"bench: onnxruntime, {warmup} + {repeats} runs with its profiler ({threads} threads)")
        profiled, label = profile_onnxruntime(net, feeds, threads=threads, repeats=repeats, warmup=warmup)
    per_layer, unmatched = match_profiled(net, profiled)
    layers = []
    for layer in net.layers:
        nodes = per_layer.get(layer.name, [])
        layers.append(LayerBench(name=layer.name, kernel=kernels[layer.spec].name,
                                 xfc_s=timings[layer.spec].median_s,
                                 onnxruntime_s=sum(n.median_s for n in nodes) if nodes else None,
                                 onnxruntime_nodes=tuple(n.name for n in nodes)))
    where = ", ".join(sorted({t.where for t in timings.values()}))
    known = [t for t in timings.values() if t.throttled is not None]
    return NetworkBench(layers=tuple(layers), unmatched=tuple(unmatched),
                        fused_away=fused_away(net, profiled) if compare else (), threads=threads, repeats=repeats,
                        warmup=warmup, where=where, onnxruntime=label,
                        emulated=any(t.emulated for t in timings.values()),
                        throttled=tuple(kernels[s].name for s, t in timings.items() if t.throttled),
                        throttling_known=bool(known))
