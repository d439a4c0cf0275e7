"""Deterministic JSON-lines export, and import / merge that keep every row's provenance.

Export format (one JSON object per line, sorted keys, no spaces):
  line 1   {"export_version":1,"format":"xfc-tile-db-export","schema_version":N}
  then     {"kind":"hardware"|"tile"|"operator"|"calibration", <the row's columns>}
           sorted by kind (in that order), then by the row's key.
Nothing local to one file is exported (row ids, the database id, build claims), so the same
rows give the same bytes.

Import and merge check every record first (types, canonical JSON, source names, fingerprint =
hash of facts) and then write all of them in one transaction: all or nothing. A row whose key
exists with the same values is skipped; with other values it is a conflict: the existing row is
kept and the conflict reported, never overwritten. Rows differ in key when they come from
different machines (origin), so two machines' measurements of one tile both stay.
"""
from __future__ import annotations

import contextlib
import json
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from .records import RECORD_TYPES, RecordError, as_dict, canonical_json, check_record, key_of
from .schema import SCHEMA_VERSION
from .store import TileDb, TileDbError, store_row

EXPORT_FORMAT = "xfc-tile-db-export"
EXPORT_VERSION = 1
KIND_ORDER = ("hardware", "tile", "operator", "calibration")
MAX_LINE_BYTES = 1 << 20


def header() -> str:
    return canonical_json({"format": EXPORT_FORMAT, "export_version": EXPORT_VERSION,
                           "schema_version": SCHEMA_VERSION})


def export_lines(db: TileDb) -> Iterator[str]:
    yield header()
    for kind in KIND_ORDER:
        rows = db.rows(kind)
        rows.sort(key=lambda r: tuple((0, v) if isinstance(v, (int, float)) else (1, str(v)) for v in key_of(r)))
        for row in rows:
            yield canonical_json({"kind": kind, **as_dict(row)})


def write_export(db: TileDb, out: Path) -> int:
    """Write the export to out atomically; returns the number of records. An existing out is
    replaced only if it is an xfc export itself."""
    if out.exists():
        if not out.is_file() or not _is_export(out):
            raise TileDbError(f"{out}: exists and is not an xfc tile-db export; refusing to overwrite it")
    count = 0
    tmp = out.parent / f".{out.name}.{uuid.uuid4().hex[:12]}.tmp"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # mode as the umask allows
    except OSError as exc:
        raise TileDbError(f"{out}: cannot write here ({exc.strerror})") from None
    try:
        with os.fdopen(fd, "w", encoding="ascii", newline="\n") as f:
            for line in export_lines(db):
                f.write(line + "\n")
                count += 1
        os.replace(tmp, out)
    except OSError as exc:
        raise TileDbError(f"{out}: cannot write the export ({exc.strerror or exc})") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return count - 1


def _is_export(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            first = f.readline(4096)
        return json.loads(first).get("format") == EXPORT_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def _no_constants(name: str):
    raise ValueError(f"{name} is not allowed")


def read_export(stream: Iterable[bytes | str], where: str) -> list[tuple[str, object]]:
    """Every record of an export as (kind, checked row); RecordError/TileDbError on the first problem."""
    records = []
    saw_header = False
    for number, raw in enumerate(stream, start=1):
        line = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        if len(line) > MAX_LINE_BYTES:
            raise TileDbError(f"{where}:{number}: line longer than {MAX_LINE_BYTES} bytes")
        if not line.strip():
            continue
        try:
            obj = json.loads(line, parse_constant=_no_constants)
        except ValueError as exc:
            raise TileDbError(f"{where}:{number}: not JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise TileDbError(f"{where}:{number}: a line must be a JSON object")
        if not saw_header:
            if obj.get("format") != EXPORT_FORMAT:
                raise TileDbError(f"{where}: not an xfc tile-db export (first line has no format "
                                  f"{EXPORT_FORMAT!r})")
            version = obj.get("schema_version")
            if not isinstance(version, int) or isinstance(version, bool) or version < 1:
                raise TileDbError(f"{where}: header has no valid schema_version ({version!r})")
            if version > SCHEMA_VERSION:
                raise TileDbError(f"{where}: written by a newer xfc (schema {version!r}; this xfc reads up to "
                                  f"{SCHEMA_VERSION}); upgrade xfc")
            saw_header = True
            continue
        kind = obj.pop("kind", None)
        if kind not in RECORD_TYPES:
            raise TileDbError(f"{where}:{number}: unknown record kind {kind!r}")
        records.append((kind, check_record(kind, obj, f"{where}:{number}")))
    if not saw_header:
        raise TileDbError(f"{where}: empty, not an xfc tile-db export")
    return records


def read_export_file(path: Path) -> list[tuple[str, object]]:
    try:
        with open(path, "rb") as f:
            return read_export(f, str(path))
    except OSError as exc:
        raise TileDbError(f"{path}: cannot read ({exc.strerror})") from None


def rows_of_database(path: Path) -> list[tuple[str, object]]:
    """Every row of another tile database, re-checked like an import (it may come from anywhere)."""
    with TileDb.open(path, readonly=True) as other:
        out = []
        for kind in KIND_ORDER:
            for row in other.rows(kind):
                d = as_dict(row)
                try:
                    out.append((kind, check_record(kind, d, f"{path} ({kind})")))
                except RecordError as exc:
                    raise TileDbError(str(exc)) from None
        return out


@dataclass
class MergeReport:
    inserted: dict[str, int] = field(default_factory=dict)
    unchanged: int = 0
    conflicts: list[str] = field(default_factory=list)

    @property
    def total_inserted(self) -> int:
        return sum(self.inserted.values())


def merge_records(db: TileDb, records: list[tuple[str, object]]) -> MergeReport:
    """Insert records into db in one transaction; see the module docstring for the rules."""
    def work(conn):
        report = MergeReport()
        for kind, row in records:
            outcome = store_row(conn, kind, row, replace=False)
            if outcome == "inserted":
                report.inserted[kind] = report.inserted.get(kind, 0) + 1
            elif outcome == "exists":
                report.unchanged += 1
            else:
                report.conflicts.append(f"{kind} {canonical_json(list(key_of(row)))}")
        return report
    return db.transact(work, "merge")
