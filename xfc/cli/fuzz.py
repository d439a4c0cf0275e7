"""`xfc fuzz`: differential testing of generated kernels against the float64 reference.

    xfc fuzz [--cases N | --time S] [--seed S] [--targets host,qemu,pocl] [--hw NAMES] [--jobs J]
    xfc fuzz --replay FILE

Draws cases (xfc.testing.fuzz), runs them in worker processes (xfc.testing.fuzz_run), shows a progress bar on
stderr and a summary on stdout; shrinks every failure to a small case that fails the same way,
saves it as JSON and prints the command that reproduces it. Exit status: 0 no failure, 4 some
case failed (or the replayed case still fails), 3 a missing toolchain, 130 interrupted.
Build directories live in one temporary directory, removed at the end (also on Ctrl-C).
"""
from __future__ import annotations

import difflib
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from .._version import __version__
from ..errors import OperatorError, ToolchainError, VerificationError, XfcError
from ..ops.accuracy import format_ratio
from .arg_types import non_negative_int, positive_float
from ..outputs import claim_file, json_is_ours, write_json_result, write_owned_file
from ..testing.fuzz import (DTYPES, TARGETS, FuzzCase, for_dtypes, choices_from_descriptions, command_text, generate_cases, replay_argv,
                   select_hardware, shrink)
from ..testing.fuzz_run import DEFAULT_TIMEOUT_S, CaseResult, WorkerPool, host_description, host_isas

DEFAULT_SAVE_DIR = Path("xfc-fuzz")
DEFAULT_CASES = 100
SHRINK_ATTEMPTS = 150
MAX_SHRUNK_FAILURES = 10


# ---------------------------------------------------------------------------------------------
# Set-up: hardware pool and toolchains.
# ---------------------------------------------------------------------------------------------

def shipped_hardware() -> list[tuple[str, object]]:
    """(name as --hw takes it, description) for every shipped file, in a stable order."""
    from ..hardware.load import SHIPPED_ROOT, load_path, shipped_files
    out = []
    for path in shipped_files():
        name = path.stem if path.parent != SHIPPED_ROOT else path.name
        out.append((name, load_path(path)))
    return out


def _pool(targets, dtypes):
    isas = host_isas() if "host" in targets else ()
    host = host_description(isas[0]) if isas else None
    return for_dtypes(choices_from_descriptions(shipped_hardware(), host, isas), dtypes)


def hardware_pool(targets, names=None, dtypes=DTYPES):
    return select_hardware(_pool(targets, dtypes), targets, names)


def targets_with_hardware(targets, names=None, dtypes=DTYPES) -> list[str]:
    """The default targets narrowed to those with hardware for the dtypes (and --hw names): int8 has
    no PoCL kernels, fp16 CPU kernels no host; an explicit --targets is never narrowed."""
    pool = _pool(targets, dtypes)
    wanted = set(names) if names else None
    return [t for t in targets if any(wanted is None or c.name in wanted for c in pool.get(t, ()))]


def check_toolchains(targets) -> None:
    """One-line ToolchainError (exit 3) for a target this machine cannot run."""
    from ..toolchain.tools import ARM_CC, HOST_CC, QEMU, require_tool
    if "host" in targets:
        require_tool(HOST_CC)
        if not host_isas():
            raise ToolchainError(f"--targets host needs an x86-64 machine (this is {platform.machine()})")
    if "qemu" in targets:
        require_tool(ARM_CC)
        require_tool(QEMU)
    if "pocl" in targets:
        from ..toolchain.opencl import build_harness
        from ..runners.pocl import device_info
        device_info(build_harness())  # builds the shared harness once, before the workers need it


def _csv(text: Optional[str]) -> Optional[list[str]]:
    if text is None:
        return None
    items = [t.strip() for t in text.split(",") if t.strip()]
    return items or None


# ---------------------------------------------------------------------------------------------
# Progress on stderr.
# ---------------------------------------------------------------------------------------------

def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    """Cases done / total, failures, rate and ETA: a redrawn bar on a TTY, plain lines otherwise."""

    WIDTH = 24

    def __init__(self, stream, total: Optional[int], time_budget_s: Optional[float], enabled: bool = True):
        self.stream, self.total, self.budget = stream, total, time_budget_s
        self.tty = enabled and hasattr(stream, "isatty") and stream.isatty()
        self.enabled = enabled
        self.start = time.monotonic()
        self.done = self.failed = 0
        self._last_draw = 0.0
        self._last_line_step = -1
        self._last_line_time = self.start
        self._last_line_done = -1

    def _text(self) -> str:
        elapsed = time.monotonic() - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        if self.total:
            frac = self.done / self.total
            eta = (self.total - self.done) / rate if rate > 0 else None
            count = f"{self.done}/{self.total} cases"
        else:
            frac = min(1.0, elapsed / self.budget) if self.budget else 0.0
            eta = max(0.0, self.budget - elapsed) if self.budget else None
            count = f"{self.done} cases"
        bar = "#" * int(frac * self.WIDTH) + "-" * (self.WIDTH - int(frac * self.WIDTH))
        return (f"[{bar}] {count}, {self.failed} failed, {rate:.2f} cases/s, "
                f"elapsed {_duration(elapsed)}, ETA {'?' if eta is None else _duration(eta)}")

    def update(self, done: int, failed: int, force: bool = False) -> None:
        self.done, self.failed = done, failed
        if not self.enabled:
            return
        now = time.monotonic()
        if self.tty:
            if force or now - self._last_draw >= 0.2:
                self.stream.write("\r\x1b[K" + self._text())
                self.stream.flush()
                self._last_draw = now
            return
        if self.total:
            step = done * 10 // self.total
            due = step != self._last_line_step
        else:
            step = int((now - self.start) // 30)
            due = step != self._last_line_step and done > 0
        if force or due or now - self._last_line_time >= 60:
            self._last_line_step, self._last_line_time, self._last_line_done = step, now, done
            self.stream.write("xfc fuzz: " + self._text() + "\n")
            self.stream.flush()

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        self.stream.write(("\r\x1b[K" if self.tty else "") + text + "\n")
        self.stream.flush()
        if self.tty:
            self.update(self.done, self.failed, force=True)

    def finish(self) -> None:
        if self.enabled:
            if self.tty:
                self.update(self.done, self.failed, force=True)
                self.stream.write("\n")
            elif self.done != self._last_line_done:
                self.stream.write("xfc fuzz: " + self._text() + "\n")
            self.stream.flush()


# ---------------------------------------------------------------------------------------------
# Results.
# ---------------------------------------------------------------------------------------------

def _variant(case: FuzzCase) -> str:
    if case.target == "pocl":
        return f"pocl/{case.dtype}"
    return f"{case.target}/{case.isa}" + (f"/{case.dtype}" if case.dtype != "fp32" else "")


def _counts(records, key) -> dict:
    cases, failed = Counter(), Counter()
    for case, result in records:
        cases[key(case)] += 1
        failed[key(case)] += result.failed
    return {k: {"cases": cases[k], "failed": failed[k]} for k in sorted(cases)}


def machine_info() -> dict:
    info = {"platform": platform.platform(), "machine": platform.machine(), "python": platform.python_version()}
    try:
        host = host_description(host_isas()[0]) if host_isas() else None
    except XfcError:
        host = None
    if host is not None:
        info.update(cpu=host.marketing_name, cpus=host.clusters[0].count, host_isas=list(host_isas()))
    return info


def results_document(records, failures, *, seed, targets, pool, jobs, timeout_s, started_at, duration_s,
                     command: str) -> dict:
    """The JSON summary (--json, --out, benchmarks/results/fuzz.json)."""
    passing = [r.error_ratio for _, r in records if not r.failed and r.error_ratio is not None]
    return {
        "xfc_fuzz_results": 1,
        "xfc_version": __version__,
        "command": command,
        "seed": seed,
        "targets": list(targets),
        "hardware": {t: [c.name for c in pool[t]] for t in targets},
        "jobs": jobs,
        "timeout_s": timeout_s,
        "machine": machine_info(),
        "started_at": started_at,
        "duration_s": round(duration_s, 3),
        "cases": len(records),
        "passed": sum(not r.failed for _, r in records),
        "failures": sum(r.failed for _, r in records),
        "by_status": dict(sorted(Counter(r.status for _, r in records).items())),
        "by_target": _counts(records, lambda c: c.target),
        "by_operator": _counts(records, lambda c: c.op),
        "by_variant": _counts(records, _variant),
        "by_hardware": _counts(records, lambda c: c.hw),
        "worst_error_ratio": max(passing) if passing else None,
        "failed_cases": failures,
    }


def print_summary(doc: dict, out=sys.stdout) -> None:
    rate = doc["cases"] / doc["duration_s"] if doc["duration_s"] > 0 else 0.0
    print(f"xfc fuzz: {doc['cases']} cases (seed {doc['seed']}, targets {','.join(doc['targets'])}), "
          f"{doc['failures']} failed, {_duration(doc['duration_s'])} ({rate:.2f} cases/s, {doc['jobs']} jobs)",
          file=out)
    for title, key in (("target", "by_target"), ("operator", "by_operator"), ("variant", "by_variant")):
        cells = "  ".join(f"{k} {v['cases']}" + (f" ({v['failed']} failed)" if v["failed"] else "")
                          for k, v in doc[key].items())
        print(f"  {title + ':':<10}{cells}", file=out)
    hw = doc["by_hardware"]
    line = "  ".join(f"{k} {v['cases']}" + (f"({v['failed']}!)" if v["failed"] else "") for k, v in hw.items())
    print(f"  {'hardware:':<10}{len(hw)} descriptions: {line}", file=out)
    if doc["worst_error_ratio"] is not None:
        print(f"  worst error among passing cases: {format_ratio(doc['worst_error_ratio'])}x the K-derived bound", file=out)
    if doc["by_status"]:
        print(f"  {'status:':<10}" + "  ".join(f"{k} {v}" for k, v in doc["by_status"].items()), file=out)
    for f in doc["failed_cases"]:
        print(f"FAILED ({f['failure']['status']}): {f['description']}", file=out)
        print(f"  {f['failure']['detail']}", file=out)
        if f.get("saved"):
            print(f"  reproduce: {f['replay']}", file=out)
        if f.get("synth"):
            print(f"        or: {f['synth']}", file=out)


# Results files xfc fuzz wrote before they carried the "xfc_output" owner key are recognised by this one.
RESULTS_LEGACY_KEYS = ("xfc_fuzz_results",)


def save_case(save_dir: Path, case: FuzzCase, result: CaseResult, original: FuzzCase,
              original_result: CaseResult, shrink_info: dict, native_isa: str) -> tuple[Path, dict]:
    """Write the (shrunk) failing case as JSON under save_dir, never replacing another file."""
    try:
        save_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OperatorError(f"--save-dir {save_dir}: cannot create it ({exc.strerror})") from None
    stem = f"{case.label or 'case'}-{result.status}"
    path = save_dir / f"{stem}.json"
    n = 2
    while path.exists():
        path = save_dir / f"{stem}-{n}.json"
        n += 1
    synth = case.synth_argv(native_isa)
    doc = {
        "xfc_fuzz_case": 1, "xfc_version": __version__, "description": case.describe(),
        "case": case.to_dict(), "failure": {"status": result.status, "detail": result.detail},
        "original_case": original.to_dict(),
        "original_failure": {"status": original_result.status, "detail": original_result.detail},
        "shrink": shrink_info, "replay": command_text(replay_argv(str(path))),
        "synth": command_text(synth) if synth else None,
    }
    # Never over a file that appeared meanwhile: nothing is recognised as ours to replace.
    write_owned_file(path, json.dumps(doc, indent=2) + "\n", lambda existing: False, option="--save-dir")
    return path, doc


def load_case_file(path: str) -> FuzzCase:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise OperatorError(f"--replay {path}: cannot read it ({exc.strerror})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OperatorError(f"--replay {path}: not JSON (line {exc.lineno}: {exc.msg})") from None
    if isinstance(data, dict) and "case" in data:
        data = data["case"]
    return FuzzCase.from_dict(data, where=f"--replay {path}")


# ---------------------------------------------------------------------------------------------
# The command.
# ---------------------------------------------------------------------------------------------

class _Scratch:
    """The run's temporary directory, removed on exit (also on Ctrl-C or SIGTERM)."""

    def __enter__(self) -> Path:
        self.path = Path(tempfile.mkdtemp(prefix="xfc-fuzz-"))
        self._old = signal.getsignal(signal.SIGTERM)
        try:
            signal.signal(signal.SIGTERM, self._terminate)
        except ValueError:  # not the main thread
            self._old = None
        return self.path

    @staticmethod
    def _terminate(signum, frame):
        raise KeyboardInterrupt

    def __exit__(self, *exc) -> None:
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)
        shutil.rmtree(self.path, ignore_errors=True)


def _shrink_failure(pool: WorkerPool, case: FuzzCase, result: CaseResult, attempts: int, progress: Progress):
    def still_fails(cands):
        return [r.status == result.status for r in pool.run_all(list(cands))]
    progress.message(f"xfc fuzz: shrinking {case.label} ({result.status}) ...")
    shrunk = shrink(case, still_fails, max_attempts=attempts, batch_size=pool.jobs)
    if shrunk.case == case:
        final = result
    else:
        final = pool.run_all([shrunk.case])[0]
        if final.status != result.status:  # flaky: keep the original
            return case, result, {"attempts": shrunk.attempts, "steps": 0, "note": "shrunk case did not fail again"}
    return shrunk.case, final, {"attempts": shrunk.attempts, "steps": shrunk.steps}


NETWORK_HARDWARE = {"host": "host", "qemu": "snapdragon-865"}   # --networks: where each target runs them
# what each runs (fp16: FP16 arithmetic, ARM; int8: the drawn network quantized by onnxruntime)
NETWORK_DTYPES = {"host": ("fp32", "int8"), "qemu": ("fp32", "fp16", "int8")}


def network_plan(targets, dtypes) -> list[tuple[str, str]]:
    """The (target, dtype) cycle of --networks: each target with each dtype it runs that was asked for,
    the float dtypes first (fp32, fp16, then int8), targets in the order given."""
    plan = [(t, d) for d in DTYPES for t in targets if d in NETWORK_DTYPES[t] and d in dtypes]
    if not plan:
        raise OperatorError(f"--networks: no target of {', '.join(targets)} runs --dtype {','.join(dtypes)} networks "
                            f"(fp16 runs under qemu, on {NETWORK_HARDWARE['qemu']})")
    return plan


def run_network_case(case, work_dir: Path) -> dict:
    """`xfc model NET --hw HW --emit lib --verify --threads T` on a drawn network, in this process:
    status 'pass', 'fail' (not verified) or 'error' (refused or failed), seconds, steps, worst step ratio."""
    import onnx
    from ..api import load_hardware
    from ..model.runtime.network import run_network_model
    work_dir.mkdir(parents=True, exist_ok=True)
    path = work_dir / "net.onnx"
    onnx.save(case.model, str(path))
    started = time.perf_counter()
    try:
        if case.dtype == "int8":      # quantized as users do it; the format and activation type alternate
            path = quantize_case(case, path)
        report = run_network_model(path, load_hardware(case.hardware), work_dir / "out", threads=case.threads,
                                   verify=True, seed=case.index, dtype="fp32" if case.dtype == "int8" else case.dtype)
    except XfcError as exc:
        return {"status": "error", "seconds": time.perf_counter() - started, "steps": 0, "worst_step_ratio": None,
                "detail": f"{type(exc).__name__}: {exc}", "model_path": str(path)}
    v = report["verification"]
    return {"status": "pass" if v["verified"] else "fail", "seconds": time.perf_counter() - started,
            "model_path": str(path),
            "steps": report["network"]["steps"], "worst_step_ratio": v["worst_layer_ratio"],
            "detail": "" if v["verified"] else f"not verified: steps failed {v['layers_failed'][:5]}"}


def quantize_case(case, path: Path) -> Path:
    """An int8 case's model quantized by onnxruntime (xfc.model.quantized_peer): QDQ or QOperator and
    uint8 or int8 activations by the case's index, per-channel 7-bit weights. Without onnxruntime's
    quantization tools, or when they fail, a one-line ToolchainError."""
    from ..model.quantized_peer import quantize_with_onnxruntime
    fmt = ("qdq", "qoperator")[case.index % 2]
    activation = ("uint8", "int8")[(case.index // 2) % 2]
    try:
        return quantize_with_onnxruntime(path, path.with_name(f"net_{fmt}_{activation}.onnx"), fmt,
                                         activation=activation)
    except ImportError as exc:
        raise ToolchainError(f"int8 networks are quantized with onnxruntime.quantization, which is not installed "
                             f"({exc}); pip install onnxruntime, or --dtype fp32,fp16") from None
    except Exception as exc:   # noqa: BLE001 - onnxruntime's quantizer raises errors of every kind
        raise ToolchainError(f"onnxruntime.quantization failed on the drawn network: "
                             f"{' '.join(str(exc).split())[:200]}") from None


def cmd_fuzz_networks(args) -> int:
    """--networks N: random small networks through the network runtime (xfc.testing.netfuzz), one at a
    time in this process (each runs its benchmark program as a child), cycling through the (target,
    dtype) pairs of network_plan: host fp32 and int8, qemu fp32, fp16 and int8 by default (int8: the
    drawn network quantized by onnxruntime; a failure saves the quantized model)."""
    from ..testing.netfuzz import random_network
    if args.networks < 1:
        raise OperatorError(f"--networks must be >= 1, got {args.networks}")
    targets = _csv(args.targets) or ["host", "qemu"]
    for t in targets:
        if t not in NETWORK_HARDWARE:
            raise OperatorError(f"--targets {t}: --networks runs on {', '.join(NETWORK_HARDWARE)}")
    plan = network_plan(targets, tuple(_csv(args.dtype) or ()) or DTYPES)
    if args.out:
        claim_file(Path(args.out), json_is_ours(RESULTS_LEGACY_KEYS), option="--out")
    check_toolchains(targets)
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.monotonic()
    from ..api import load_hardware
    cores = {t: _cpu_count() if t == "host" else load_hardware(NETWORK_HARDWARE[t]).cluster().count for t in targets}
    rows, failures = [], []
    with _Scratch() as scratch:
        for index in range(args.networks):
            target, dtype = plan[index % len(plan)]
            case = random_network(args.seed, index, NETWORK_HARDWARE[target], max_threads=cores[target], dtype=dtype)
            result = run_network_case(case, scratch / f"net{index}")
            built = Path(result.pop("model_path", "") or "")     # the model xfc built (int8: quantized)
            rows.append({"index": index, "target": target, "dtype": dtype, "hardware": case.hardware,
                         "threads": case.threads,
                         "input": list(case.input_shape), "blocks": list(case.blocks), **result,
                         "seconds": round(result["seconds"], 3)})
            if not args.quiet:
                print(f"xfc fuzz: [{index + 1}/{args.networks}] {result['status']} ({result['seconds']:.1f} s) "
                      f"{case.describe()}", file=sys.stderr, flush=True)
            if result["status"] != "pass":
                saved = Path(args.save_dir) / f"net-s{args.seed}-n{index}-{result['status']}.onnx"
                data = built.read_bytes() if dtype == "int8" and built.is_file() else case.model.SerializeToString()
                write_owned_file(saved, data, lambda existing: False, option="--save-dir")
                replay = (f"xfc model {saved} --hw {case.hardware} --emit lib --verify --threads {case.threads} "
                          f"--seed {index}" + (f" --dtype {dtype}" if dtype == "fp16" else ""))
                failures.append({**rows[-1], "saved": str(saved), "replay": replay})
                print(f"xfc fuzz: FAIL {result['status']}: {case.describe()}\n    {result['detail']}\n"
                      f"    saved {saved}; reproduce with: {replay}", file=sys.stderr, flush=True)
    ratios = [r["worst_step_ratio"] for r in rows if r["worst_step_ratio"] is not None]
    doc = {"xfc_fuzz_results": 1, "kind": "networks", "command": command_text(
               ["xfc", "fuzz", "--networks", str(args.networks), "--seed", str(args.seed), "--targets",
                ",".join(targets), "--dtype", ",".join(dict.fromkeys(d for _, d in plan))]),
           "seed": args.seed, "targets": targets, "machine": machine_info(), "started_at": started_at,
           "duration_s": round(time.monotonic() - t0, 3), "networks": len(rows),
           "passed": sum(r["status"] == "pass" for r in rows), "failures": len(failures),
           "worst_step_ratio": max(ratios) if ratios else None, "failed_networks": failures, "rows": rows}
    if args.out:
        write_json_result(Path(args.out), doc, kind="fuzz_results", legacy_keys=RESULTS_LEGACY_KEYS)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"xfc fuzz --networks: {doc['passed']}/{len(rows)} networks verified, {len(failures)} failed "
              f"({doc['duration_s']:.0f} s; worst step at {format_ratio(doc['worst_step_ratio'])}x its bound)")
        if args.out:
            print(f"  results: {args.out}")
    return 4 if failures else 0


def cmd_fuzz(args) -> int:
    if args.replay:
        return cmd_replay(args)
    if args.networks is not None:
        return cmd_fuzz_networks(args)
    targets = _csv(args.targets) or list(TARGETS)
    for t in targets:
        if t not in TARGETS:
            raise OperatorError(f"--targets: unknown target '{t}' (expected {', '.join(TARGETS)})")
    targets = [t for t in TARGETS if t in targets]  # stable order, no duplicates
    dtypes = _csv(args.dtype) or list(DTYPES)
    for d in dtypes:
        if d not in DTYPES:
            close = difflib.get_close_matches(d, DTYPES, n=1)
            raise OperatorError(f"--dtype: unknown element type '{d}' (expected {', '.join(DTYPES)})"
                                + (f"; did you mean '{close[0]}'?" if close else ""))
    dtypes = [d for d in DTYPES if d in dtypes]
    if args.cases is not None and args.cases < 1:
        raise OperatorError(f"--cases must be >= 1, got {args.cases}")
    if args.time is not None and args.time <= 0:
        raise OperatorError(f"--time must be > 0 seconds, got {args.time}")
    if args.jobs is not None and args.jobs < 1:
        raise OperatorError(f"--jobs must be >= 1, got {args.jobs}")
    if args.timeout <= 0:
        raise OperatorError(f"--timeout must be > 0 seconds, got {args.timeout}")
    jobs = args.jobs or _cpu_count()
    if args.out:   # refuse a file xfc did not write now, not after the cases have run
        claim_file(Path(args.out), json_is_ours(RESULTS_LEGACY_KEYS), option="--out")
    if not _csv(args.targets):
        kept = targets_with_hardware(targets, _csv(args.hw), dtypes)
        dropped = [t for t in targets if t not in kept]
        if kept and dropped and not args.quiet:
            print(f"xfc fuzz: no {'/'.join(dtypes)} kernels run on {', '.join(dropped)}; "
                  f"targets {','.join(kept)}", file=sys.stderr)
        targets = kept or targets      # none left: select_hardware says why in one line
    check_toolchains(targets)
    pool_hw = hardware_pool(targets, _csv(args.hw), dtypes)
    count = args.cases if args.time is None else None
    if args.time is None and count is None:
        count = DEFAULT_CASES
    native = (host_isas() or ("",))[0]
    progress = Progress(sys.stderr, count, args.time, enabled=not args.quiet)
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.monotonic()
    records: list[tuple[FuzzCase, CaseResult]] = []
    failed: list[tuple[int, FuzzCase, CaseResult]] = []
    with _Scratch() as scratch, WorkerPool(jobs, scratch, timeout_s=args.timeout, base_env=dict(os.environ)) as pool:
        deadline = t0 + args.time if args.time is not None else None
        cases = generate_cases(args.seed, pool_hw, targets, count=count, dtypes=dtypes)
        for index, case, result in pool.run(cases, deadline=deadline,
                                            on_tick=lambda: progress.update(len(records), len(failed))):
            records.append((case, result))
            if result.failed:
                failed.append((index, case, result))
                progress.message(f"xfc fuzz: FAIL {result.status}: {case.describe()}\n    {result.detail}")
            progress.update(len(records), len(failed))
        progress.finish()
        failures = []
        failed.sort(key=lambda item: item[0])
        for i, (_, case, result) in enumerate(failed):
            if i < MAX_SHRUNK_FAILURES and args.shrink_attempts > 0:
                small, small_result, info = _shrink_failure(pool, case, result, args.shrink_attempts, progress)
            else:
                small, small_result, info = case, result, {"attempts": 0, "steps": 0, "note": "not shrunk"}
            path, doc = save_case(Path(args.save_dir), small, small_result, case, result, info, native)
            doc["saved"] = str(path)
            failures.append(doc)
            progress.message(f"xfc fuzz: saved {path}; reproduce with: {doc['replay']}")
    doc = results_document(records, failures, seed=args.seed, targets=targets, pool=pool_hw, jobs=jobs,
                           timeout_s=args.timeout, started_at=started_at, duration_s=time.monotonic() - t0,
                           command=_command(args, targets, jobs, dtypes))
    if args.out:
        write_json_result(Path(args.out), doc, kind="fuzz_results", legacy_keys=RESULTS_LEGACY_KEYS)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print_summary(doc)
        if args.out:
            print(f"  results: {args.out}")
    return 4 if doc["failures"] else 0


def _command(args, targets, jobs, dtypes) -> str:
    """The run as one canonical command line (for the results document)."""
    argv = ["xfc", "fuzz"] + (["--time", f"{args.time:g}"] if args.time is not None else
                              ["--cases", str(args.cases or DEFAULT_CASES)])
    argv += ["--seed", str(args.seed), "--targets", ",".join(targets), "--dtype", ",".join(dtypes),
             "--jobs", str(jobs)]
    if args.hw:
        argv += ["--hw", args.hw]
    return command_text(argv)


def _cpu_count() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cmd_replay(args) -> int:
    case = load_case_file(args.replay)
    check_toolchains([case.target])
    if case.target == "host" and case.isa not in host_isas():
        raise ToolchainError(f"--replay {args.replay}: this host cannot run isa {case.isa}")
    with _Scratch() as scratch, WorkerPool(1, scratch, timeout_s=args.timeout, base_env=dict(os.environ)) as pool:
        result = pool.run_all([case])[0]
    if args.json:
        print(json.dumps({"case": case.to_dict(), "result": result.to_dict()}, indent=2))
    if result.failed:
        raise VerificationError(f"--replay {args.replay}: still fails ({result.status}): {result.detail} "
                                f"[{case.describe()}]")
    if not args.json:
        ratio = f", worst error {format_ratio(result.error_ratio)}x the bound" if result.error_ratio is not None else ""
        print(f"xfc fuzz --replay {args.replay}: pass ({case.describe()}{ratio})")
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "fuzz", help="differential testing: random kernels checked against the float64 reference",
        description="Draw random operators, shapes, windows, epilogues, thread counts and hardware "
        "descriptions; build and run each kernel (host natively, ARM under qemu-aarch64, GPU on PoCL) through "
        "both entry points and compare with numpy in float64. Failures are shrunk, saved as JSON and printed "
        "with the command that reproduces them. Exit 0: no failure; 4: some case failed.")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--cases", type=int, default=None, metavar="N", help=f"cases to run (default {DEFAULT_CASES})")
    size.add_argument("--time", type=positive_float, default=None, metavar="S", help="run new cases for S seconds instead")
    size.add_argument("--networks", type=int, default=None, metavar="N",
                      help="instead of operators: N random small fp32 networks (convolutions, depthwise and grouped, "
                           "fused activations, residual Add, squeeze-excitation, pooling, Concat, Split, Slice, Pad, "
                           "Resize, Transpose, channel shuffle, broadcasting Add/Sub/Mul/Div, BatchNormalization, a "
                           "classifier head) through `xfc model --emit lib --verify`, "
                           "alternating --targets host and qemu (snapdragon-865)")
    p.add_argument("--seed", type=non_negative_int, default=1, help="generation seed: same seed, same cases (default 1)")
    p.add_argument("--targets", default=None, metavar="T,...",
                   help="where to run: host (native gcc), qemu (aarch64 under qemu-aarch64), pocl (OpenCL on PoCL); "
                   "default: every one with hardware for the --dtype asked for")
    p.add_argument("--dtype", default=",".join(DTYPES), metavar="D,...",
                   help="element types to draw: fp32, fp16 (ARM cores with FP16 arithmetic under qemu; fp16 storage "
                   "on PoCL), int8 (x86 hosts; ARM cores with dotprod under qemu); each case one its hardware runs; "
                   "default all")
    p.add_argument("--hw", default=None, metavar="NAME,...",
                   help="only these descriptions (e.g. host,cortex-a55,snapdragon.yaml,mali-g78); default every "
                   "shipped one and the host")
    p.add_argument("--jobs", "-j", type=int, default=None, metavar="J", help="worker processes (default: CPUs)")
    p.add_argument("--timeout", type=positive_float, default=DEFAULT_TIMEOUT_S, metavar="S",
                   help=f"seconds one case may take before it counts as a failure (default {DEFAULT_TIMEOUT_S:g})")
    p.add_argument("--shrink-attempts", type=non_negative_int, default=SHRINK_ATTEMPTS, metavar="N",
                   help=f"cases run to shrink one failure (default {SHRINK_ATTEMPTS}; 0: do not shrink); "
                   f"at most {MAX_SHRUNK_FAILURES} failures are shrunk")
    p.add_argument("--save-dir", default=str(DEFAULT_SAVE_DIR), metavar="DIR",
                   help=f"where failing cases are saved as JSON (default {DEFAULT_SAVE_DIR}/)")
    p.add_argument("--out", metavar="FILE", help="write the results as JSON to FILE (atomically)")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    p.add_argument("--replay", metavar="FILE", help="rerun one saved case; exit 4 if it still fails, 0 if it passes")
    p.set_defaults(func=cmd_fuzz)
