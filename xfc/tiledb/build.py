"""`xfc tiledb build`: evaluate every task of a hardware description into a tile database.

A task is one row to produce, named by the row's key: a micro-tile (fingerprint, op class,
dtype, ISA, tile parameters, source, origin) or an operator of the suite (fingerprint, operator
key, cluster, threads, source, origin). The build is:
  resumable    each row is committed in its own transaction as soon as it is evaluated; a
               re-run skips every key that has a row (a computed row made by another xfc version
               is recomputed), so kill -9 loses at most the tasks in flight;
  concurrent   before evaluating, a task is claimed in the database; a second builder skips
               tasks claimed by a live builder and takes over claims of dead ones, so two builds
               on one file split the work, lose nothing and measure nothing twice;
  parallel     --jobs N evaluates N tasks at once in threads (the host evaluator still times one
               tile at a time); the main thread alone writes.
  executors    the task list is a value: LocalExecutor (threads, the default) and
               xfc.tiledb.ray_executor.RayExecutor (a Ray cluster) run the same list through
               run_build, which alone writes; an executor reports where each task ran, and may
               report a task as not measured (a crashed worker after its retries) instead of
               stopping the build.
Progress goes to a stream (stderr) as a bar with an ETA on a terminal, as a line every few
seconds otherwise.
"""
from __future__ import annotations

import hashlib
import os
import socket
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, TextIO, Union

from .._version import __version__
from ..errors import XfcError
from ..hardware.model import CpuCluster, HardwareDescription
from ..cpu.tiles import MicroTile, enumerate_micro_tiles
from ..cpu.isa import isa_for
from .evaluators import OP_GEMM_UKERNEL, TileResult, tile_params
from .fingerprint import cluster_facts, fingerprint, label
from .operators import OperatorResult
from .records import HardwareRow, OperatorRow, TileRow, canonical_json, is_computed
from .store import TileDb, TileDbError

OP_CHOICES = ("gemm", "operators")   # GEMM micro-kernels; whole suite operators (operator table)
CLAIM_STALE_S = 3600.0        # a claim older than this is taken over even if its process lives
WAIT_POLL_S = 0.2

TILE_KEY_SQL = ("SELECT xfc_version FROM tile WHERE fingerprint = ? AND op_class = ? AND dtype = ? AND isa = ? "
                "AND params = ? AND source = ? AND origin = ?")
OPERATOR_KEY_SQL = ("SELECT xfc_version FROM operator WHERE fingerprint = ? AND op_key = ? AND cluster = ? "
                    "AND threads = ? AND source = ? AND origin = ?")


@dataclass(frozen=True)
class TileTask:
    """One micro-tile row: evaluator.measure(tile, cluster, isa)."""

    fingerprint: str
    label: str
    cluster: CpuCluster
    isa: str
    tile: MicroTile
    source: str
    origin: str
    evaluator: object = field(compare=False, hash=False, repr=False)
    op_class: str = OP_GEMM_UKERNEL
    dtype: str = "fp32"
    table = "tile"
    key_sql = TILE_KEY_SQL

    @property
    def params(self) -> str:
        return tile_params(self.tile)

    @property
    def key(self) -> tuple:
        return (self.fingerprint, self.op_class, self.dtype, self.isa, self.params, self.source, self.origin)

    def evaluate(self) -> TileResult:
        return self.evaluator.measure(self.tile, self.cluster, self.isa)

    def row(self, result: TileResult, created_at: str) -> TileRow:
        return TileRow(fingerprint=self.fingerprint, op_class=self.op_class, dtype=self.dtype, isa=self.isa,
                       params=self.params, source=self.source, origin=self.origin, cycles_per_k=result.cycles_per_k,
                       seconds=result.seconds, gflops=result.gflops, efficiency=result.efficiency,
                       bound=result.bound, repeats=result.repeats, spread=result.spread,
                       conditions=canonical_json(result.conditions), emulated=result.emulated,
                       compiler=result.compiler, xfc_version=__version__, created_at=created_at)

    def describe(self) -> str:
        return f"{self.label} {self.source} {self.isa} {self.tile.mr}x{self.tile.nr}"


@dataclass(frozen=True)
class OperatorTask:
    """One operator row: evaluator.measure_operator(hw, cluster, spec, threads)."""

    fingerprint: str
    label: str
    hw: HardwareDescription = field(compare=False, hash=False, repr=False)
    cluster: CpuCluster = field(compare=False, hash=False, repr=False)
    workload: str = ""
    spec: object = field(default=None, compare=False, hash=False, repr=False)
    threads: int = 1
    source: str = "static"
    origin: str = ""
    evaluator: object = field(default=None, compare=False, hash=False, repr=False)
    table = "operator"
    key_sql = OPERATOR_KEY_SQL

    @property
    def key(self) -> tuple:
        return (self.fingerprint, self.spec.key(), self.cluster.role, self.threads, self.source, self.origin)

    def evaluate(self) -> OperatorResult:
        return self.evaluator.measure_operator(self.hw, self.cluster, self.spec, self.threads)

    def row(self, result: OperatorResult, created_at: str) -> OperatorRow:
        return OperatorRow(fingerprint=self.fingerprint, op_key=self.spec.key(), cluster=self.cluster.role,
                           threads=self.threads, plan=result.plan, predicted_s=result.predicted_s,
                           measured_s=result.measured_s, gflops=result.gflops, source=self.source,
                           origin=self.origin, repeats=result.repeats, spread=result.spread,
                           conditions=canonical_json(result.conditions), compiler=result.compiler,
                           xfc_version=__version__, created_at=created_at)

    def describe(self) -> str:
        return f"{self.label} {self.source} {self.workload} x{self.threads}"


Task = Union[TileTask, OperatorTask]


def task_id(task: Task) -> str:
    return hashlib.sha256(canonical_json([task.table, *task.key]).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class BuildSummary:
    planned: int
    skipped: int          # rows that already existed
    evaluated: int
    taken_by_others: int  # rows another builder wrote while this one ran
    replaced: int         # computed rows of another xfc version recomputed
    conflicts: int
    where: tuple[tuple[str, str, int], ...] = ()   # (source, place a task ran, tasks), sorted
    unmeasured: tuple[tuple[str, str], ...] = ()   # (task, why) an executor gave up on; no row


class LocalExecutor:
    """N threads of this process (the default executor): every task runs 'local'."""

    name = "local"

    def __init__(self, jobs: int = 1):
        if jobs < 1:
            raise XfcError(f"--jobs must be >= 1, got {jobs}")
        self.capacity = jobs
        self._pool: Optional[ThreadPoolExecutor] = None

    def __enter__(self) -> "LocalExecutor":
        self._pool = ThreadPoolExecutor(max_workers=self.capacity)
        return self

    def __exit__(self, *exc) -> None:
        self._pool.shutdown(wait=True)

    def submit(self, task: "Task") -> Future:
        """A future of (result, place)."""
        return self._pool.submit(lambda: (task.evaluate(), "local"))

    def failure(self, exc: BaseException) -> Optional[str]:
        """Why a task could not be measured (the build goes on), or None: the error stops the build."""
        return None


def clusters_of(hw: HardwareDescription, role: Optional[str]) -> tuple[CpuCluster, ...]:
    return (hw.cluster(role),) if role else hw.clusters


def parse_tiles(text: str) -> frozenset[tuple[int, int]]:
    """'14x32,6x64' -> {(14, 32), (6, 64)} (MR x NR)."""
    out = set()
    for item in filter(None, (t.strip() for t in text.split(","))):
        mr, sep, nr = item.lower().partition("x")
        if not sep or not mr.isdigit() or not nr.isdigit() or int(mr) < 1 or int(nr) < 1:
            raise XfcError(f"--tiles: {item!r} is not MRxNR (e.g. 14x32)")
        out.add((int(mr), int(nr)))
    return frozenset(out)


def plan_tasks(db: TileDb, hw: HardwareDescription, evaluators: Sequence, ops: Sequence[str],
               cluster_role: Optional[str] = None, tiles: Optional[frozenset] = None) -> list[Task]:
    """Every task for hw, in a stable order (clusters fastest first, evaluators as given, tiles
    in enumeration order, workloads in suite order); tiles: only these (MR, NR) shapes.
    An evaluator serves the classes it implements: measure (micro-tiles), measure_operator."""
    from ..ops.workloads import SUITE, suite_spec
    tasks: list[Task] = []
    for cluster in clusters_of(hw, cluster_role):
        fp, lab = fingerprint(hw, cluster), label(hw, cluster)
        isa = isa_for(cluster.core)
        for evaluator in evaluators:
            # an evaluator whose source depends on the core (llvm-mca:<model>) names it per cluster
            source = evaluator.source_for(cluster) if hasattr(evaluator, "source_for") else evaluator.source
            origin = db.origin_for(source)
            if "gemm" in ops and hasattr(evaluator, "measure"):
                for tile in enumerate_micro_tiles(cluster.core, isa):
                    if tiles is None or (tile.mr, tile.nr) in tiles:
                        tasks.append(TileTask(fingerprint=fp, label=lab, cluster=cluster, isa=isa, tile=tile,
                                              source=source, origin=origin, evaluator=evaluator))
            if "operators" in ops and hasattr(evaluator, "measure_operator"):
                for name in SUITE:
                    for threads in sorted({1, cluster.count}):
                        tasks.append(OperatorTask(fingerprint=fp, label=lab, hw=hw, cluster=cluster, workload=name,
                                                  spec=suite_spec(name), threads=threads, source=source,
                                                  origin=origin, evaluator=evaluator))
    return tasks


def register_hardware(db: TileDb, hw: HardwareDescription, cluster_role: Optional[str] = None) -> None:
    for cluster in clusters_of(hw, cluster_role):
        facts = canonical_json(cluster_facts(hw, cluster))
        db.put_hardware(HardwareRow(fingerprint=fingerprint(hw, cluster), label=label(hw, cluster), facts=facts))


def _existing(db: TileDb, tasks: Sequence[Task]) -> dict[tuple, str]:
    """(table, key) -> xfc_version of the rows already present for these tasks."""
    out: dict[tuple, str] = {}
    for table, cls in (("tile", TileRow), ("operator", OperatorRow)):
        fps = sorted({t.fingerprint for t in tasks if t.table == table})
        for fp in fps:
            cols = ", ".join(cls.KEY)
            for r in db.query(f"SELECT {cols}, xfc_version FROM {table} WHERE fingerprint = ?", (fp,)):
                out[(table, tuple(r[:-1]))] = r[-1]
    return out


def _is_done(task: Task, version: Optional[str]) -> bool:
    if version is None:
        return False
    # A computed row is a function of the inputs and xfc's model: another version recomputes it.
    return version == __version__ or not is_computed(task.source)


class Progress:
    """A one-line bar with ETA on a terminal; a plain line every few seconds elsewhere."""

    def __init__(self, total: int, stream: Optional[TextIO], clock: Callable[[], float] = time.monotonic,
                 every_s: float = 5.0):
        self.total, self.stream, self.clock, self.every_s = total, stream, clock, every_s
        self.start = clock()
        self.last = -1e9
        self.tty = bool(stream is not None and getattr(stream, "isatty", lambda: False)())

    def eta_s(self, done: int) -> Optional[float]:
        elapsed = self.clock() - self.start
        if done <= 0 or elapsed <= 0:
            return None
        return elapsed / done * (self.total - done)

    def line(self, done: int, what: str) -> str:
        eta = self.eta_s(done)
        eta_text = "--:--" if eta is None else f"{int(eta) // 60:02d}:{int(eta) % 60:02d}"
        pct = 100.0 * done / self.total if self.total else 100.0
        width = 24
        filled = int(width * done / self.total) if self.total else width
        return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} {pct:3.0f}% ETA {eta_text}  {what}"

    def update(self, done: int, what: str, final: bool = False) -> None:
        if self.stream is None:
            return
        now = self.clock()
        if self.tty:
            self.stream.write("\r" + self.line(done, what)[:150].ljust(150) + ("\n" if final else ""))
            self.stream.flush()
        elif final or now - self.last >= self.every_s:
            self.stream.write(self.line(done, what) + "\n")
            self.stream.flush()
            self.last = now


def run_build(db: TileDb, tasks: Sequence[Task], *, jobs: int = 1,
              progress: Optional[TextIO] = sys.stderr, created_at: Callable[[], str],
              host: Optional[str] = None, pid: Optional[int] = None, executor=None) -> BuildSummary:
    """Evaluate the tasks that have no row yet; see the module docstring for the guarantees.
    executor: LocalExecutor(jobs) unless given (an entered executor with capacity, submit, failure)."""
    if jobs < 1:
        raise XfcError(f"--jobs must be >= 1, got {jobs}")
    if executor is None:
        with LocalExecutor(jobs) as local:
            return run_build(db, tasks, jobs=jobs, progress=progress, created_at=created_at, host=host, pid=pid,
                             executor=local)
    jobs = executor.capacity
    host = host or socket.gethostname()
    pid = pid or os.getpid()
    existing = _existing(db, tasks)
    pending = [t for t in tasks if not _is_done(t, existing.get((t.table, t.key)))]
    skipped = len(tasks) - len(pending)
    bar = Progress(len(pending), progress)
    counts = {"evaluated": 0, "others": 0, "replaced": 0, "conflicts": 0}
    waiting: list[Task] = []
    places: dict[tuple[str, str], int] = {}
    unmeasured: list[tuple[str, str]] = []

    def row_done(task: Task):
        def check(conn) -> bool:
            row = conn.execute(task.key_sql, task.key).fetchone()
            return _is_done(task, row[0] if row else None)
        return check

    def finish(task: Task, result) -> None:
        row = task.row(result, created_at())
        outcome = db.put(task.table, row, replace=is_computed(task.source),
                         also=lambda conn: conn.execute("DELETE FROM claim WHERE task = ?", (task_id(task),)))
        counts["evaluated"] += 1
        counts["replaced"] += outcome == "replaced"
        counts["conflicts"] += outcome == "conflict"

    done = 0
    queue = list(pending)
    try:
        running: dict[Future, Task] = {}
        while queue or running or waiting:
            while queue and len(running) < jobs:
                task = queue.pop(0)
                state = db.claim(task_id(task), host, pid, CLAIM_STALE_S, time.time(), row_done(task))
                if state == "done":             # another builder finished it meanwhile
                    counts["others"] += 1
                    done += 1
                    bar.update(done, f"{task.describe()} (by another builder)")
                    continue
                if state == "held":             # a live builder is on it: look again later
                    waiting.append(task)
                    continue
                running[executor.submit(task)] = task
            if running:
                finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for future in finished:
                    task = running.pop(future)
                    try:
                        result, place = future.result()
                    except Exception as exc:    # noqa: BLE001 - the executor decides
                        why = executor.failure(exc)
                        if why is None:
                            raise               # an evaluator's error stops the build here
                        # no row; the claim goes, so a re-run (or another builder) measures it
                        tid = task_id(task)
                        db.transact(lambda conn: conn.execute("DELETE FROM claim WHERE task = ?", (tid,)),
                                    "release a build claim")
                        unmeasured.append((task.describe(), why))
                        done += 1
                        bar.update(done, f"{task.describe()} NOT MEASURED")
                        continue
                    finish(task, result)
                    places[(task.source, place)] = places.get((task.source, place), 0) + 1
                    done += 1
                    bar.update(done, task.describe() + ("" if place == "local" else f" on {place}"))
            elif waiting:
                time.sleep(WAIT_POLL_S)
                queue, waiting = waiting, []
    except BaseException:
        # Leave nothing claimed: a re-run (or the other builder) takes these tasks at once.
        try:
            db.release_claims(host, pid)
        except TileDbError:
            pass
        raise
    db.release_claims(host, pid)
    if pending:
        bar.update(done, "done", final=True)
    return BuildSummary(planned=len(tasks), skipped=skipped, evaluated=counts["evaluated"],
                        taken_by_others=counts["others"], replaced=counts["replaced"],
                        conflicts=counts["conflicts"],
                        where=tuple((src, place, n) for (src, place), n in sorted(places.items())),
                        unmeasured=tuple(unmeasured))
