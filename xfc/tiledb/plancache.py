"""Warm synthesis: the operator table as a plan cache, so that a repeated `xfc synth` is a lookup.

A row of source 'synth' records what synthesize_cpu returned for one request, keyed by
(fingerprint, operator key, cluster, threads): the whole plan and what reports show beside it (tile
levels, estimate, runners-up), as canonical JSON. Its `conditions` hold two digests:

  inputs   everything else that decides the plan (`inputs_digest`): the xfc version and the state of
           the synthesizer's source files, the full resolved description, the operator spec, the
           requested ISA, the cost-model constants (static or calibrated) and the tile-database rows
           that may answer micro-tile scores. A row whose inputs differ is stale: synthesis runs again
           and replaces it.
  payload  sha256 of the plan column: a row altered by hand or damaged on disk is ignored with one
           warning line, then synthesis runs and replaces it.

A hit deserializes the row into a CpuSynthesis (no candidate is enumerated); a miss synthesizes and
records. The cache lives in the per-user database (locations.user_db_path), whichever database
answered tiles and constants: shipped databases are read-only package data. Nothing here raises
for a database problem: one warning line, then plain synthesis.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable, Optional

from .._version import __version__
from ..cpu.cost_model import DEFAULT_CONSTANTS, CostConstants, CostEstimate
from ..cpu.explain import CpuSynthesis, TileLevel
from ..cpu.ir import CpuKernelPlan, DepthwiseSchedule, GemmSchedule
from ..cpu.synth import synthesize_cpu
from ..errors import XfcError
from ..hardware.model import HardwareDescription
from ..ops.spec import OperatorSpec
from .fingerprint import cluster_facts, label
from .records import MAX_TEXT, HardwareRow, OperatorRow, canonical_json
from .store import TileDb, insert_row, store_row, utc_now

SOURCE = "synth"
# The modules whose code decides a plan: their sizes and modification times enter the inputs
# digest, so an edited synthesizer never answers from rows it did not write.
PACKAGE = Path(__file__).resolve().parent.parent
SYNTH_SOURCES = ("cpu/synth.py", "cpu/tiles.py", "cpu/cost_model.py", "cpu/decide.py", "cpu/isa.py", "cpu/ir.py",
                 "cpu/explain.py", "cpu/winograd.py", "ops/spec.py", "ops/winograd.py", "tiledb/plancache.py",
                 "tiledb/evaluators.py", "tiledb/calibrate.py")
# The layout of a cached row and the synthesizer's choices it may hold: bumped when either changes
# (2: conv2d plans may be Winograd plans, with winograd_m and the lowering decision; 3: and
# winograd_vectors), so that rows written by an older synthesizer are stale even where file sizes
# and times would match.
PLAN_FORMAT = 3
_code_digest: Optional[str] = None


def code_digest() -> str:
    """Digest of (name, size, mtime) of SYNTH_SOURCES, taken once per process."""
    global _code_digest
    if _code_digest is None:
        parts = []
        for name in SYNTH_SOURCES:
            try:
                st = (PACKAGE / name).stat()
                parts.append(f"{name}:{st.st_size}:{st.st_mtime_ns}")
            except OSError:
                parts.append(f"{name}:missing")
        _code_digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]
    return _code_digest


def inputs_digest(spec: OperatorSpec, hw: HardwareDescription, isa: Optional[str], constants: CostConstants,
                  tile_state: str) -> str:
    # The description's facts; its notes and sources are prose (the host's notes carry the probe's time).
    facts_only = replace(hw, notes="", sources=(), uncertain=(), source_path="")
    facts = {"xfc": __version__, "format": PLAN_FORMAT, "code": code_digest(), "hardware": repr(facts_only),
             "spec": repr(spec),
             "isa": isa or "", "constants": constants.as_dict(), "tiles": tile_state}
    return hashlib.sha256(canonical_json(facts).encode()).hexdigest()[:32]


# ---- (de)serializing a CpuSynthesis -----------------------------------------------------------------

def synthesis_payload(result: CpuSynthesis) -> dict:
    """Everything of a CpuSynthesis except the spec and cluster (the request supplies them)."""
    plan = result.plan
    est = result.estimate
    return {
        "plan": {"isa": plan.isa, "vector_lanes": plan.vector_lanes, "lowering": plan.lowering,
                 "gemm": asdict(plan.gemm) if plan.gemm is not None else None,
                 "depthwise": asdict(plan.depthwise) if plan.depthwise is not None else None,
                 "function_name": plan.function_name, "header_lines": list(plan.header_lines),
                 "hardware_name": plan.hardware_name, "gcc_march": plan.gcc_march, "qemu_cpu": plan.qemu_cpu,
                 "extra": [list(pair) for pair in plan.extra], "winograd_m": plan.winograd_m,
                 "winograd_vectors": plan.winograd_vectors},
        "hardware": result.hardware,
        "levels": [[lv.level, lv.tile, lv.usage, lv.decided_by] for lv in result.levels],
        "estimate": {"flops": est.flops, "seconds_by_bound": [list(p) for p in est.seconds_by_bound],
                     "predicted_s": est.predicted_s, "bound": est.bound},
        "gemm_shape": list(result.gemm_shape) if result.gemm_shape is not None else None,
        "alternatives": [list(a) for a in result.alternatives],
        "micro_tile_source": result.micro_tile_source,
        "decision": result.decision,
    }


def _typed(value, kind, what: str):
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{what} is not {kind.__name__}")
    return value


def synthesis_from_payload(payload: dict, spec: OperatorSpec, cluster) -> CpuSynthesis:
    """The CpuSynthesis a payload describes; ValueError/TypeError/KeyError when it does not fit."""
    p = payload["plan"]
    gemm = GemmSchedule(**p["gemm"]) if p["gemm"] is not None else None
    depthwise = DepthwiseSchedule(**p["depthwise"]) if p["depthwise"] is not None else None
    plan = CpuKernelPlan(
        spec=spec, isa=_typed(p["isa"], str, "isa"), vector_lanes=_typed(p["vector_lanes"], int, "vector_lanes"),
        lowering=_typed(p["lowering"], str, "lowering"), gemm=gemm, depthwise=depthwise,
        function_name=_typed(p["function_name"], str, "function_name"),
        header_lines=tuple(_typed(x, str, "header line") for x in p["header_lines"]),
        hardware_name=_typed(p["hardware_name"], str, "hardware_name"), gcc_march=_typed(p["gcc_march"], str, "gcc_march"),
        qemu_cpu=_typed(p["qemu_cpu"], str, "qemu_cpu"),
        extra=tuple((_typed(k, str, "extra"), _typed(v, str, "extra")) for k, v in p["extra"]),
        winograd_m=_typed(p["winograd_m"], int, "winograd_m"),
        winograd_vectors=_typed(p["winograd_vectors"], str, "winograd_vectors"))
    e = payload["estimate"]
    estimate = CostEstimate(flops=_typed(e["flops"], int, "flops"),
                            seconds_by_bound=tuple((_typed(n, str, "bound"), _typed(s, float, "seconds"))
                                                   for n, s in e["seconds_by_bound"]),
                            predicted_s=_typed(e["predicted_s"], float, "predicted_s"), bound=_typed(e["bound"], str, "bound"))
    shape = payload["gemm_shape"]
    return CpuSynthesis(
        spec=spec, hardware=_typed(payload["hardware"], str, "hardware"), cluster=cluster, plan=plan,
        levels=tuple(TileLevel(*(_typed(x, str, "level") for x in lv)) for lv in payload["levels"]),
        estimate=estimate,
        gemm_shape=tuple(_typed(x, int, "gemm_shape") for x in shape) if shape is not None else None,
        alternatives=tuple((_typed(s, str, "alternative"), _typed(t, float, "alternative")) for s, t in payload["alternatives"]),
        micro_tile_source=_typed(payload["micro_tile_source"], str, "micro_tile_source"),
        decision=_typed(payload["decision"], str, "decision"))


def payload_digest(plan_text: str) -> str:
    return hashlib.sha256(plan_text.encode()).hexdigest()


# ---- the cache ------------------------------------------------------------------------------------

class PlanCache:
    """Lookups and records of synthesized plans in one database file (opened lazily).

    status: what the last `synthesize` did: 'hit', 'miss' (synthesized, recorded), 'stale'
    (the row's inputs differed: synthesized, replaced), 'ignored' (an unreadable or altered row:
    synthesized, replaced), 'unavailable' (the database could not be used: synthesized only)."""

    def __init__(self, path: Path, warn: Callable[[str], None], reader: Optional[TileDb] = None):
        self.path = Path(path)
        self._warn = warn
        self._reader = reader          # an open handle on the same file, if synthesis already has one
        self._own: Optional[TileDb] = None
        self._broken = False
        self._pending: list = []
        self.report = {"path": str(self.path), "status": ""}   # the report's tile_db.plan_cache entry

    @property
    def status(self) -> str:
        return self.report["status"]

    @status.setter
    def status(self, value: str) -> None:
        self.report["status"] = value

    def prepare(self) -> "PlanCache":
        """Open the file and take the code digest now, with the rest of the set-up, so that a lookup
        is only a query and a deserialization."""
        code_digest()
        self._read_handle()
        return self

    def close(self) -> None:
        """Write the plans synthesized since the last close, then close the file."""
        pending, self._pending = self._pending, []
        for item in pending:
            self._write(*item)
        if self._own is not None:
            self._own.close()
            self._own = None

    def _fail(self, exc: XfcError) -> None:
        if not self._broken:
            self._broken = True
            self._warn(f"warning: {exc}; plans are synthesized, not looked up")

    def _read_handle(self) -> Optional[TileDb]:
        if self._broken:
            return None
        if self._own is not None:
            return self._own
        if self._reader is not None:
            return self._reader
        if not self.path.exists():
            return None
        try:
            self._own = TileDb.open(self.path, readonly=True, busy_timeout_s=2.0)
        except XfcError as exc:
            self._fail(exc)
            return None
        return self._own

    def lookup(self, key: tuple, inputs: str, spec: OperatorSpec, cluster) -> tuple[Optional[CpuSynthesis], str]:
        """(synthesis, status) for key = (fingerprint, op_key, cluster role, threads)."""
        db = self._read_handle()
        if db is None:
            return None, "unavailable" if self._broken else "miss"
        try:
            rows = db.rows("operator", "fingerprint = ? AND op_key = ? AND cluster = ? AND threads = ? "
                                       "AND source = ? AND origin = ''", (*key, SOURCE))
        except XfcError as exc:
            self._fail(exc)
            return None, "unavailable"
        if not rows:
            return None, "miss"
        row = rows[0]
        try:
            conditions = json.loads(row.conditions)
            if not isinstance(conditions, dict) or conditions.get("payload") != payload_digest(row.plan):
                raise ValueError("its checksum does not match")
            if conditions.get("inputs") != inputs:
                return None, "stale"
            return synthesis_from_payload(json.loads(row.plan), spec, cluster), "hit"
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            self._warn(f"warning: tile db {self.path}: the recorded plan for {key[1]} ({key[2]} cluster, "
                       f"{key[3]} thread(s)) is unreadable or altered ({exc}); ignored, synthesizing it again")
            return None, "ignored"

    def record(self, key: tuple, inputs: str, result: CpuSynthesis, hardware: HardwareRow) -> None:
        """Queue a synthesized plan; close() writes it (so the write is not part of synthesis time).
        hardware: the fingerprint's facts and label, written with it (so `tiledb gc --stale` finds
        the rows of an edited description)."""
        if not self._broken:
            self._pending.append((key, inputs, result, hardware))

    def _write(self, key: tuple, inputs: str, result: CpuSynthesis, hardware: HardwareRow) -> None:
        if self._broken:
            return
        plan_text = canonical_json(synthesis_payload(result))
        if len(plan_text) > MAX_TEXT:      # a row export/import would refuse: not cached
            return
        est = result.estimate
        row = OperatorRow(fingerprint=key[0], op_key=key[1], cluster=key[2], threads=key[3], plan=plan_text,
                          predicted_s=est.predicted_s, measured_s=None, gflops=est.predicted_gflops, source=SOURCE,
                          origin="", repeats=1, spread=None,
                          conditions=canonical_json({"inputs": inputs, "payload": payload_digest(plan_text)}),
                          compiler="", xfc_version=__version__, created_at=utc_now())
        try:
            if self._own is None or self._own.readonly:
                self.close()
                self._own = TileDb.open(self.path)
            def work(conn):
                insert_row(conn, "hardware", hardware)
                store_row(conn, "operator", row, replace=True)
            self._own.transact(work, "record a plan")
        except XfcError as exc:
            self._fail(exc)


def cached_synthesis(cache: Optional[PlanCache], spec: OperatorSpec, hw: HardwareDescription, *,
                     fingerprint: str, tile_state: str, cluster: Optional[str] = None,
                     threads: Optional[int] = None, evaluator=None, isa: Optional[str] = None,
                     constants: CostConstants = DEFAULT_CONSTANTS) -> CpuSynthesis:
    """synthesize_cpu through the plan cache (same arguments, same result)."""
    if cache is None:
        return synthesize_cpu(spec, hw, cluster, threads, evaluator=evaluator, isa=isa, constants=constants)
    chosen = hw.cluster(cluster)
    resolved = threads if threads is not None else chosen.count
    key = (fingerprint, spec.key(), chosen.role, resolved)
    inputs = inputs_digest(spec, hw, isa, constants, tile_state)
    found, status = cache.lookup(key, inputs, spec, chosen)
    if found is not None:
        cache.status = status
        return found
    result = synthesize_cpu(spec, hw, cluster, threads, evaluator=evaluator, isa=isa, constants=constants)
    cache.record(key, inputs, result, HardwareRow(fingerprint=fingerprint, label=label(hw, chosen),
                                                  facts=canonical_json(cluster_facts(hw, chosen))))
    cache.status = "unavailable" if cache._broken else status
    return result
