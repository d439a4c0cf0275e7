"""`xfc model NET.onnx --emit lib [--verify] [--bench]`: the whole network as a C library.

    load -> lower (fold, map, runtime ops, fusion; lower.py) -> synthesize every distinct kernel ->
    plan the arena and render (arena.py, emit.py) -> compile the library for the description's ABI ->
    [build the benchmark program: natively, or static for aarch64] -> [--verify: run it with step
    dumps where the network runs -- host, qemu-aarch64, a device -- and check it (check.py)] ->
    [--bench: time it; on the host beside onnxruntime's whole session.run, same inputs and threads]
    -> report, into the output directory (xfc.outputs.OutputDir).
"""
from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from ...errors import OperatorError
from ...outputs import OutputDir
from .. import backend
from ..coverage import coverage
from ..load import load_model
from ..quantized import is_quantized
from ..report import build_report
from ..run import make_feeds, run_onnxruntime
from .emit import build_program, emit_network_library, render_network
from .lower import lower_network
from .program import spec_of

BENCH_ROUNDS = 3     # program and onnxruntime alternate this many times; the medians' median is reported


def kernel_names(keys) -> dict:
    """k01_conv2d, k02_depthwise, ... in order of first use (keys: specs, or KernelStep.kernel_key)."""
    return {key: f"k{i:02d}_{spec_of(key).name}" for i, key in enumerate(keys, start=1)}


def weights_read_from_memory(program, hw, cluster=None) -> tuple[bool, int, int]:
    """(whether, weight bytes, cache bytes): whether every kernel of the network finds its weights in
    DRAM on each inference, planned so (synthesize_cpu(weights_from_memory=True)): the network's
    constant weights exceed the largest cache its cores share (L3, else the system cache, else the
    cluster's L2), so between two calls of one layer the others' weights pass through it. Today
    this moves only Winograd plans, whose transformed filter is priced as a cold stream
    (docs/winograd.md)."""
    weight_bytes = 0
    for step in program.kernel_steps:
        if step.weight_tensor is None:      # a MatMul whose B the network computes has no constant weights
            weight_bytes += math.prod(spec_of(step.kernel_key).operand_shapes[1]) * step.groups
    weight_bytes *= program.dtype.element_bytes
    cache_bytes = hw.l3_bytes or hw.slc_bytes or hw.cluster(cluster).l2.size_bytes
    return weight_bytes > cache_bytes, weight_bytes, cache_bytes


def network_summary(lowered, rendered, syntheses, hw=None, cluster=None) -> dict:
    program, plan = lowered.program, rendered.plan
    kernels = program.kernel_steps
    return {
        "steps": len(program.steps), "kernel_calls": len(kernels), "runtime_ops": len(program.steps) - len(kernels),
        "aliases": len(program.aliases), "folded_nodes": len(program.folded),
        "distinct_kernels": len(rendered.functions),
        "arena_bytes": plan.arena_bytes, "arena_lower_bound_bytes": plan.lower_bound_bytes,
        "arena_to_lower_bound": plan.ratio, "arena_buffers": plan.buffers,
        "in_place_ops": len(plan.inplace_steps), "residuals_in_place": len(plan.residual_inplace),
        "packed_weight_bytes": rendered.packed_floats * program.dtype.element_bytes,
        "weights_file_bytes": len(rendered.weights), "dtype": program.dtype.name, "layout": rendered.manifest["layout"],
        "fusions": list(program.notes),
        **({} if hw is None else {"weights_planned_from": weights_planned_from(program, hw, cluster)}),
        "ops": sorted({s.label for s in program.steps if s.kind == "op"}),
        "kernels": [{"function": rendered.functions[key], "spec": spec_of(key).describe(),
                     "lowering": syntheses[key].result.plan.lowering,
                     "winograd_m": int(getattr(syntheses[key].result.plan, "winograd_m", 0) or 0),
                     "tiles": syntheses[key].tiles,
                     "calls": sum(1 for s in kernels if s.kernel_key == key)} for key in rendered.functions],
    }


def weights_planned_from(program, hw, cluster=None) -> str:
    """The report's line on weights_read_from_memory."""
    cold, weight_bytes, cache_bytes = weights_read_from_memory(program, hw, cluster)
    mib = lambda n: f"{n / 2**20:.1f} MiB"  # noqa: E731
    if cold:
        return (f"memory: the weights ({mib(weight_bytes)}) exceed the shared cache ({mib(cache_bytes)}), so every "
                f"kernel is planned to read its weights from DRAM on each inference")
    return (f"cache: the weights ({mib(weight_bytes)}) fit the shared cache ({mib(cache_bytes)}); kernels are planned "
            f"as xfc synth plans them")


def lower_and_synthesize(loaded, name: str, hw, *, cluster=None, threads=None, dtype=None,
                         report_layers: bool = False):
    """(lowered, syntheses): the network's Program (lower.lower_network; a quantized model:
    quantized_program.lower_quantized, int8) and a synthesis per kernel key (KernelStep.kernel_key).
    report_layers: also every distinct layer spec of the mapped network (the per-layer report)."""
    from ...ops.dtypes import FP32
    dtype = dtype or FP32
    if is_quantized(loaded):
        if dtype.name != "fp32":
            raise OperatorError(f"{loaded.path}: --dtype {dtype.name}: a quantized model runs in int8 as it was "
                                f"quantized; --dtype applies to fp32 models")
        from .quantized_program import lower_quantized
        lowered, layer_specs = lower_quantized(loaded, name), ()
    else:
        lowered = lower_network(loaded, name, dtype=dtype)
        layer_specs = lowered.net.distinct_specs() if report_layers else ()
    program = lowered.program
    kernel_keys = program.distinct_kernels()
    cold, _, _ = weights_read_from_memory(program, hw, cluster)
    syntheses = {}
    for key in dict.fromkeys((*layer_specs, *kernel_keys)):
        syntheses[key] = backend.synthesize_layer(spec_of(key), hw, cluster=cluster, threads=threads,
                                                  dtype=program.dtype.name if key in kernel_keys else dtype.name,
                                                  quant=key[1] if isinstance(key, tuple) else None,
                                                  weights_from_memory=cold)
    return lowered, syntheses


def _program_runner(hw, device, runner, cluster):
    from .execute import AdbProgram, HostProgram
    if hw.target_arch == "x86_64":
        return HostProgram()
    if device in (None, "qemu"):
        return None   # qemu: the -cpu model comes from a plan (run_network_model)
    return AdbProgram(runner, hw.cluster(cluster).cpu_ids)


def run_network_model(path, hw, out_dir, *, input_shapes=None, cluster=None, threads=None, verify=False,
                      explain=False, force=False, seed=0, device=None, runner=None, toolchain_env=None,
                      bench=False, repeat=20, embed_weights=False, thread_wait="spin", profile=False,
                      dtype="fp32", progress: Optional[Callable[[str], None]] = None) -> dict:
    """The work behind `xfc model --emit lib` (module docstring); returns the report."""
    from .execute import QemuProgram
    from ...ops.dtypes import dtype_named
    say = progress or (lambda msg: None)
    dtype = dtype_named(dtype)
    what = f"xfc model {Path(path).name} for {hw.name} (network library)"
    with OutputDir(Path(out_dir), what=what, force=force) as staging, \
            tempfile.TemporaryDirectory(prefix="xfc-net-") as scratch:
        scratch = Path(scratch)
        loaded = load_model(path, input_shapes)
        quantized = is_quantized(loaded)
        if dtype.name == "fp16" and not quantized:     # a quantized model is refused for --dtype as such
            from ...cpu.fp16 import check_fp16_target
            check_fp16_target(hw, cluster)
        lowered, syntheses = lower_and_synthesize(loaded, Path(path).stem, hw, cluster=cluster, threads=threads,
                                                  dtype=dtype, report_layers=True)
        program, net = lowered.program, getattr(lowered, "net", None)
        report_specs = net.distinct_specs() if net is not None else ()
        kernel_keys = program.distinct_kernels()
        default_threads = threads or hw.cluster(cluster).count
        names = kernel_names(kernel_keys)
        say(f"lowered {len(program.steps)} steps ({len(program.kernel_steps)} kernel calls, {len(kernel_keys)} distinct "
            f"kernels; {len(program.folded)} nodes folded, {len(program.aliases)} aliases); synthesized in "
            f"{sum(s.seconds for s in syntheses.values()) * 1e3:.1f} ms")
        rendered = render_network(program, syntheses, names, hw, Path(path).stem, embed_weights=embed_weights,
                                  default_threads=default_threads, cluster=cluster)
        say(f"arena {rendered.plan.arena_bytes} bytes, liveness lower bound {rendered.plan.lower_bound_bytes} bytes "
            f"(x{rendered.plan.ratio:.3f}); packed weights {rendered.packed_floats * program.dtype.element_bytes} bytes "
            f"({program.dtype})")
        library, built = emit_network_library(rendered, hw, staging.path, scratch, env=toolchain_env, progress=progress)
        verification = timing = None
        if verify or bench:
            exe = build_program(rendered, built.source_dir, built.archive, scratch / f"benchmark_{rendered.name}",
                                built.tools, static=hw.target_arch != "x86_64")
            shutil.copy2(exe, staging.path / exe.name)
            library["benchmark_program"] = exe.name
            prog_runner = _program_runner(hw, device, runner, cluster)
            if prog_runner is None:
                prog_runner = QemuProgram(hw.cluster(cluster).core.qemu_cpu or "max")
            feeds = make_feeds(_original(lowered), seed)
            if verify:
                verification = _verify(lowered, rendered, syntheses, feeds, exe, staging.path, scratch, prog_runner,
                                       default_threads, seed, say)
            if bench:
                timing = _bench(lowered, rendered, feeds, exe, staging.path, scratch, prog_runner, hw,
                                threads or default_threads, repeat, say, thread_wait, profile)
        if quantized:
            report = quantized_report(lowered, syntheses, hw, explain)
        else:
            report = build_report(net, coverage(net), {s: syntheses[s] for s in report_specs},
                                  kernel_names(report_specs), hw=hw, cluster=cluster, threads=threads, explain=explain)
        report["network"] = network_summary(lowered, rendered, syntheses, hw, cluster)
        from .predict import PREDICTION_WHAT, network_predictions
        report["network"]["predicted"] = {"what": PREDICTION_WHAT,
                                          "rows": network_predictions(loaded, Path(path).stem, hw, program.dtype,
                                                                      program=program)}
        report["library"] = library
        if verification is not None:
            from .check import BOUND_NOTE, BOUND_NOTE_FP16, BOUND_NOTE_INT8
            note = {"fp32": BOUND_NOTE, "fp16": BOUND_NOTE_FP16, "int8": BOUND_NOTE_INT8}[program.dtype.name]
            report["verification"] = verification.to_dict(note)
        report["network_bench"] = timing
        (staging.path / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        staging.commit()
    report["output_dir"] = str(out_dir)
    return report


def quantized_report(lowered, syntheses, hw, explain: bool) -> dict:
    """The report of a quantized model's network: what was read, and the int8 kernel of every layer step."""
    program, network = lowered.program, lowered.network
    kernels = []
    for key in program.distinct_kernels():
        synthesis = syntheses[key]
        entry = {"spec": spec_of(key).describe(), **synthesis.result.report(),
                 "kernel": synthesis.tiles, "synthesis_ms": synthesis.seconds * 1e3,
                 "steps": [s.name for s in program.kernel_steps if s.kernel_key == key]}
        if not explain:
            entry.pop("explain", None)
        kernels.append(entry)
    return {"model": str(lowered.original.path), "hardware": hw.name, "dtype": "int8",
            "quantized": {"format": network.format, "read": network.describe(),
                          "activation_type": program.activation_type,
                          "steps": [{"name": s.name, "kind": s.kind, "op": s.op, "dtype": _step_dtype(s)}
                                    for s in network.steps]},
            "int8_kernels": kernels}


def _step_dtype(qstep) -> str:
    """In which dtype a quantized model's step runs in the C network (the report's per-node answer)."""
    if qstep.kind == "quantize":
        return "fp32 -> int8"
    if qstep.kind == "dequantize":
        return "int8 -> fp32"
    return "int8 (alias: no copy)" if qstep.kind == "move" and qstep.op != "MaxPool" else "int8"


def _write_inputs(program, feeds, directory: Path) -> tuple[Path, ...]:
    paths = []
    for i, name in enumerate(program.inputs):
        p = directory / f"input{i}.f32"
        np.ascontiguousarray(feeds[name], "<f4").tofile(p)
        paths.append(p)
    return tuple(paths)


def _verify(lowered, rendered, syntheses, feeds, exe, weights_dir, scratch, prog_runner, threads, seed, say):
    from .check import verify_program
    from .execute import ProgramRequest
    program = lowered.program
    run_dir = scratch / "verify"
    (run_dir / "outputs").mkdir(parents=True)
    (run_dir / "dump").mkdir()
    inputs = _write_inputs(program, feeds, run_dir)
    say(f"verify: running benchmark_{rendered.name} once with step dumps on {prog_runner.where}")
    prog_runner.run(ProgramRequest(binary=exe, weights=weights_dir / rendered.weights_file, inputs=inputs,
                                   outputs_dir=run_dir / "outputs", dump_dir=run_dir / "dump", warmup=0, runs=1,
                                   threads=threads, output_count=len(program.outputs),
                                   step_outputs=tuple(len(s.outputs) for s in program.steps)))
    dumps = [[np.fromfile(run_dir / "dump" / f"step{i}_{k}.f32", "<f4") for k in range(len(s.outputs))]
             for i, s in enumerate(program.steps)]
    outputs = [np.fromfile(run_dir / "outputs" / f"output{j}.f32", "<f4") for j in range(len(program.outputs))]
    expected, label = run_onnxruntime(_original(lowered), feeds)
    if program.dtype.name == "int8":
        from .check import verify_int8_program
        say(f"verify: checking {len(program.steps)} steps byte for byte against xfc's int8 oracle on their own inputs "
            f"and {len(outputs)} output(s) against onnxruntime")
        return verify_int8_program(lowered, feeds, dumps, outputs, expected, label, where=prog_runner.where,
                                   emulated=prog_runner.emulated, seed=seed)
    say(f"verify: checking {len(program.steps)} steps on their own inputs (float64 onnx.reference) and "
        f"{len(outputs)} output(s) against onnxruntime")
    plans = {spec: syntheses[spec].result.plan for spec in program.distinct_specs()}
    winograd = {spec: int(plan.winograd_m or 0) for spec, plan in plans.items()}
    kc = {spec: plan.gemm.kc if plan.gemm is not None else None for spec, plan in plans.items()}
    return verify_program(program, lowered.folded_loaded.opset, lowered.folded_loaded.constants, feeds, dumps, outputs,
                          expected, label, winograd=winograd, where=prog_runner.where,
                          emulated=prog_runner.emulated, seed=seed, kc=kc)


class _Original:
    """run.run_onnxruntime reads net.loaded (the model as loaded: shapes fixed, nothing folded)."""

    def __init__(self, loaded):
        self.loaded = loaded


def _original(lowered):
    return _Original(lowered.original)


def _bench(lowered, rendered, feeds, exe, weights_dir, scratch, prog_runner, hw, threads, repeat, say, wait,
           profile=False):
    from .bench import bench_program
    return bench_program(lowered, rendered, feeds, exe, weights_dir / rendered.weights_file, scratch, prog_runner,
                         threads=threads, runs=repeat, compare=hw.target_arch == "x86_64", say=say,
                         rounds=BENCH_ROUNDS, wait=wait, profile=profile)
