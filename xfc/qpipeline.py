"""The int8 CPU pipeline behind `xfc synth ... --dtype int8`: plan (xfc.cpu.qplans) -> render
(xfc.cpu.qcodegen) -> build (xfc.build.cpu.build_host) -> verify / time in process
(xfc.runners.qhost) -> report, with outputs written through xfc.outputs like the fp32 pipeline.

Verification runs both entry points (weights packed per call, and pre-packed once) on the
deterministic inputs of xfc.ops.quant.make_qinputs and compares them byte for byte with the exact
reference; the report carries the exact-match share, the largest difference in LSB and the share
of saturated outputs. x86-64 hosts build a shared object run in process; AArch64 descriptions
(xfc/cpu/qarm.py: sdot / smmla) build a static harness program run under qemu-aarch64 with the
core's qemu_cpu (xfc.runners.qqemu; correctness only, never timed). A core without dotprod is
refused before anything is written.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from .build.cpu import build_arm, build_host
from .cpu.qcodegen import render_int8_kernel
from .cpu.qplans import explain, plan_int8
from .errors import VerificationError
from .ops.quant import QuantParams, check_qoutput, make_qinputs, multipliers
from .outputs import OutputDir
from .pipeline import Report, measurement_dict, report_core
from .runners.qhost import QHostKernel
from .runners.qqemu import QQemuKernel

CPUINFO = Path("/proc/cpuinfo")


def host_flags(path: Path = CPUINFO) -> frozenset:
    """The /proc/cpuinfo flags of this machine (empty when unreadable): read at the edge and passed
    into the pure planner, which needs avx512_vnni that the host description does not list."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def compile_int8(spec, quant: QuantParams, hw, out_dir: Path, *, cluster=None, threads=None, flags=None,
                 force_dialect=None, force_tile=None, force_rows=None):
    """Plan, render and build into out_dir (an existing directory the caller owns); (plan, kernel)."""
    plan = plan_int8(spec, quant, hw, cluster=cluster, threads=threads,
                     host_flags=host_flags() if flags is None else flags, force_dialect=force_dialect,
                     force_tile=force_tile, force_rows=force_rows)
    rendered = render_int8_kernel(plan)
    return plan, build_kernel(rendered, out_dir)


def build_kernel(rendered, out_dir: Path):
    """The runnable kernel: the host .so in process, or the aarch64 harness under qemu."""
    plan = rendered.plan
    if plan.target_arch == "aarch64":
        return QQemuKernel(rendered, build_arm(rendered, out_dir), plan.qemu_cpu)
    return QHostKernel(rendered, build_host(rendered, out_dir))


def verified_on(plan) -> str:
    return f"qemu-aarch64 -cpu {plan.qemu_cpu or 'max'}" if plan.target_arch == "aarch64" else "host (native)"


def verify_kernel(kernel: QHostKernel, seed: int = 0, mode: str = "random") -> dict:
    """Run both entry points on make_qinputs(seed, mode); the merged verdict as a dict."""
    plan = kernel.plan
    spec, q = plan.spec, plan.quant
    x, w, bias = make_qinputs(spec, q, seed, mode)
    mult = multipliers(spec, q)
    verdicts = [check_qoutput(spec, q, out, x, w, bias) for out in (kernel(x, w, bias, mult),
                                                                    kernel.run_packed(x, w, bias, mult))]
    worst = min(verdicts, key=lambda v: (v.ok, v.exact_share))
    return {**worst.as_dict(), "entry_points": ["packed per call", "pre-packed"]}


def run_int8(spec, quant: QuantParams, hw, out_dir: Path, *, cluster=None, threads=None, verify=False,
             bench=False, repeat=20, seed=0, progress=None, force=False) -> Report:
    say = progress or (lambda msg: None)
    start = time.perf_counter()
    plan = plan_int8(spec, quant, hw, cluster=cluster, threads=threads, host_flags=host_flags())
    synth_s = time.perf_counter() - start
    say(f"planned in {synth_s * 1e3:.1f} ms: int8 {plan.qisa} tile {plan.mr}x{plan.nr}")
    arm = plan.target_arch == "aarch64"
    rendered = render_int8_kernel(plan)
    tiles = {"mr": plan.mr, "nr": plan.nr} if plan.lowering != "direct_depthwise" else None
    report = {**report_core("synth", "cpu", spec, hw.name, tiles, plan.predicted_gops),
              "dtype": "int8", "quantization": plan.quant.as_dict(), "dialect": plan.qisa, "lowering": plan.lowering,
              "tile_summary": plan.summary(), "threads": plan.threads, "synthesis_seconds": synth_s,
              "predicted_bound": "compute (int8 issue model)", "explain": explain(plan),
              "exact_share": None, "max_lsb": None}
    timing = per_call = None
    with OutputDir(Path(out_dir), what=f"xfc synth {spec.key()} int8 for {hw.name} (cpu)", force=force) as staging:
        t0 = time.perf_counter()
        kernel = build_kernel(rendered, staging.path)
        report["build_seconds"] = time.perf_counter() - t0
        say(f"built in {report['build_seconds']:.2f} s ({'aarch64-linux-gnu-gcc -static' if arm else 'host gcc'})")
        if arm and (verify or bench):
            say(f"running under qemu-aarch64 -cpu {plan.qemu_cpu or 'max'} ...")
        if verify or bench:
            try:
                verdict = verify_kernel(kernel, seed)
                report.update(verified=verdict["ok"], failure=verdict["reason"], exact_share=verdict["exact_share"],
                              max_lsb=verdict["max_lsb"], saturated_share=verdict["saturated_share"],
                              max_abs_error=float(max(verdict["max_lsb"], 0)), error_to_bound_ratio=None,
                              verified_on=verified_on(plan))
            except VerificationError as exc:
                report.update(verified=False, failure=str(exc), verified_on=verified_on(plan))
            if bench and report["verified"] and not arm:   # the CLI refuses --bench for ARM int8
                x, w, bias = make_qinputs(spec, plan.quant, seed)
                mult = multipliers(spec, plan.quant)
                per_call = kernel.time(x, w, bias, mult, repeats=repeat, prepacked=False)
                timing = kernel.time(x, w, bias, mult, repeats=repeat, prepacked=True)
                report["measurement"] = measurement_dict(timing, "pre-packed once (untimed)")
                report["measurement_packing_per_call"] = measurement_dict(per_call, "packed inside every call")
        (staging.path / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        staging.commit()
    if report.get("verified") is False:
        raise VerificationError(f"{spec.name} int8 kernel for {hw.name} failed verification against the exact "
                                f"reference ({report['failure']}); outputs kept in {out_dir}")
    return Report.of("cpu", report, hardware=hw.name, measurement=timing, per_call=per_call, output_dir=str(out_dir))


def summary_lines(report: dict) -> list[str]:
    """The int8 lines `xfc synth` prints after the common summary."""
    q = report["quantization"]
    lines = [f"  int8: {report['dialect']} dialect, {q['act_type']} activations (zp {q['a_zero_point']}), int8 weights "
             f"({'per-channel' if q['per_channel'] else 'per-tensor'} scales), output zp {q['out_zero_point']}"]
    if report.get("verified") is not None and report.get("exact_share") is not None:
        lines.append(f"  exact match: {report['exact_share'] * 100:.2f}% of outputs (max {report['max_lsb']} LSB off; "
                     f"{report.get('saturated_share', 0) * 100:.1f}% at the clamp bounds)")
    return lines

