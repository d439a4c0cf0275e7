"""`xfc synth` on a CPU, every dtype: plan -> the chain (stages.py) -> report, with every output
written through xfc.outputs (staged, owned directories).

The planner is chosen by the dtype from a table (PLANNERS): fp32 plans come from the bottom-up
synthesizer (tile database, calibrated constants and the plan cache when the caller gives them),
fp16 plans from the same synthesizer on the core's fp16 configuration, int8 plans from the int8
planner (x86 dialects here, sdot / smmla on AArch64). Everything after the plan is one chain:
render, build for where the plan runs (this machine in process, AArch64 under qemu-aarch64),
both entry points verified by the dtype's oracle under the plan's bound, timed when asked.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, Mapping, Optional

from ..cpu.synth import synthesize_cpu
from ..errors import OperatorError, VerificationError
from ..ops.dtypes import FP16, FP32, INT8, dtype_named, make_operands
from ..outputs import OutputDir
from . import stages
from .report import Report, measurement_dict, report_core


def synthesize_timed(spec, hw, cluster=None, threads=None, evaluator=None, constants=None, lowering="auto"):
    """Run the (pure) fp32 synthesizer and time it: the one place synthesis seconds are measured.
    evaluator / constants: a tile-database evaluator and calibrated cost-model constants
    (xfc.tiledb, chosen by the command line's --tile-db); None: the static model. lowering:
    'auto', 'direct' or 'winograd' (synth.synthesize_cpu); a forced lowering is never answered
    from the plan cache, which holds 'auto' choices only."""
    start = time.perf_counter()
    extra = {} if constants is None else {"constants": constants}
    synthesize = getattr(evaluator, "synthesize", synthesize_cpu)   # a tile db's plan cache (xfc.tiledb.plancache)
    if lowering != "auto":
        synthesize, extra = synthesize_cpu, {**extra, "lowering": lowering}
    result = synthesize(spec, hw, cluster=cluster, threads=threads, evaluator=evaluator, **extra)
    return result, time.perf_counter() - start


def _plan_fp32(spec, hw, *, cluster, threads, evaluator, constants, lowering, quant):
    return synthesize_timed(spec, hw, cluster, threads, evaluator, constants, lowering)


def _plan_fp16(spec, hw, *, cluster, threads, evaluator, constants, lowering, quant):
    from ..cpu.fp16 import synthesize_fp16
    start = time.perf_counter()
    result = synthesize_fp16(spec, hw, cluster, threads)     # static model, direct lowering (docs/fp16.md)
    return result, time.perf_counter() - start


def _plan_int8(spec, hw, *, cluster, threads, evaluator, constants, lowering, quant):
    from ..cpu.int8_plan import Int8Synthesis
    from ..cpu.int8_synth import plan_int8
    from ..hardware.host import read_flags
    start = time.perf_counter()
    flags = frozenset(read_flags()) if hw.kind == "host" else frozenset()   # avx512_vnni: not in the description
    plan = plan_int8(spec, quant, hw, cluster=cluster, threads=threads, host_flags=flags)
    return Int8Synthesis(plan), time.perf_counter() - start


# dtype -> planner: (spec, hw, options) -> (synthesis with .plan, .report(), .explain(), seconds)
PLANNERS: Mapping[str, Callable] = {FP32.name: _plan_fp32, FP16.name: _plan_fp16, INT8.name: _plan_int8}


def plan_cpu(spec, hw, dtype=FP32, *, cluster=None, threads=None, evaluator=None, constants=None,
             lowering: str = "auto", quant=None):
    """(synthesis, seconds): the plan of spec for hw's cluster in dtype."""
    dtype = dtype_named(dtype)
    if spec.epilogue.residual:   # its kernels read the addend from the output buffer: the runtime's only
        raise OperatorError(f"{spec.describe()}: a residual epilogue adds what the output buffer holds on entry; "
                            f"only the network runtime calls such kernels (xfc model --emit lib, "
                            f"xfc.compile_model)")
    return PLANNERS[dtype.name](spec, hw, cluster=cluster, threads=threads, evaluator=evaluator,
                                constants=constants, lowering=lowering, quant=quant)


def run_synth(spec, hw, out_dir: Path, *, dtype=FP32, quant=None, cluster=None, threads=None, verify=False,
              bench=False, repeat=20, seed=0, progress=None, force=False, mca=False, evaluator=None, constants=None,
              tile_db: Optional[dict] = None, lowering: str = "auto", fault: Optional[Callable] = None) -> Report:
    """The CPU pipeline behind `xfc synth`: plan -> render -> fault -> build -> [llvm-mca] -> verify -> time.
    Outputs go to out_dir through xfc.outputs.OutputDir (force: write beside foreign files).
    evaluator, constants: see synthesize_timed (fp32); tile_db: what the caller says about the database
    they came from (recorded as 'tile_db'). quant: int8 quantization (xfc.ops.quant.QuantParams).
    fault: a deliberately wrong kernel for tests (stages.realize)."""
    dtype = dtype_named(dtype)
    say = progress or (lambda msg: None)
    synthesis, synth_s = plan_cpu(spec, hw, dtype, cluster=cluster, threads=threads, evaluator=evaluator,
                                  constants=constants, lowering=lowering, quant=quant)
    plan = synthesis.plan
    say(f"synthesized in {synth_s * 1e3:.1f} ms: {synthesis.summary_line()}")
    report = {**report_core("synth", "cpu", spec, hw.name, None, None), **synthesis.report(),
              "synthesis_seconds": synth_s, "threads": plan.threads, "explain": synthesis.explain(),
              "dtype": dtype.name}
    if tile_db is not None:
        report["tile_db"] = tile_db
    per_call = timing = None
    with OutputDir(Path(out_dir), what=f"xfc synth {spec.key()} {dtype} for {hw.name} (cpu)", force=force) as staging:
        if fault is not None:
            say("TEST FAULT INJECTION: this kernel is deliberately wrong")
        built = stages.realize(plan, staging.path, fault=fault)
        report["build_seconds"] = built.build_seconds
        say(f"built in {built.build_seconds:.2f} s ({built.compiler})")
        if mca:   # static analysis of the inner FMA loop; the loop goes beside the kernel
            from ..analysis.mca import analyze_kernel   # an optional analysis: imported only when asked for
            analysis = analyze_kernel(built.rendered, synthesis.cluster.core)
            report["mca"] = {**analysis.as_dict(), "summary": analysis.summary_lines()}
            (staging.path / "mca_loop.s").write_text(analysis.loop_text)
        if verify or bench:
            if built.host is None:
                say(f"running under {built.where} ...")
            # Both entry points are checked: weights packed per call, and pre-packed once. A guard
            # violation or an unwritten output raised while running is a failed verification too: it
            # is reported, and the outputs are kept for inspection like any other mismatch.
            operands = make_operands(spec, dtype, seed=seed, quant=getattr(plan, "quant", None))
            warmup = (3 if built.host is not None else 1) if bench else 0
            try:
                outcome = stages.verify(built, operands, repeat=repeat if bench else 1, warmup=warmup)
                result = outcome.check
                report.update(verified=result.ok, failure=result.reason or None, **result.report)
                if dtype is INT8:    # the report's error in output steps (LSB); int8 has no bound ratio
                    report.update(max_abs_error=float(max(result.report["max_lsb"], 0)), error_to_bound_ratio=None)
                if bench and result.ok:
                    per_call, timing = outcome.runs["per-call"], outcome.runs["pre-packed"]
            except VerificationError as exc:
                report.update(verified=False, max_abs_error=None, error_to_bound_ratio=None, failure=str(exc))
            report["verified_on"] = stages.verified_on(built)
            if timing is not None:
                report["measurement"] = measurement_dict(timing, "pre-packed once (untimed)")
                report["measurement_packing_per_call"] = measurement_dict(per_call, "packed inside every call")
        (staging.path / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        staging.commit()
    if report.get("verified") is False:
        oracle = "exact int8 reference" if dtype is INT8 else "numpy reference"
        raise VerificationError(f"{spec.name} {dtype} kernel for {hw.name} failed verification against the {oracle} "
                                f"({report['failure']}); outputs kept in {out_dir}")
    return Report.of("cpu", report, hardware=hw.name, measurement=timing, per_call=per_call, output_dir=str(out_dir))


def check_dtype_request(dtype, hw, cluster: Optional[str]) -> None:
    """Refuse, in one line, a dtype this hardware's CPU cannot run (before anything is written)."""
    dtype = dtype_named(dtype)
    if dtype is FP16:
        from ..cpu.fp16 import check_fp16_target
        check_fp16_target(hw, cluster)
    elif dtype is INT8 and hw.target_arch not in ("x86_64", "aarch64"):
        raise OperatorError(f"--dtype int8: no int8 kernels for {hw.name} ({hw.target_arch})")
