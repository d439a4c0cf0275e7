"""The `xfc model` report: a JSON-ready dict, and the table and summary lines printed from it."""
from __future__ import annotations

from dataclasses import asdict
from typing import Mapping, Optional

from .._version import __version__
from ..ops.accuracy import format_ratio
from ..wording import counted
from ..ops.spec import Conv2dSpec, DepthwiseSpec, MatmulSpec
from .coverage import Coverage, nothing_covered
from .runtime.report import network_lines

PREDICTION_NOTE = ("predicted by xfc's cost model (static: register/cache model only; calibrated: micro-tiles "
                   "scored from a measured tile database), not a measurement")
BOUND_NOTE = ("each layer's output is checked against its original ONNX nodes run in float64 by onnx.reference "
              "under the layer's local bound gamma_(K+2+f) (|W||x| + |b|); the graph outputs are compared with "
              "onnxruntime under 2 e, e propagated from the per-layer bounds through the network by |W| and the "
              "other nodes' rules (xfc/model/bounds.py). e grows with depth (worst-case alignment), so on deep "
              "networks the per-layer checks are the sharp ones")
WEAK_BOUND_SHARE = 0.1   # an output bound above this share of the output's magnitude is flagged as weak


def short_shape(spec) -> str:
    """A compact shape for the table: '1x32x56x56 -> 64 3x3/2 p1', 'dw 1x32x56x56 3x3/1 p1', 'M=1 N=10 K=64'."""
    if isinstance(spec, MatmulSpec):
        return (f"{spec.batch}x " if spec.batch != 1 else "") + f"M={spec.m} N={spec.n} K={spec.k}"
    pads = {spec.pad_top, spec.pad_left, spec.pad_bottom, spec.pad_right}
    pad = f"p{spec.pad_top}" if len(pads) == 1 else f"p{spec.pad_top},{spec.pad_left},{spec.pad_bottom},{spec.pad_right}"
    stride = f"{spec.stride_h}" if spec.stride_h == spec.stride_w else f"{spec.stride_h}x{spec.stride_w}"
    dil = "" if spec.dilation_h == spec.dilation_w == 1 else f" d{spec.dilation_h}x{spec.dilation_w}"
    image = f"{spec.n}x{spec.c}x{spec.h}x{spec.w}"
    if isinstance(spec, DepthwiseSpec):
        return f"{image} dw {spec.r}x{spec.s}/{stride} {pad}{dil}"
    assert isinstance(spec, Conv2dSpec)
    return f"{image} -> {spec.k} {spec.r}x{spec.s}/{stride} {pad}{dil}"


def build_report(net, cov: Coverage, syntheses: Mapping, names: Mapping, *, hw, cluster: Optional[str],
                 threads: Optional[int], kernels: Optional[Mapping] = None, verification=None,
                 explain: bool = False, target: str = "cpu", bench=None) -> dict:
    """Everything `xfc model` knows, JSON-ready (tuples become lists)."""
    loaded = net.loaded
    first = next(iter(syntheses.values()), None)
    chosen = hw.cluster(cluster) if target == "gpu" or first is None else first.result.cluster
    checks = {c.name: c for c in verification.layers} if verification else {}
    timed = {b.name: b for b in bench.layers} if bench else {}
    layers = []
    for layer in net.layers:
        syn = syntheses[layer.spec]
        check = checks.get(layer.name)
        timing = timed.get(layer.name)
        layers.append({
            "node": layer.name, "op": layer.label, "nodes": list(layer.nodes), "notes": list(layer.notes),
            "xfc_operator": layer.spec.name, "kernel": names[layer.spec], "key": layer.spec.key(),
            "shape": short_shape(layer.spec), "spec": layer.spec.describe(), "tiles": syn.tiles,
            "flops": layer.flops, "predicted_seconds": syn.predicted_s, "prediction_source": syn.source,
            "measured_seconds": timing.xfc_s if timing else None,
            "onnxruntime_seconds": timing.onnxruntime_s if timing else None,
            "onnxruntime_nodes": list(timing.onnxruntime_nodes) if timing else None,
            "max_abs_error": check.max_abs_error if check else None,
            "error_to_bound_ratio": check.error_to_bound_ratio if check else None,
        })
    distinct = []
    for spec, syn in syntheses.items():
        entry = {"kernel": names[spec], "key": spec.key(), "spec": spec.describe(), "shape": short_shape(spec),
                 "instances": sum(1 for layer in net.layers if layer.spec == spec),
                 "synthesis_seconds": syn.seconds, "tiles": syn.tiles, **syn.details(),
                 "predicted_seconds": syn.predicted_s, "prediction_source": syn.source}
        if kernels and spec in kernels:
            entry["files"] = [p.name for p in kernels[spec].files]
            entry["build_seconds"] = kernels[spec].build_seconds
        if explain:
            entry["explain"] = syn.result.explain()
        distinct.append(entry)
    synthesis_s = sum(s.seconds for s in syntheses.values())
    report = {
        "xfc_report": 1, "xfc_version": __version__, "kind": "model", "model": loaded.path, "opset": loaded.opset,
        "hardware": hw.name, "target": target, "cluster": chosen.role, "core": chosen.core.name,
        "threads": threads or chosen.count, "gpu": hw.gpu.name if target == "gpu" else None,
        "inputs": {name: list(shape) for name, shape, _ in loaded.inputs}, "outputs": list(loaded.outputs),
        "layers": layers, "distinct_layers": distinct,
        "uncovered": [{"node": u.name, "op": u.op_type, "reason": u.reason, "flops": u.flops} for u in net.uncovered],
        "uncovered_by_op": [asdict(g) for g in cov.uncovered],
        "flops": {"total": cov.total_flops, "covered": cov.covered_flops, "covered_share": cov.covered_share,
                  "not_counted_ops": list(cov.not_counted_ops),
                  "definition": "additions and multiplications (multiply-add = 2), xfc/model/coverage.py"},
        "nodes": {"mapped": cov.nodes, "covered": cov.covered_nodes, "layers": cov.layers,
                  "distinct_layers": cov.distinct_layers},
        "predicted_covered_seconds": sum(syntheses[layer.spec].predicted_s for layer in net.layers),
        "prediction_sources": sorted({s.source for s in syntheses.values()}),
        "prediction_note": PREDICTION_NOTE,
        "synthesis_seconds": synthesis_s,
        "synthesis_ms_per_distinct_layer": (synthesis_s * 1e3 / len(syntheses)) if syntheses else 0.0,
        "build_seconds": sum(k.build_seconds for k in kernels.values()) if kernels else None,
        "measured": "timed: see bench" if bench else "not timed (add --bench: --hw host, or an ARM description with --device)",
        "bench": bench.to_dict() if bench else None,
        "verification": None,
        "nothing_covered": None if net.layers else nothing_covered(cov),
    }
    if verification is not None:
        report["verification"] = {
            "verified": verification.ok, "verified_on": verification.where, "reference": verification.reference,
            "seed": verification.seed, "bound": BOUND_NOTE,
            "outputs": [{**asdict(c), "ok": c.ok} for c in verification.outputs],
            "layers_checked": len(verification.layers),
            "layers_failed": [c.name for c in verification.layers if not c.ok],
            "worst_layer_ratio": max((c.error_to_bound_ratio for c in verification.layers), default=0.0),
            "nodes_run_by_onnx_reference": verification.reference_nodes,
            "ops_without_error_rule": list(verification.no_rule_ops),
        }
    return report


def _table(rows: list[list[str]], header: list[str], right: set[int]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]

    def line(cells):
        return "  ".join(str(c).rjust(w) if i in right else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    return [line(header), "  ".join("-" * w for w in widths)] + [line(r) for r in rows]


def _mflop(flops) -> str:
    return "-" if flops is None else f"{flops / 1e6:.2f}"


def format_report(report: dict, explain: bool = False) -> str:
    """The per-layer table and the summary lines, for people."""
    if report.get("quantized"):
        from .runtime.report import format_quantized
        out = format_quantized(report) + network_lines(report)
        return "\n".join(out + _library_lines(report))
    if report.get("target") == "gpu":
        where = f"gpu: {report['gpu']}, OpenCL"
    else:
        where = (f"cpu, {report['cluster']} cluster: {report['core']}, {report['threads']} "
                 f"thread{'s' if report['threads'] != 1 else ''}")
    out = [f"xfc model {report['model']} for {report['hardware']} ({where}; opset {report['opset']})"]
    if explain:
        for d in report["distinct_layers"]:
            out += ["", f"[{d['kernel']}] used by {d['instances']} layer{'s' if d['instances'] != 1 else ''}",
                    d.get("explain", "")]
        out.append("")
    verified = report["verification"] is not None
    bench = report.get("bench")
    rows = []
    for layer in report["layers"]:
        row = [layer["node"], layer["op"], layer["kernel"], layer["shape"], layer["tiles"], _mflop(layer["flops"]),
               f"{layer['predicted_seconds'] * 1e3:.4g}", layer["prediction_source"]]
        if verified:
            ratio = layer["error_to_bound_ratio"]
            row.append("-" if ratio is None else format_ratio(ratio))
        if bench:
            ort = layer["onnxruntime_seconds"]
            row.append(f"{layer['measured_seconds'] * 1e3:.4g}")
            if bench["onnxruntime"]:
                row.append("-" if ort is None else f"{ort * 1e3:.4g}")
        rows.append(row)
    header = (["node", "op", "kernel", "shape", "tiles", "MFLOP", "pred ms", "source"] + (["err/bound"] if verified else [])
              + ((["xfc ms", "ort ms"] if bench["onnxruntime"] else ["xfc ms"]) if bench else []))
    out += _table(rows, header, right=set(range(5, len(header))) - {7}) if rows else ["(no layer xfc can synthesize)"]
    f = report["flops"]
    n = report["nodes"]
    out.append("")
    out.append(f"covered: {f['covered_share'] * 100:.1f}% of {f['total'] / 1e6:.2f} MFLOP "
               f"({n['covered']} of {n['mapped']} nodes in {n['layers']} xfc layers, {n['distinct_layers']} "
               f"distinct kernels)")
    if f["not_counted_ops"]:
        out.append(f"  FLOPs not counted for: {', '.join(f['not_counted_ops'])}")
    if report.get("network"):   # --emit lib: every node runs in C, as a kernel, a runtime op or fused
        if report["uncovered_by_op"]:
            out.append("  not an xfc kernel (in C as runtime ops, aliases or fused epilogues): " + ", ".join(
                f"{g['op_type']} x{g['count']}" for g in report["uncovered_by_op"]))
    else:
        for g in report["uncovered_by_op"]:
            out.append(f"  not covered: {g['op_type']} x{g['count']} ({_mflop(g['flops'])} MFLOP): "
                       + "; ".join(g["reasons"]))
    if not report["layers"]:
        out.append(f"note: nothing covered: {report['nothing_covered']}")
    out.append(f"predicted time of the covered part: {report['predicted_covered_seconds'] * 1e3:.4g} ms "
               f"({'/'.join(report['prediction_sources']) or 'static'} cost model, not a measurement)")
    line = (f"synthesis: {counted(n['distinct_layers'], 'distinct layer')} in {report['synthesis_seconds'] * 1e3:.1f} ms "
            f"({report['synthesis_ms_per_distinct_layer']:.1f} ms per distinct layer)")
    if report["build_seconds"] is not None:
        line += f"; build: {report['build_seconds']:.1f} s"
    out.append(line)
    if bench and not bench["onnxruntime"]:
        throttled = bench["throttled_kernels"]
        out.append(f"measured (median of {bench['repeats']}) on {bench['xfc_measured_on']}: covered part "
                   f"{bench['xfc_covered_seconds'] * 1e3:.4g} ms over {bench['layers']} layers"
                   + (" (EMULATED: not phone timing)" if bench["emulated"] else "")
                   + ("; throttling: unknown" if throttled is None else
                      f"; throttled during: {', '.join(throttled)}" if throttled else "; throttling: none seen"))
        out.append(f"  note: {bench['note']}")
    elif bench:
        out.append(f"measured (median of {bench['repeats']}, {bench['threads']} thread{'s' if bench['threads'] != 1 else ''}; "
                   f"xfc on {bench['xfc_measured_on']}; {bench['onnxruntime']}):")
        out.append(f"  covered part: xfc {bench['xfc_covered_seconds'] * 1e3:.4g} ms over {bench['layers']} layers; on the "
                   f"{bench['layers_matched']} layers matched to onnxruntime nodes: xfc {bench['xfc_matched_seconds'] * 1e3:.4g} ms, "
                   f"onnxruntime {bench['onnxruntime_matched_seconds'] * 1e3:.4g} ms")
        if bench["onnxruntime_unmatched"]:
            ops = sorted({n["op"] for n in bench["onnxruntime_unmatched"]})
            out.append(f"  onnxruntime nodes not matched to an xfc layer: {len(bench['onnxruntime_unmatched'])} "
                       f"({', '.join(ops)}), {bench['onnxruntime_unmatched_seconds'] * 1e3:.4g} ms")
        if bench["onnxruntime_fused_away"]:
            out.append(f"  onnxruntime fused into other nodes (their time included there): "
                       f"{', '.join(bench['onnxruntime_fused_away'])}")
        out.append(f"  note: {bench['note']}")
    out += network_lines(report)
    v = report["verification"]
    if v is not None and not report.get("network"):
        parts = [f"verified: {'yes' if v['verified'] else 'NO'} on {v['verified_on']} against {v['reference']}"]
        parts.append(f"  layers: {v['layers_checked'] - len(v['layers_failed'])} of {v['layers_checked']} match "
                     f"their ONNX nodes (float64) within the local bound (worst {format_ratio(v['worst_layer_ratio'])}x)"
                     + (f"; failed: {', '.join(v['layers_failed'])}" if v["layers_failed"] else ""))
        for c in v["outputs"]:
            share = c["max_bound"] / c["max_abs_output"] if c["max_abs_output"] else float("inf")
            parts.append(f"  output '{c['name']}': max abs error {c['max_abs_error']:.3g} vs onnxruntime, "
                         f"{c['bound_kind']} bound {c['max_bound']:.3g} ({format_ratio(c['error_to_bound_ratio'])}x of it; the "
                         f"bound is {share * 100:.2g}% of the largest |output|"
                         + (", weak: see the per-layer checks)" if share > WEAK_BOUND_SHARE else ")")
                       + (f"; capped at the heuristic tolerance where the derived worst case, up to "
                          f"{c['derived_max_bound']:.3g}, is looser" if c.get("derived_max_bound") is not None else ""))
        if v["ops_without_error_rule"]:
            parts.append(f"  no error rule for: {', '.join(v['ops_without_error_rule'])} (outputs after them use a "
                         f"heuristic tolerance)")
        out += parts
    return "\n".join(out + _library_lines(report))


def _library_lines(report: dict) -> list[str]:
    out = []
    lib = report.get("library")
    if lib:
        out.append(f"library: {lib['library']} ({lib['abi']}, the network runtime and {counted(lib['functions'], 'kernel')}, built "
                   f"with {lib['compiler']}); {lib['header']}, {lib['weights']}, {lib['benchmark_source']}, "
                   f"{lib['cmake']} (add_subdirectory; target {lib['cmake_target']}; builds {lib['benchmark_program']}), "
                   f"{lib['manifest']}")
    if report.get("output_dir"):
        out.append(f"output: {report['output_dir']}")
    return out
