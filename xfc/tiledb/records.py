"""The rows of the tile database as typed, frozen records; canonical JSON; sources and their rank.

Every record can be checked field by field (`check_record`): that is what import and merge run on
foreign data before a single row is written. Values are plain JSON types; nothing is ever
unpickled or evaluated.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, fields
from typing import Any, Optional

from ..errors import XfcError


class RecordError(XfcError):
    """A record (from an import, a merge or a caller) that is not a valid tile-database row."""


def canonical_json(value: Any) -> str:
    """One spelling per value: sorted keys, no spaces, ASCII, no NaN/inf (hashable and diffable)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def fingerprint_of_facts(facts_json: str) -> str:
    """A hardware fingerprint: the hash of its facts' canonical JSON (fingerprint.py collects the facts;
    a hardware record is checked against it here)."""
    return hashlib.sha256(facts_json.encode("ascii")).hexdigest()[:32]


# ---------------------------------------------------------------------------------------------
# Sources and their rank. Measured rows outrank published figures, which outrank llvm-mca, which
# outranks the static model. Emulated timings are kept for the record but never rank anything.
# ---------------------------------------------------------------------------------------------

SOURCE_RE = re.compile(r"^(static|synth|host|llvm-mca:[A-Za-z0-9._+-]{1,64}|adb:[A-Za-z0-9._:+-]{1,96}"
                       r"|published:[A-Za-z0-9._/+-]{1,128})$")
RANK_EMULATED = -1
# 'synth': a plan xfc synth recorded so that the same request is a lookup next time (plancache.py).
RANKS = {"static": 0, "synth": 0, "llvm-mca": 1, "published": 2, "host": 3, "adb": 3}


def source_kind(source: str) -> str:
    return source.split(":", 1)[0]


def source_rank(source: str, emulated: bool = False) -> int:
    return RANK_EMULATED if emulated else RANKS[source_kind(source)]


def operator_emulated(conditions: str) -> bool:
    """An operator row's emulated flag, which lives in its conditions (the operator table has no
    column for it): the device evaluator writes "emulated": true for a qemu-backed device."""
    try:
        parsed = json.loads(conditions)
    except ValueError:
        return False
    return isinstance(parsed, dict) and parsed.get("emulated") is True


def is_computed(source: str) -> bool:
    """Computed (reproducible anywhere) rather than measured on one machine: origin is ''."""
    return source_kind(source) in ("static", "synth", "llvm-mca", "published")


OP_CLASSES = ("gemm_ukernel", "depthwise_tile", "gpu_tile")
DTYPES = ("fp32", "fp16")
FINGERPRINT_RE = re.compile(r"^[0-9a-f]{32}$")
SUBJECT_RE = re.compile(r"^([0-9a-f]{32}|cpu:[0-9a-f]{32})$")
ISA_RE = re.compile(r"^[a-z][a-z0-9_]{0,15}$")
NAME_RE = re.compile(r"^[A-Za-z0-9_.@:+-]{1,64}$")
TIMESTAMP_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
ORIGIN_RE = re.compile(r"^([0-9a-f]{16})?$")
MAX_TEXT = 4096


# ---------------------------------------------------------------------------------------------
# Records.
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HardwareRow:
    fingerprint: str
    label: str
    facts: str                    # canonical JSON

    KEY = ("fingerprint", "label")


@dataclass(frozen=True)
class TileRow:
    fingerprint: str
    op_class: str
    dtype: str
    isa: str
    params: str                   # canonical JSON object
    source: str
    origin: str
    cycles_per_k: Optional[float]
    seconds: Optional[float]
    gflops: Optional[float]
    efficiency: Optional[float]
    bound: str
    repeats: int
    spread: Optional[float]
    conditions: str               # canonical JSON object
    emulated: bool
    compiler: str
    xfc_version: str
    created_at: str

    KEY = ("fingerprint", "op_class", "dtype", "isa", "params", "source", "origin")

    @property
    def rank(self) -> int:
        return source_rank(self.source, self.emulated)


@dataclass(frozen=True)
class OperatorRow:
    fingerprint: str
    op_key: str
    cluster: str
    threads: int
    plan: str                     # canonical JSON object
    predicted_s: Optional[float]
    measured_s: Optional[float]
    gflops: Optional[float]
    source: str
    origin: str
    repeats: int
    spread: Optional[float]
    conditions: str
    compiler: str
    xfc_version: str
    created_at: str

    KEY = ("fingerprint", "op_key", "cluster", "threads", "source", "origin")

    @property
    def emulated(self) -> bool:
        return operator_emulated(self.conditions)

    @property
    def rank(self) -> int:
        return source_rank(self.source, self.emulated)


@dataclass(frozen=True)
class CalibrationRow:
    subject: str
    name: str
    value: float
    unit: str
    method: str
    source: str
    origin: str
    repeats: int
    spread: Optional[float]
    conditions: str
    compiler: str
    xfc_version: str
    created_at: str

    KEY = ("subject", "name", "source", "origin")


RECORD_TYPES = {"hardware": HardwareRow, "tile": TileRow, "operator": OperatorRow, "calibration": CalibrationRow}
TABLES = {"hardware": "hardware", "tile": "tile", "operator": "operator", "calibration": "calibration"}


def columns(cls) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def key_of(row) -> tuple:
    return tuple(getattr(row, k) for k in row.KEY)


def as_dict(row) -> dict:
    out = {name: getattr(row, name) for name in columns(type(row))}
    if "emulated" in out:
        out["emulated"] = bool(out["emulated"])
    return out


# ---------------------------------------------------------------------------------------------
# Checking foreign data.
# ---------------------------------------------------------------------------------------------

def _text(where, name, v, pattern=None, allow_empty=False):
    if not isinstance(v, str) or (not v and not allow_empty) or len(v) > MAX_TEXT:
        raise RecordError(f"{where}: field '{name}' must be a string of 1-{MAX_TEXT} characters, got {v!r:.80}")
    if pattern is not None and not pattern.match(v):
        raise RecordError(f"{where}: field '{name}' has an invalid value {v!r:.80}")
    return v


def _json_object(where, name, v):
    _text(where, name, v)
    try:
        parsed = json.loads(v)
    except ValueError:
        raise RecordError(f"{where}: field '{name}' is not JSON: {v!r:.80}") from None
    if not isinstance(parsed, dict):
        raise RecordError(f"{where}: field '{name}' must be a JSON object, got {v!r:.80}")
    if canonical_json(parsed) != v:
        raise RecordError(f"{where}: field '{name}' is not in canonical form (sorted keys, no spaces): {v!r:.80}")
    return v


def _number(where, name, v, optional=True, positive=False):
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or (positive and v <= 0) or v < 0:
        raise RecordError(f"{where}: field '{name}' must be a finite number{' > 0' if positive else ' >= 0'}, "
                          f"got {v!r:.80}")
    return float(v)


def _count(where, name, v):
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise RecordError(f"{where}: field '{name}' must be an integer >= 1, got {v!r:.80}")
    return v


def _source_and_origin(where, d):
    source = _text(where, "source", d["source"], SOURCE_RE)
    origin = _text(where, "origin", d["origin"], ORIGIN_RE, allow_empty=True)
    if is_computed(source) != (origin == ""):
        raise RecordError(f"{where}: field 'origin' must be empty for computed sources and set for measured "
                          f"ones (source {source!r}, origin {origin!r})")
    return source, origin


def check_record(kind: str, d: dict, where: str):
    """A checked record of the named kind from a plain dict (an export line), or RecordError."""
    cls = RECORD_TYPES.get(kind)
    if cls is None:
        raise RecordError(f"{where}: unknown record kind {kind!r} (expected one of {', '.join(RECORD_TYPES)})")
    if not isinstance(d, dict):
        raise RecordError(f"{where}: a record must be a JSON object")
    expected = set(columns(cls))
    if set(d) != expected:
        missing, extra = sorted(expected - set(d)), sorted(set(d) - expected)
        raise RecordError(f"{where}: {kind} record " + (f"lacks {', '.join(missing)}" if missing else "")
                          + ("; " if missing and extra else "") + (f"has unknown {', '.join(extra)}" if extra else ""))
    if kind == "hardware":
        facts = _json_object(where, "facts", d["facts"])
        fp = _text(where, "fingerprint", d["fingerprint"], FINGERPRINT_RE)
        if fingerprint_of_facts(facts) != fp:
            raise RecordError(f"{where}: fingerprint {fp} is not the hash of its facts")
        return HardwareRow(fingerprint=fp, label=_text(where, "label", d["label"]), facts=facts)
    common = dict(
        compiler=_text(where, "compiler", d["compiler"], allow_empty=True),
        xfc_version=_text(where, "xfc_version", d["xfc_version"]),
        created_at=_text(where, "created_at", d["created_at"], TIMESTAMP_RE),
        conditions=_json_object(where, "conditions", d["conditions"]),
        repeats=_count(where, "repeats", d["repeats"]),
        spread=_number(where, "spread", d["spread"]),
    )
    source, origin = _source_and_origin(where, d)
    if kind == "tile":
        if not isinstance(d["emulated"], bool):
            raise RecordError(f"{where}: field 'emulated' must be true or false, got {d['emulated']!r:.80}")
        row = TileRow(
            fingerprint=_text(where, "fingerprint", d["fingerprint"], FINGERPRINT_RE),
            op_class=_text(where, "op_class", d["op_class"]),
            dtype=_text(where, "dtype", d["dtype"]),
            isa=_text(where, "isa", d["isa"], ISA_RE),
            params=_json_object(where, "params", d["params"]), source=source, origin=origin,
            cycles_per_k=_number(where, "cycles_per_k", d["cycles_per_k"], positive=True),
            seconds=_number(where, "seconds", d["seconds"], positive=True),
            gflops=_number(where, "gflops", d["gflops"], positive=True),
            efficiency=_number(where, "efficiency", d["efficiency"], positive=True),
            bound=_text(where, "bound", d["bound"]), emulated=d["emulated"], **common)
        if row.op_class not in OP_CLASSES:
            raise RecordError(f"{where}: field 'op_class' must be one of {', '.join(OP_CLASSES)}, got {row.op_class!r}")
        if row.dtype not in DTYPES:
            raise RecordError(f"{where}: field 'dtype' must be one of {', '.join(DTYPES)}, got {row.dtype!r}")
        if row.cycles_per_k is None and row.seconds is None:
            raise RecordError(f"{where}: a tile record needs cycles_per_k or seconds")
        return row
    if kind == "operator":
        threads = _count(where, "threads", d["threads"])
        row = OperatorRow(
            fingerprint=_text(where, "fingerprint", d["fingerprint"], FINGERPRINT_RE),
            op_key=_text(where, "op_key", d["op_key"]), cluster=_text(where, "cluster", d["cluster"]),
            threads=threads, plan=_json_object(where, "plan", d["plan"]),
            predicted_s=_number(where, "predicted_s", d["predicted_s"], positive=True),
            measured_s=_number(where, "measured_s", d["measured_s"], positive=True),
            gflops=_number(where, "gflops", d["gflops"], positive=True), source=source, origin=origin, **common)
        if row.predicted_s is None and row.measured_s is None:
            raise RecordError(f"{where}: an operator record needs predicted_s or measured_s")
        return row
    return CalibrationRow(
        subject=_text(where, "subject", d["subject"], SUBJECT_RE), name=_text(where, "name", d["name"], NAME_RE),
        value=_number(where, "value", d["value"], optional=False), unit=_text(where, "unit", d["unit"]),
        method=_text(where, "method", d["method"]), source=source, origin=origin, **common)
