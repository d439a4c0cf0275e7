"""Opening a tile database and reading / writing its rows (stdlib sqlite3, SQL parameters only).

Safety rules:
  * A path that exists is opened only if its first 100 bytes say 'SQLite format 3' with xfc's
    application_id; anything else (another program's database, a text file, an empty file) is
    refused with one line and never touched.
  * A new database is built in a temporary file beside the target and hard-linked into place, so
    the path holds either nothing or a complete database, and a database that another process
    created meanwhile is used, never replaced.
  * A database written by a newer xfc (higher schema version) is refused; an older one is
    migrated in one write transaction (read-only opens refuse it instead).
  * WAL journal, a busy timeout and a retry loop with back-off around every write transaction
    (BEGIN IMMEDIATE), so concurrent builders wait for each other instead of failing with
    'database is locked'; readers see committed rows only.
  * Every sqlite3 error leaves this module as one TileDbError line naming the file (corrupt file,
    full disk, read-only location, ...).
"""
from __future__ import annotations

import contextlib
import errno
import os
import random
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Optional, TypeVar
from urllib.parse import quote

from ..errors import XfcError
from .records import (CalibrationRow, HardwareRow, OperatorRow, TileRow, as_dict, columns, is_computed,
                      key_of)
from .schema import APPLICATION_ID, FORMAT_NAME, SCHEMA_VERSION, application_id, migrate, user_version

SQLITE_MAGIC = b"SQLite format 3\x00"
BUSY_TIMEOUT_S = 30.0      # sqlite's own busy handler, per statement
RETRY_DEADLINE_S = 300.0   # our retries around whole transactions
T = TypeVar("T")


class TileDbError(XfcError):
    """A tile database that cannot be opened, read or written (exit status 2)."""


def _busy(exc: sqlite3.Error) -> bool:
    text = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text)


def _describe(exc: BaseException) -> str:
    text = (exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)).strip() or type(exc).__name__
    low = text.lower()
    if "malformed" in low or "not a database" in low or "disk i/o" in low:
        return f"corrupt or unreadable database ({text}); it was not modified. Move it aside and rebuild"
    if "disk is full" in low or getattr(exc, "errno", None) == errno.ENOSPC:
        return f"disk full ({text})"
    if "readonly" in low or "read-only" in low or getattr(exc, "errno", None) in (errno.EROFS, errno.EACCES):
        return f"read-only location or file ({text})"
    return text


def check_header(path: Path) -> None:
    """Refuse a file that is not an xfc tile database, from its first 100 bytes only."""
    try:
        with open(path, "rb") as f:
            head = f.read(100)
    except OSError as exc:
        raise TileDbError(f"{path}: cannot read ({exc.strerror})") from None
    if not head:
        raise TileDbError(f"{path}: is an empty file, not an xfc tile database; refusing to use it")
    if not head.startswith(SQLITE_MAGIC):
        raise TileDbError(f"{path}: is not an xfc tile database (not an SQLite file); refusing to use it")
    if len(head) < 100:
        raise TileDbError(f"{path}: corrupt or truncated SQLite header; refusing to use it")
    app_id = int.from_bytes(head[68:72], "big")
    if app_id != APPLICATION_ID:
        raise TileDbError(f"{path}: is an SQLite database of another application (application_id {app_id:#x}, "
                          f"xfc uses {APPLICATION_ID:#x}); refusing to use it")


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def timestamps(environ: Mapping[str, str]) -> Callable[[], str]:
    """The clock rows are stamped with: UTC now, or the fixed instant SOURCE_DATE_EPOCH names
    (the reproducible-builds convention), so the same inputs give the same export."""
    epoch = environ.get("SOURCE_DATE_EPOCH")
    if epoch is None:
        return utc_now
    try:
        fixed = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(epoch)))
    except (ValueError, OverflowError, OSError):
        raise XfcError(f"SOURCE_DATE_EPOCH must be an integer number of seconds, got {epoch!r}") from None
    return lambda: fixed


class TileDb:
    """One open tile database. Not shared between threads: open one per thread or process."""

    def __init__(self, path: Path, conn: sqlite3.Connection, readonly: bool):
        self.path = path
        self.conn = conn
        self.readonly = readonly
        self.db_id = ""
        self.migrated_from: Optional[int] = None

    # ---- opening -----------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike, *, create: bool = True, readonly: bool = False,
             busy_timeout_s: float = BUSY_TIMEOUT_S) -> "TileDb":
        path = Path(path)
        if path.is_dir():
            raise TileDbError(f"{path}: is a directory, not a tile database file")
        if not path.exists():
            if readonly or not create:
                raise TileDbError(f"{path}: no such tile database")
            _create_atomically(path)
        check_header(path)
        try:
            if readonly:
                conn = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True,
                                       timeout=busy_timeout_s, isolation_level=None)
            else:
                conn = sqlite3.connect(str(path), timeout=busy_timeout_s, isolation_level=None)
        except sqlite3.Error as exc:
            raise TileDbError(f"{path}: cannot open ({_describe(exc)})") from None
        db = cls(path, conn, readonly)
        try:
            db._prepare()
        except BaseException:
            conn.close()
            raise
        return db

    def _prepare(self) -> None:
        with self._errors("open"):
            if not self.readonly and _retrying(lambda: self.conn.execute("PRAGMA journal_mode").fetchone()[0]) != "wal":
                _retrying(lambda: self.conn.execute("PRAGMA journal_mode=WAL").fetchone())
            if not self.readonly:
                self.conn.execute("PRAGMA synchronous=NORMAL")  # WAL: a crash loses no committed row
            if application_id(self.conn) != APPLICATION_ID:
                raise TileDbError(f"{self.path}: not an xfc tile database (application_id changed); refusing to use it")
            version = _retrying(lambda: user_version(self.conn))
            self._check_version(version)
            if version < SCHEMA_VERSION:
                if self.readonly:
                    raise TileDbError(f"{self.path}: written by an older xfc (schema {version}, this xfc uses "
                                      f"{SCHEMA_VERSION}); open it once for writing to migrate it")

                def step(conn):
                    now = user_version(conn)
                    self._check_version(now)
                    return migrate(conn)[0]
                before = self.transact(step)
                self.migrated_from = before if before < SCHEMA_VERSION else None
            meta = dict(self.conn.execute("SELECT key, value FROM meta").fetchall())
            if meta.get("format") != FORMAT_NAME:
                raise TileDbError(f"{self.path}: not an xfc tile database (meta format {meta.get('format')!r}); "
                                  "refusing to use it")
            self.db_id = meta.get("db_id", "")

    def _check_version(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise TileDbError(f"{self.path}: written by a newer xfc (schema {version}; this xfc reads up to "
                              f"{SCHEMA_VERSION}); upgrade xfc or use another --db")

    def compact(self, journal: str = "wal") -> None:
        """Checkpoint the WAL into the file and VACUUM it. journal='delete' leaves a single
        self-contained file that read-only locations can open (shipped databases)."""
        if journal not in ("wal", "delete"):
            raise ValueError(journal)
        with self._errors("compact"):
            _retrying(lambda: self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall())
            _retrying(lambda: self.conn.execute("VACUUM"))
            if journal == "delete":
                _retrying(lambda: self.conn.execute("PRAGMA journal_mode=DELETE").fetchall())

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.conn.close()

    def __enter__(self) -> "TileDb":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- transactions and error mapping -------------------------------------------------------

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except TileDbError:
            raise
        except sqlite3.Error as exc:
            if _busy(exc):
                raise TileDbError(f"{self.path}: still locked by another process after "
                                  f"{RETRY_DEADLINE_S:.0f} s ({what})") from None
            raise TileDbError(f"{self.path}: {what} failed: {_describe(exc)}") from None
        except OSError as exc:
            raise TileDbError(f"{self.path}: {what} failed: {_describe(exc)}") from None

    def transact(self, work: Callable[[sqlite3.Connection], T], what: str = "write") -> T:
        """Run work(conn) in one write transaction (BEGIN IMMEDIATE), retried whole while another
        process holds the write lock. work must be safe to run again after a rollback."""
        if self.readonly:
            raise TileDbError(f"{self.path}: opened read-only; cannot {what}")

        def attempt():
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                result = work(self.conn)
                self.conn.execute("COMMIT")
                return result
            except BaseException:
                if self.conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self.conn.execute("ROLLBACK")
                raise
        with self._errors(what):
            return _retrying(attempt)

    def query(self, sql: str, params: Iterable = (), what: str = "read") -> list[tuple]:
        with self._errors(what):
            return _retrying(lambda: self.conn.execute(sql, tuple(params)).fetchall())

    # ---- writing rows -------------------------------------------------------------------------

    def origin_for(self, source: str) -> str:
        """'' for computed sources (the same anywhere), this database's id for measurements."""
        return "" if is_computed(source) else self.db_id

    def put_hardware(self, row: HardwareRow) -> None:
        self.transact(lambda conn: insert_row(conn, "hardware", row))

    def put(self, table: str, row, *, replace: bool = False, also: Optional[Callable] = None) -> str:
        """Insert one row; returns 'inserted', 'exists' (same values), 'replaced' or 'conflict'
        (same key, other values, kept as it was). also(conn) runs in the same transaction."""
        def work(conn):
            outcome = store_row(conn, table, row, replace=replace)
            if also is not None:
                also(conn)
            return outcome
        return self.transact(work)

    # ---- reading rows -------------------------------------------------------------------------

    def rows(self, table: str, where: str = "", params: Iterable = ()) -> list:
        cls = ROW_CLASSES[table]
        cols = columns(cls)
        sql = f"SELECT {', '.join(cols)} FROM {table}" + (f" WHERE {where}" if where else "")
        return [row_from_tuple(cls, r) for r in self.query(sql, params)]

    def tiles_for(self, fingerprint: str, op_class: str, dtype: str, isa: str) -> list[TileRow]:
        return self.rows("tile", "fingerprint = ? AND op_class = ? AND dtype = ? AND isa = ?",
                         (fingerprint, op_class, dtype, isa))

    def best_tiles(self, fingerprint: str, op_class: str, dtype: str, isa: str) -> dict[str, TileRow]:
        """params -> the row that answers for it (see best_of)."""
        groups: dict[str, list[TileRow]] = {}
        for row in self.tiles_for(fingerprint, op_class, dtype, isa):
            groups.setdefault(row.params, []).append(row)
        out = {}
        for params, rows in groups.items():
            best = best_of(rows)
            if best is not None:
                out[params] = best
        return out

    def done_keys(self, table: str, where: str, params: Iterable) -> set[tuple]:
        cls = ROW_CLASSES[table]
        sql = f"SELECT {', '.join(cls.KEY)} FROM {table} WHERE {where}"
        return set(self.query(sql, params))

    def labels(self) -> dict[str, list[str]]:
        """fingerprint -> the hardware labels recorded for it."""
        out: dict[str, list[str]] = {}
        for fp, lab in self.query("SELECT fingerprint, label FROM hardware ORDER BY label"):
            out.setdefault(fp, []).append(lab)
        return out

    def fingerprints_for_label(self, label: str) -> list[str]:
        return [r[0] for r in self.query("SELECT fingerprint FROM hardware WHERE label = ?", (label,))]

    def count(self, table: str) -> int:
        return int(self.query(f"SELECT COUNT(*) FROM {table}")[0][0])

    # ---- build claims -------------------------------------------------------------------------

    def claim(self, task: str, host: str, pid: int, stale_after_s: float, now: float,
              done: Callable[[sqlite3.Connection], bool]) -> str:
        """Take a task for this process: 'claimed', 'done' (done(conn) says its row exists) or
        'held' (a live process holds it). The check and the claim are one transaction, so a row
        committed by another builder a moment earlier is seen. A claim whose process is gone
        (same host) or that is older than stale_after_s is taken over."""
        def work(conn):
            if done(conn):
                return "done"
            row = conn.execute("SELECT host, pid, claimed_at FROM claim WHERE task = ?", (task,)).fetchone()
            if row is not None and (row[0], row[1]) != (host, pid):
                held_host, held_pid, at = row
                if now - at < stale_after_s and (held_host != host or _pid_alive(held_pid)):
                    return "held"
            conn.execute("INSERT OR REPLACE INTO claim (task, host, pid, claimed_at) VALUES (?, ?, ?, ?)",
                         (task, host, pid, now))
            return "claimed"
        return self.transact(work, "claim a build task")

    def release_claims(self, host: str, pid: int) -> None:
        self.transact(lambda conn: conn.execute("DELETE FROM claim WHERE host = ? AND pid = ?", (host, pid)),
                      "release build claims")


ROW_CLASSES = {"hardware": HardwareRow, "tile": TileRow, "operator": OperatorRow, "calibration": CalibrationRow}


def row_from_tuple(cls, values: tuple):
    d = dict(zip(columns(cls), values))
    if "emulated" in d:
        d["emulated"] = bool(d["emulated"])
    return cls(**d)


def _to_sql(row) -> dict:
    d = as_dict(row)
    if "emulated" in d:
        d["emulated"] = int(d["emulated"])
    return d


def insert_row(conn: sqlite3.Connection, table: str, row) -> None:
    d = _to_sql(row)
    cols = list(d)
    conn.execute(f"INSERT OR IGNORE INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                 [d[c] for c in cols])


def store_row(conn: sqlite3.Connection, table: str, row, replace: bool = False) -> str:
    """Insert row into table inside the caller's transaction (see TileDb.put for the outcomes)."""
    cls = type(row)
    key_cols = cls.KEY
    cols = columns(cls)
    where = " AND ".join(f"{k} = ?" for k in key_cols)
    existing = conn.execute(f"SELECT {', '.join(cols)} FROM {table} WHERE {where}", key_of(row)).fetchone()
    if existing is None:
        insert_row(conn, table, row)
        return "inserted"
    old = row_from_tuple(cls, existing)
    if old == row:
        return "exists"
    if not replace:
        return "conflict"
    d = _to_sql(row)
    sets = ", ".join(f"{c} = ?" for c in cols if c not in key_cols)
    conn.execute(f"UPDATE {table} SET {sets} WHERE {where}",
                 [d[c] for c in cols if c not in key_cols] + list(key_of(row)))
    return "replaced"


def best_of(rows: list[TileRow]) -> Optional[TileRow]:
    """The row that answers for one tile: the highest-ranked source kind; among several rows of
    that rank (e.g. host rows merged from two machines) the median by cycles per k step (the
    lower middle one, so an actual row with its provenance answers). Emulated rows never answer."""
    usable = [r for r in rows if r.rank >= 0 and (r.cycles_per_k or r.seconds)]
    if not usable:
        return None
    top = max(r.rank for r in usable)
    best = sorted((r for r in usable if r.rank == top),
                  key=lambda r: (r.cycles_per_k or 0.0, r.seconds or 0.0, r.source, r.origin))
    return best[(len(best) - 1) // 2]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _retrying(fn: Callable[[], T], deadline_s: float = RETRY_DEADLINE_S) -> T:
    """fn(), retried with jittered back-off while sqlite reports the database busy or locked."""
    deadline = time.monotonic() + deadline_s
    delay = 0.02
    while True:
        try:
            return fn()
        except sqlite3.OperationalError as exc:
            if not _busy(exc) or time.monotonic() > deadline:
                raise
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 1.0)


def _create_atomically(path: Path) -> None:
    """Build an empty, current-schema database in a temporary file and link it into place."""
    from .._version import __version__
    parent = path.parent
    tmp = parent / f".{path.name}.{uuid.uuid4().hex[:12]}.tmp"
    try:
        parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # mode as the umask allows
    except OSError as exc:
        raise TileDbError(f"{path}: cannot create the database here ({_describe(exc)})") from None
    try:
        conn = sqlite3.connect(str(tmp), isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            migrate(conn)
            conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)",
                             [("format", FORMAT_NAME), ("db_id", uuid.uuid4().hex[:16]),
                              ("created_by", f"xfc {__version__}")])
            conn.execute("COMMIT")
        finally:
            conn.close()
        try:
            os.link(tmp, path)          # never replaces: a database created meanwhile wins
        except FileExistsError:
            pass
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EMLINK):
                raise
            if not path.exists():       # file systems without hard links
                os.rename(tmp, path)
    except sqlite3.Error as exc:
        raise TileDbError(f"{path}: cannot create the database ({_describe(exc)})") from None
    except OSError as exc:
        raise TileDbError(f"{path}: cannot create the database ({_describe(exc)})") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
