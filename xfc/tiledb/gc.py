"""`xfc tiledb gc`: remove what builds leave behind, optionally rows of outdated descriptions.

Removed: build claims of processes that are gone (or older than the stale limit), xfc's own
temporary database files beside the database ('.<name>.*.tmp', older than an hour). With
--stale: rows of fingerprints whose description (found again by its label) now has another
fingerprint. Then the WAL is checkpointed and the file compacted (VACUUM).
"""
from __future__ import annotations

import os
import socket
import time
from ..errors import XfcError
from .build import CLAIM_STALE_S
from .fingerprint import fingerprint
from .store import TileDb, _pid_alive

TEMP_AGE_S = 3600.0


def _current_fingerprint(label: str, cache: dict) -> str | None:
    """The fingerprint the description named by label has today, or None if it cannot be loaded."""
    name, _, role = label.rpartition(":")
    if name not in cache:
        from ..hardware.load import load
        try:
            cache[name] = load(name)
        except XfcError:
            cache[name] = None
    hw = cache[name]
    if hw is None:
        return None
    try:
        return fingerprint(hw, hw.cluster(role))
    except XfcError:
        return None


def collect(db: TileDb, *, stale: bool, dry_run: bool) -> list[str]:
    lines = []
    host, now = socket.gethostname(), time.time()
    dead = [task for task, h, pid, at in db.query("SELECT task, host, pid, claimed_at FROM claim")
            if now - at > CLAIM_STALE_S or (h == host and not _pid_alive(pid))]
    lines.append(f"{'would remove' if dry_run else 'removed'} {len(dead)} dead build claim(s)")
    temps = [p for p in db.path.parent.glob(f".{db.path.name}.*.tmp")
             if p.is_file() and now - p.stat().st_mtime > TEMP_AGE_S]
    lines.append(f"{'would remove' if dry_run else 'removed'} {len(temps)} stray temporary file(s)")
    stale_fps: list[tuple[str, str]] = []
    if stale:
        cache: dict = {}
        current = {}
        for fp, label in db.query("SELECT fingerprint, label FROM hardware ORDER BY label"):
            current.setdefault(fp, []).append((label, _current_fingerprint(label, cache)))
        for fp, entries in sorted(current.items()):
            # stale only when every label that names it now resolves to another fingerprint
            if all(now_fp is not None and now_fp != fp for _, now_fp in entries):
                stale_fps.append((fp, ",".join(label for label, _ in entries)))
        for fp, labels in stale_fps:
            n = db.query("SELECT COUNT(*) FROM tile WHERE fingerprint = ?", (fp,))[0][0]
            lines.append(f"{'would remove' if dry_run else 'removed'} {n} tile row(s) of {labels} "
                         f"(fingerprint {fp[:12]}, the description has changed)")
    if dry_run:
        return lines

    def work(conn):
        conn.executemany("DELETE FROM claim WHERE task = ?", [(t,) for t in dead])
        for fp, _ in stale_fps:
            for table in ("tile", "operator", "hardware"):
                conn.execute(f"DELETE FROM {table} WHERE fingerprint = ?", (fp,))
            conn.execute("DELETE FROM calibration WHERE subject = ?", (fp,))
    db.transact(work, "gc")
    for p in temps:
        try:
            os.unlink(p)
        except OSError:
            pass
    db.compact()
    lines.append(f"compacted {db.path} ({db.path.stat().st_size / 1024:.0f} KiB)")
    return lines
