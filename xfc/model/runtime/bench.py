"""`xfc model --emit lib --bench`: the whole network, timed by its benchmark program.

On the host the same inputs go to onnxruntime's whole `session.run` on the original model in this
process (CPUExecutionProvider, its default graph optimizations, intra-op threads = the network's,
one inter-op thread, sequential execution), with the same warm-up and run counts. The two alternate
BENCH_ROUNDS times (program, then onnxruntime) so that a change of the machine's load between them
shows in both; each side reports the median of its rounds' medians, and the ratio is onnxruntime's
median over xfc's (> 1: xfc is faster).

ARM descriptions run the program under qemu-aarch64 (emulated: a functional run, never a phone's
timing) or on a device through the ADB runner (pinned to the cluster, telemetry recorded); nothing
is compared there (onnxruntime runs on this machine, not on the device).

Thread waiting (more than one thread), the same for both: 'spin' (the default) keeps both runtimes'
defaults, what an app gets (libgomp's and onnxruntime's idle threads spin a while before they sleep);
'passive' lets idle threads sleep at once (the program runs with OMP_WAIT_POLICY=passive; onnxruntime
with session.intra_op.allow_spinning=0). A network's steps are parallel regions one after another,
and waking a sleeping thread costs tens of microseconds per region (71 us against 0.7 us on the
2-vCPU EPYC host, benchmarks/thread_wake.py): passive made ShuffleNet at 2 threads 2.6x slower than
at 1. 'passive' is for a shared machine whose cores are busy with other work, where spinning threads
steal the time of the threads they wait for and both runtimes get several times slower.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from ...errors import OperatorError, ToolchainError
from .execute import ProgramRequest

NOTE_HOST = ("whole network, one process each, alternating: xfc's benchmark program (its own C timing loop) and "
             "onnxruntime's session.run timed in Python (perf_counter around each call); same inputs, same thread "
             "count; a loaded (shared) machine makes both noisy")
NOTE_DEVICE = ("the benchmark program on {where}; qemu-aarch64 and the virtual device are emulated: functional runs, "
               "never phone timings; onnxruntime is not compared (it runs on this machine)")


WAIT_POLICIES = ("passive", "spin")


def program_env(wait: str) -> tuple[tuple[str, str], ...]:
    """The benchmark program's environment for a thread wait policy (module docstring)."""
    return (("OMP_WAIT_POLICY", "passive"),) if wait == "passive" else ()


def time_onnxruntime(loaded, feeds, *, threads: int, warmup: int, runs: int, wait: str = "spin"):
    """(per-run seconds of session.run, label)."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise ToolchainError("--bench compares with onnxruntime, which is not installed: pip install onnxruntime") from None
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if wait == "passive":
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        session = ort.InferenceSession(loaded.model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        feed = {k: np.ascontiguousarray(v) for k, v in feeds.items()}
        for _ in range(warmup):
            session.run(None, feed)
        samples = []
        for _ in range(runs):
            t = time.perf_counter()
            session.run(None, feed)
            samples.append(time.perf_counter() - t)
    except Exception as exc:
        raise OperatorError(f"{loaded.path}: onnxruntime cannot run the model: {' '.join(str(exc).split())[:240]}") from None
    label = (f"onnxruntime {ort.__version__} CPUExecutionProvider, default graph optimizations (ORT_ENABLE_ALL), "
             f"{threads} intra-op thread{'s' if threads != 1 else ''}"
             + (", no spinning" if wait == "passive" and threads > 1 else "") + ", whole session.run")
    return samples, label


def _quantiles(samples_ms):
    q = np.percentile(np.asarray(samples_ms), [10, 50, 90])
    return {"p10_ms": float(q[0]), "median_ms": float(q[1]), "p90_ms": float(q[2]), "min_ms": float(min(samples_ms))}


def step_profile(program, steps_ms) -> list[dict]:
    """One row per step of the program's --profile: what it runs, its median milliseconds, its share
    of their sum and, for a kernel, the GFLOP/s that makes."""
    total = sum(steps_ms) or 1.0
    rows = []
    for index, (step, ms) in enumerate(zip(program.steps, steps_ms)):
        row = {"step": index, "name": step.name, "ms": ms, "share": ms / total}
        if step.kind == "kernel":
            flops = step.spec.flops * step.groups * step.batch
            row.update(what=f"{step.spec.describe().replace(' epilogue=none', '').replace(' dilation=1x1', '')}"
                            + (f" x{step.groups * step.batch}" if step.groups * step.batch > 1 else ""),
                       gflops=flops / (ms * 1e6) if ms > 0 else None)
        else:
            row["what"] = step.op
        rows.append(row)
    return rows


def bench_program(lowered, rendered, feeds, exe: Path, weights: Path, scratch: Path, prog_runner, *, threads: int,
                  runs: int, compare: bool, say, rounds: int, warmup: int = 3, wait: str = "spin",
                  profile: bool = False) -> dict:
    program = lowered.program
    run_dir = scratch / "bench"
    run_dir.mkdir(parents=True, exist_ok=True)
    inputs = []
    for i, name in enumerate(program.inputs):
        p = run_dir / f"input{i}.f32"
        np.ascontiguousarray(feeds[name], "<f4").tofile(p)
        inputs.append(p)
    request = ProgramRequest(binary=exe, weights=weights, inputs=tuple(inputs), warmup=warmup, runs=runs,
                             threads=threads, env=program_env(wait))
    xfc_rounds, ort_rounds, ort_samples, reports, label = [], [], [], [], None
    for r in range(rounds if compare else 1):
        say(f"bench: benchmark_{rendered.name} on {prog_runner.where}, {warmup} + {runs} runs, {threads} thread"
            f"{'s' if threads != 1 else ''} (round {r + 1})")
        result = prog_runner.run(request)
        reports.append(result.report)
        xfc_rounds.append(result.report["median_ms"])
        if compare:
            say(f"bench: onnxruntime session.run, {warmup} + {runs} runs (round {r + 1})")
            samples, label = time_onnxruntime(lowered.original, feeds, threads=threads, warmup=warmup, runs=runs,
                                              wait=wait)
            ms = [s * 1e3 for s in samples]
            ort_samples.extend(ms)
            ort_rounds.append(statistics.median(ms))
    last = reports[-1]
    out = {"threads": last["threads"], "runs": runs, "warmup": warmup, "rounds": len(xfc_rounds), "thread_wait": wait,
           "xfc": {"median_ms": statistics.median(xfc_rounds), "round_medians_ms": xfc_rounds,
                   "p10_ms": last["p10_ms"], "p90_ms": last["p90_ms"], "min_ms": min(r["min_ms"] for r in reports),
                   "arena_bytes": last["arena_bytes"], "packed_weight_bytes": last["packed_weight_bytes"],
                   "create_ms": last["create_ms"], "measured_on": result.where, "emulated": result.emulated,
                   "telemetry": result.telemetry or None},
           "onnxruntime": None, "speedup": None,
           "note": NOTE_HOST if compare else NOTE_DEVICE.format(where=result.where)}
    if profile:
        say(f"bench: benchmark_{rendered.name} --profile, {warmup} + {runs} runs (a timestamp after every step)")
        profiled = prog_runner.run(replace(request, profile=True)).report
        steps = step_profile(program, profiled["steps_ms"])
        out["profile"] = {"steps": steps, "steps_sum_ms": sum(s["ms"] for s in steps),
                          "median_ms": profiled["median_ms"],
                          "note": "a separate set of runs with a timestamp after every step: each step's median "
                                  "milliseconds; the timed rounds above run without the timestamps"}
    if compare:
        out["onnxruntime"] = {"label": label, "median_ms": statistics.median(ort_rounds), "round_medians_ms": ort_rounds,
                              **{k: v for k, v in _quantiles(ort_samples).items() if k != "median_ms"}}
        out["speedup"] = out["onnxruntime"]["median_ms"] / out["xfc"]["median_ms"]
    return out
