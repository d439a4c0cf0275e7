"""`xfc tiledb verify`: SQLite integrity, the file's marks and schema, and every row re-checked
as an import would check it (canonical JSON, sources, fingerprint = hash of facts)."""
from __future__ import annotations

from pathlib import Path

from .records import RecordError, as_dict, check_record
from .schema import SCHEMA_VERSION, user_version
from .store import TileDb

KINDS = ("hardware", "tile", "operator", "calibration")


def verify(path: Path) -> tuple[list[str], int]:
    """(problems, rows checked). Raises TileDbError when the file cannot be opened at all."""
    problems: list[str] = []
    checked = 0
    with TileDb.open(path, readonly=True) as db:
        integrity = [r[0] for r in db.query("PRAGMA integrity_check")]
        if integrity != ["ok"]:
            problems += [f"sqlite integrity: {line}" for line in integrity[:20]]
        version = user_version(db.conn)
        if version != SCHEMA_VERSION:
            problems.append(f"schema version {version}, expected {SCHEMA_VERSION}")
        fingerprints = set()
        for kind in KINDS:
            for row in db.rows(kind):
                checked += 1
                try:
                    check_record(kind, as_dict(row), f"{kind} row")
                except RecordError as exc:
                    problems.append(str(exc))
                if kind == "hardware":
                    fingerprints.add(row.fingerprint)
                elif kind in ("tile", "operator") and row.fingerprint not in fingerprints:
                    problems.append(f"{kind} row for fingerprint {row.fingerprint} has no hardware facts")
    return problems, checked
