"""The lines `xfc model --emit lib` prints about the network (report.format_report calls network_lines)."""
from __future__ import annotations

from ...ops.accuracy import format_ratio
from ...wording import counted

WEAK_BOUND_SHARE = 0.1
PROFILE_LINES = 8         # --profile: the slowest steps printed (all are in the JSON report)   # an output bound above this share of the output's magnitude is flagged (as report.py does)


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def network_lines(report: dict) -> list[str]:
    net = report.get("network")
    if not net:
        return []
    out = [f"network: {counted(net['steps'], 'step')} in C ({counted(net['kernel_calls'], 'kernel call')} of "
           f"{counted(net['distinct_kernels'], 'distinct kernel')}, {counted(net['runtime_ops'], 'runtime op')}: "
           f"{', '.join(net['ops']) or 'none'}); {counted(net['aliases'], 'alias', 'aliases')} (no copy), "
           f"{counted(net['folded_nodes'], 'node')} folded at load",
           f"  arena {_mib(net['arena_bytes'])} ({net['arena_bytes']} bytes, {net['arena_buffers']} buffers), liveness "
           f"lower bound {net['arena_lower_bound_bytes']} bytes: x{net['arena_to_lower_bound']:.3f}; in place: "
           f"{net['in_place_ops']} ops, {net['residuals_in_place']} residual kernels",
           f"  packed weights {_mib(net['packed_weight_bytes'])}, weights file {_mib(net['weights_file_bytes'])}; "
           f"{net['layout']}"]
    if net.get("weights_planned_from"):
        out.append(f"  weights planned from {net['weights_planned_from']}")
    predicted = net.get("predicted")
    if predicted and predicted["rows"]:
        parts = [f"{r['cluster']} {r['threads']}t {r['dtype']} "
                 + (f"{r['predicted_ms']:.3g} ms" if r["predicted_ms"] is not None else "refused")
                 for r in predicted["rows"]]
        out.append(f"  predicted kernel time (static cost model, not measured; runtime ops not included): "
                   f"{', '.join(parts)}")
    fused = [f for f in net["fusions"] if "fused" in f]
    if fused:
        out.append(f"  fused into kernels: {len(fused)} ({'; '.join(fused[:3])}{'; ...' if len(fused) > 3 else ''})")
    v = report.get("verification")
    if v is not None:
        out.append(f"verified: {'yes' if v['verified'] else 'NO'} on {v['verified_on']} against {v['reference']}")
        steps = v["steps"]
        kinds = sorted({s["bound_kind"] for s in steps})
        if v.get("dtype") == "int8":
            out += _int8_verification_lines(v)
        else:
            out.append(f"  steps: {len(steps) - len(v['layers_failed'])} of {len(steps)} match their ONNX nodes (float64, "
                       f"on the C network's own inputs) within the local bound (worst "
                       f"{format_ratio(v['worst_layer_ratio'])}x; bounds: {', '.join(kinds)})"
                       + (f"; failed: {', '.join(v['layers_failed'][:5])}" if v["layers_failed"] else ""))
        for c in (v["outputs"] if v.get("dtype") != "int8" else ()):
            share = c["max_bound"] / c["max_abs_output"] if c["max_abs_output"] else float("inf")
            out.append(f"  output '{c['name']}': max abs error {c['max_abs_error']:.3g} vs onnxruntime, {c['bound_kind']} "
                       f"bound {c['max_bound']:.3g} ({format_ratio(c['error_to_bound_ratio'])}x of it; the bound is "
                       f"{share * 100:.2g}% of the largest |output|"
                       + (", weak: the worst case grows with depth, the per-step checks are the sharp ones)"
                          if share > WEAK_BOUND_SHARE else ")")
                       + (f"; capped at the heuristic tolerance where the derived worst case, up to "
                          f"{c['derived_max_bound']:.3g}, is looser" if c.get("derived_max_bound") is not None else ""))
        for a in v.get("agreement_with_fp32", ()):
            rows = (f"; argmax agrees on {a['argmax_agree']} of {a['argmax_rows']} row{'s' if a['argmax_rows'] != 1 else ''}"
                    if "argmax_rows" in a else "")
            out.append(f"  {v['dtype']} vs the fp32 model, output '{a['name']}' (measured): largest error "
                       f"{a['relative_to_largest_output'] * 100:.2g}% of the largest |output|{rows}")
        if v["ops_without_error_rule"]:
            out.append(f"  no error rule for: {', '.join(v['ops_without_error_rule'])} (heuristic tolerance, labelled)")
    b = report.get("network_bench")
    if b:
        x = b["xfc"]
        threads = f"{b['threads']} thread{'s' if b['threads'] != 1 else ''}" + (
            f", idle threads {'sleep' if b['thread_wait'] == 'passive' else 'spin'}" if b["threads"] > 1 else "")
        line = (f"bench: xfc {x['median_ms']:.4g} ms (median of {b['rounds']} round medians, {b['runs']} runs each, "
                f"p10 {x['p10_ms']:.4g}, p90 {x['p90_ms']:.4g}; {threads}) on {x['measured_on']}")
        out.append(line + (" -- EMULATED: not phone timing" if x["emulated"] else ""))
        telemetry = x.get("telemetry")
        if telemetry:
            throttled = telemetry.get("throttled")
            out.append(f"  device: {'; '.join(telemetry.get('notes') or [])}; throttling: "
                       + ("unknown" if throttled is None else "seen" if throttled else "none seen"))
        if b["onnxruntime"]:
            o = b["onnxruntime"]
            out.append(f"  onnxruntime {o['median_ms']:.4g} ms ({o['label']}): xfc is {b['speedup']:.3g}x onnxruntime "
                       f"(> 1: faster)")
        out.append(f"  note: {b['note']}")
        prof = b.get("profile")
        if prof:
            top = sorted(prof["steps"], key=lambda s: -s["ms"])[:PROFILE_LINES]
            out.append(f"  profile: {len(prof['steps'])} steps sum to {prof['steps_sum_ms']:.4g} ms (median of each; a "
                       f"separate set of runs); the slowest {len(top)}:")
            for s in top:
                rate = f", {s['gflops']:.1f} GFLOP/s" if s.get("gflops") else ""
                out.append(f"    step {s['step']:3d} {s['ms']:8.4f} ms {s['share'] * 100:5.1f}%  {s['what']}{rate}  ({s['name']})")
    return out


def _int8_verification_lines(v: dict) -> list[str]:
    steps = v["steps"]
    out = [f"  steps: {len(steps) - len(v['layers_failed'])} of {len(steps)} equal xfc's int8 oracle byte for byte "
           f"(on the C network's own inputs)" + (f"; differ: {', '.join(v['layers_failed'][:5])}"
                                                 if v["layers_failed"] else "")]
    for c, a in zip(v["outputs"], v.get("agreement_with_onnxruntime", ())):
        rows = (f"; argmax agrees on {a['argmax_agree']} of {a['argmax_rows']}" if "argmax_rows" in a else "")
        out.append(f"  output '{c['name']}' vs onnxruntime on the same quantized model: largest difference "
                   f"{c['max_abs_error']:.3g} LSB, {a['share_beyond_1_lsb'] * 100:.3g}% of elements beyond 1 LSB "
                   f"(rule: at most 0.1%){rows}")
    return out


def format_quantized(report: dict) -> list[str]:
    """The head of `xfc model` on a quantized model: what was read and the int8 kernel of each layer."""
    q = report["quantized"]
    out = [f"xfc model {report['model']} for {report['hardware']}: an int8 model ({q['read']}; "
           f"{q['activation_type']} activations)"]
    rows = [[", ".join(k["steps"][:2]) + (f" +{len(k['steps']) - 2}" if len(k["steps"]) > 2 else ""), k["spec"],
             k["kernel"], f"{k['synthesis_ms']:.2f}"] for k in report["int8_kernels"]]
    widths = [max(len(r[i]) for r in rows + [["steps", "spec", "int8 kernel", "synth ms"]]) for i in range(4)]
    for r in [["steps", "spec", "int8 kernel", "synth ms"]] + rows:
        out.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return out
