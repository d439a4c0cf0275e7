"""Running fuzz cases: one case in this process (run_case), and a pool of worker processes.

run_case builds the case's kernel into a scratch directory, runs it on the float inputs of the
case's seed and compares with the float64 reference (xfc.ops.check_output / xfc.gpu.verify):

  host  synthesize for the host (or the host seen as AVX2-only / plain x86-64 for isa avx2 /
        generic), gcc, load with ctypes; weights packed per call AND pre-packed once
  qemu  synthesize for the description's cluster, aarch64-linux-gnu-gcc -static, run under
        qemu-aarch64 -cpu <plan.qemu_cpu>, per call and with the pre-packed entry point
  pocl  synthesize the OpenCL kernel, run it on PoCL (fp32, or fp16 storage for dtype fp16)

Failure classes (xfc.testing.fuzz.FAILURE_CLASSES): 'wrong' output, 'crash' (the kernel or the worker
died, or the run failed), 'timeout', 'build' (the compiler rejected generated code), 'rejected'
(synthesis refused a valid request: a generator or synthesizer bug) and 'error' (an unexpected
Python exception in xfc).

WorkerPool runs cases in worker processes (`python -m xfc.testing.fuzz_run WORKDIR`, one JSON line per
case each way), each in its own session so that a timeout or Ctrl-C can kill the worker with
its compilers and emulators; TMPDIR points into the pool's scratch directory, so whatever they
leave behind is removed with it.
"""
from __future__ import annotations

import json
import os
import platform
import selectors
import shutil
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

from ..toolchain import procs
from ..errors import ToolchainError, VerificationError, XfcError
from .fuzz import FuzzCase
from ..paths import IMPORT_ROOT

DEFAULT_TIMEOUT_S = 120.0
CASES_PER_WORKER = 150        # a worker loads one shared object per host case: start afresh now and then
# how long a terminated worker gets to stop what it started (procs.run's own SIGTERM grace) before
# its group is killed
WORKER_STOP_GRACE_S = procs.GRACE_S + 1.0


@dataclass(frozen=True)
class CaseResult:
    status: str                         # 'pass' or one of xfc.testing.fuzz.FAILURE_CLASSES
    detail: str = ""                    # one line: what failed, where
    seconds: float = 0.0
    error_ratio: Optional[float] = None  # worst |error| / bound over the checked outputs
    plan: str = ""                      # the tile line of the plan, for the report

    @property
    def failed(self) -> bool:
        return self.status != "pass"

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "CaseResult":
        return CaseResult(**{k: d.get(k) for k in ("status", "detail", "seconds", "error_ratio", "plan")
                             if k in d})


# ---------------------------------------------------------------------------------------------
# The host as each ISA it can run.
# ---------------------------------------------------------------------------------------------

def host_cpuinfo() -> dict:
    from ..hardware.host import parse_cpuinfo
    try:
        return parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        return parse_cpuinfo("")


def host_isas(cpuinfo: Optional[dict] = None) -> tuple[str, ...]:
    """ISAs this machine runs, native first (empty when the host is not x86-64)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return ()
    from ..hardware.host import supported_isas
    return supported_isas((cpuinfo or host_cpuinfo())["flags"])


_HOST_CACHE: dict[str, object] = {}


def host_description(isa: str):
    """The host description as a machine whose widest ISA is `isa` (the flags above it removed),
    so the synthesizer picks that ISA's lanes, registers and -march."""
    if isa not in _HOST_CACHE:
        from ..hardware.host import X86_64_V3_FLAGS, X86_64_V4_FLAGS, describe_host, read_caches
        info = host_cpuinfo()
        if isa not in host_isas(info):
            raise ToolchainError(f"this host cannot run isa {isa} (its CPU flags lack part of what {isa} code needs)")
        drop = {"avx512": set(), "avx2": set(X86_64_V4_FLAGS) - set(X86_64_V3_FLAGS),
                "generic": set(X86_64_V4_FLAGS)}[isa]
        info = {**info, "flags": set(info["flags"]) - drop}
        try:
            n_cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            n_cpus = os.cpu_count() or 1
        _HOST_CACHE[isa] = describe_host(info, read_caches(), n_cpus, platform.machine())
    return _HOST_CACHE[isa]


# ---------------------------------------------------------------------------------------------
# One case, in this process.
# ---------------------------------------------------------------------------------------------

class _Failure(Exception):
    def __init__(self, status: str, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


def _phase(status: str, what: str, fn, *args, **kwargs):
    """Run fn; any XfcError it raises becomes a failure of class `status`, named by `what`."""
    try:
        return fn(*args, **kwargs)
    except _Failure:
        raise
    except XfcError as exc:
        raise _Failure(status, f"{what}: {exc}") from None


def _run_cpu(case: FuzzCase, spec, work_dir: Path) -> tuple[float, str]:
    """One CPU case through the chain (xfc.pipeline.stages): plan, build, both entry points, verdict."""
    from ..cpu.synth import synthesize_cpu
    from ..hardware.load import load
    from ..ops.dtypes import make_operands
    from ..ops.quant import parse_quant
    from ..pipeline import stages
    from ..pipeline.synth import plan_cpu
    hw = host_description(case.isa) if case.target == "host" else _phase("rejected", "hardware", load, case.hw)
    quant = parse_quant(case.quant) if case.dtype == "int8" else None
    if case.dtype == "fp32":   # the case's ISA forced (a narrower dialect than the core's, generic on ARM)
        synthesis = _phase("rejected", "synthesis", synthesize_cpu, spec, hw, cluster=case.cluster,
                           threads=case.threads, isa=case.isa)
    else:                      # fp16 and int8: the dialect the dtype's configuration gives the core
        synthesis, _ = _phase("rejected", "synthesis", plan_cpu, spec, hw, case.dtype, cluster=case.cluster,
                              threads=case.threads, quant=quant)
    plan = synthesis.plan
    tiles = next((ln for ln in plan.header_lines if ln.startswith("tiles:")), "") or synthesis.summary_line()
    rendered = _phase("rejected", "rendering", stages.render, plan)
    built = _phase("build", f"{'host' if case.target == 'host' else 'aarch64'} build", stages.build, rendered, work_dir)
    operands = make_operands(spec, case.dtype, seed=case.seed, quant=getattr(plan, "quant", None))
    outcome = _phase("crash", "entry points", stages.verify, built, operands)
    if not outcome.ok:
        raise _Failure("wrong", outcome.check.reason)
    # int8 is compared byte for byte: no error-to-bound ratio to report
    return (None if case.dtype == "int8" else outcome.check.worst_ratio), tiles


def _run_pocl(case: FuzzCase, spec, work_dir: Path) -> tuple[float, str]:
    from ..pipeline import run_gpu_synth
    from ..hardware.load import load
    hw = _phase("rejected", "hardware", load, case.hw)
    try:
        report = run_gpu_synth(spec, hw, work_dir, dtype=case.dtype, verify=True, seed=case.seed).to_dict()
    except VerificationError as exc:
        raise _Failure("wrong", f"{case.dtype} kernel: {exc}") from None
    except ToolchainError as exc:
        raise _Failure("crash", f"PoCL run: {exc}") from None
    except XfcError as exc:
        raise _Failure("rejected", f"GPU synthesis: {exc}") from None
    return float(report.get("error_to_bound_ratio") or 0.0), f"tiles: {report.get('tile_summary', '')}"


def run_case(case: FuzzCase, work_dir: Path) -> CaseResult:
    """Build, run and check one case in this process; work_dir is created and removed."""
    start = time.perf_counter()
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    try:
        spec = _phase("rejected", "spec", case.spec)
        if case.target == "pocl":
            ratio, tiles = _run_pocl(case, spec, work_dir)
        else:
            ratio, tiles = _run_cpu(case, spec, work_dir)
        return CaseResult("pass", seconds=time.perf_counter() - start, error_ratio=ratio, plan=tiles)
    except _Failure as f:
        return CaseResult(f.status, f.detail, seconds=time.perf_counter() - start)
    except Exception as exc:  # a bug in xfc itself: report it as a failure of its own class
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return CaseResult("error", f"{type(exc).__name__}: {exc} ({Path(where.filename).name}:{where.lineno})",
                          seconds=time.perf_counter() - start)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# The worker process: one JSON case per line in, one JSON result per line out.
# ---------------------------------------------------------------------------------------------

def _interrupt(signum, frame):
    raise KeyboardInterrupt


def worker_main(argv: list[str]) -> int:
    work_root = Path(argv[0])
    signal.signal(signal.SIGTERM, _interrupt)   # WorkerPool's stop: unwind, stopping our children
    out = sys.stdout
    sys.stdout = sys.stderr  # anything else printed goes to the log, not into the protocol
    for n, line in enumerate(sys.stdin):
        case = FuzzCase.from_dict(json.loads(line))
        result = run_case(case, work_root / f"case-{n}")
        out.write(json.dumps(result.to_dict()) + "\n")
        out.flush()
    return 0


# ---------------------------------------------------------------------------------------------
# The pool.
# ---------------------------------------------------------------------------------------------

class _Worker:
    def __init__(self, index: int, scratch: Path, env: dict):
        self.index = index
        self.dir = scratch / f"worker-{index}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.dir / "worker.log"
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "xfc.testing.fuzz_run", str(self.dir)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     env=env, start_new_session=True, cwd=str(self.dir))
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.buffer = b""
        self.task: Optional[tuple[int, FuzzCase, float]] = None   # (key, case, start time)
        self.done = 0

    def send(self, key: int, case: FuzzCase) -> None:
        self.task = (key, case, time.monotonic())
        try:
            self.proc.stdin.write((json.dumps(case.to_dict()) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            pass  # the worker died: its closed output reports the crash

    def read_lines(self) -> tuple[list[str], bool]:
        """Complete lines available now, and whether the worker closed its output."""
        try:
            chunk = os.read(self.proc.stdout.fileno(), 65536)
        except BlockingIOError:
            return [], False
        if not chunk:
            return [], True
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        return [ln.decode() for ln in lines if ln.strip()], False

    def log_tail(self) -> str:
        try:
            lines = [ln.strip() for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        return lines[-1][:300] if lines else ""

    def terminate(self) -> None:
        """Ask the worker to stop: SIGTERM to its group. The worker turns it into KeyboardInterrupt,
        so procs.run stops the compiler or qemu run it started (their own process groups, which a
        SIGKILL of the worker's group does not reach: they went on writing into the scratch
        directory after xfc had removed it) and the case removes its work directory."""
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self, deadline: Optional[float] = None) -> None:
        """Kill the worker and everything in its group, then reap it; with a deadline
        (time.monotonic()), first let a terminated worker exit on its own until then."""
        while deadline is not None and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._reap()

    def stop(self) -> None:
        """Let an idle worker finish: close its input, wait, kill if it lingers."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.kill()

    def _reap(self) -> None:
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self.log.close()


def _worker_env(scratch: Path, base_env: dict) -> dict:
    env = dict(base_env)
    tmp = scratch / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env["TMPDIR"] = str(tmp)   # gcc, qemu runs and tempfile land inside the scratch directory
    package_root = str(IMPORT_ROOT)
    env["PYTHONPATH"] = package_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_WAIT_POLICY", "passive")  # idle OpenMP threads must not spin on shared cores
    return env


class WorkerPool:
    """`jobs` worker processes that run cases; use as a context manager (kills them on exit).
    base_env: the environment the workers start from (the command line passes its own)."""

    def __init__(self, jobs: int, scratch: Path, timeout_s: float = DEFAULT_TIMEOUT_S,
                 cases_per_worker: int = CASES_PER_WORKER, base_env: Optional[dict] = None):
        self.jobs = max(1, int(jobs))
        self.scratch = Path(scratch)
        self.timeout_s = float(timeout_s)
        self.cases_per_worker = cases_per_worker
        self.env = _worker_env(self.scratch, base_env or {"PATH": os.defpath})
        self.workers: list[_Worker] = []
        self._spawned = 0
        self._selector = selectors.DefaultSelector()   # every live worker's output, across runs

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        workers, self.workers = self.workers, []
        for w in workers:
            w.terminate()
        deadline = time.monotonic() + WORKER_STOP_GRACE_S   # one grace period for all of them
        for w in workers:
            w.kill(deadline)
        self._selector.close()

    def _spawn(self) -> _Worker:
        worker = _Worker(self._spawned, self.scratch, self.env)
        self._spawned += 1
        self.workers.append(worker)
        self._selector.register(worker.proc.stdout, selectors.EVENT_READ, worker)
        return worker

    def _retire(self, worker: _Worker, kill: bool) -> None:
        self.workers.remove(worker)
        self._selector.unregister(worker.proc.stdout)
        if kill:
            worker.terminate()
            worker.kill(time.monotonic() + WORKER_STOP_GRACE_S)
        else:
            worker.stop()
        shutil.rmtree(worker.dir, ignore_errors=True)

    def run(self, cases: Iterable[FuzzCase], deadline: Optional[float] = None,
            on_result: Optional[Callable[[int, FuzzCase, CaseResult], None]] = None,
            on_tick: Optional[Callable[[], None]] = None) -> Iterator[tuple[int, FuzzCase, CaseResult]]:
        """Yield (index, case, result) as cases finish (not in order). No new case starts after
        `deadline` (time.monotonic()); cases already running finish."""
        source = iter(enumerate(cases))
        exhausted = False
        selector = self._selector
        while True:
            # hand out work
            while not exhausted and (deadline is None or time.monotonic() < deadline):
                idle = [w for w in self.workers if w.task is None]
                if not idle and len(self.workers) < self.jobs:
                    idle = [self._spawn()]
                if not idle:
                    break
                item = next(source, None)
                if item is None:
                    exhausted = True
                    break
                idle[0].send(*item)
            busy = [w for w in self.workers if w.task is not None]
            if not busy:
                return
            now = time.monotonic()
            wait = min(w.task[2] + self.timeout_s - now for w in busy)
            events = selector.select(timeout=max(0.0, min(wait, 0.5)))
            finished: list[tuple[_Worker, CaseResult, bool]] = []
            for key, _ in events:
                worker: _Worker = key.data
                if worker.task is None:
                    continue
                lines, closed = worker.read_lines()
                if lines:
                    finished.append((worker, CaseResult.from_dict(json.loads(lines[-1])), False))
                elif closed:
                    code = worker.proc.poll()
                    if code is None:
                        try:
                            code = worker.proc.wait(timeout=5)
                        except subprocess.TimeoutExpired:
                            code = None
                    why = (f"killed by signal {-code}" if code is not None and code < 0 else f"exit status {code}")
                    tail = worker.log_tail()
                    finished.append((worker, CaseResult(
                        "crash", f"the worker process died ({why})" + (f": {tail}" if tail else ""),
                        seconds=time.monotonic() - worker.task[2]), True))
            now = time.monotonic()
            for worker in busy:
                if worker.task is not None and now - worker.task[2] > self.timeout_s and \
                        not any(f[0] is worker for f in finished):
                    finished.append((worker, CaseResult(
                        "timeout", f"no result after {self.timeout_s:.0f} s (worker and its children killed)",
                        seconds=now - worker.task[2]), True))
            for worker, result, dead in finished:
                index, case, _ = worker.task
                worker.task = None
                worker.done += 1
                if dead or worker.done >= self.cases_per_worker:
                    self._retire(worker, kill=dead)
                if on_result:
                    on_result(index, case, result)
                yield index, case, result
            if on_tick:
                on_tick()

    def run_all(self, cases: list[FuzzCase]) -> list[CaseResult]:
        """Results in the order of cases."""
        results: dict[int, CaseResult] = {}
        for index, _, result in self.run(cases):
            results[index] = result
        return [results[i] for i in range(len(cases))]


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
