"""The tile database schema as numbered migrations, and the marks that make a file xfc's own.

A new database is made by running every migration from 0, an older one by running the missing
ones: the same code path, so migration is exercised every time a database is created. The
version lives in the SQLite header (`PRAGMA user_version`, changed atomically with the DDL) and
the file is marked with `PRAGMA application_id`, so a foreign SQLite file is recognised from its
first 100 bytes without running any SQL on it.
"""
from __future__ import annotations

import sqlite3

APPLICATION_ID = 0x58464354          # 'XFCT'
FORMAT_NAME = "xfc-tile-db"

# Each step is a list of statements; step N moves a database from version N-1 to N.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 1: the file's identity, hardware facts and micro-tile results.
    (
        """CREATE TABLE meta (
               key   TEXT PRIMARY KEY,
               value TEXT NOT NULL
           ) WITHOUT ROWID""",
        """CREATE TABLE hardware (
               fingerprint TEXT NOT NULL,
               label       TEXT NOT NULL,      -- e.g. 'snapdragon-865:big' (description:cluster role)
               facts       TEXT NOT NULL,      -- the canonical JSON the fingerprint hashes
               PRIMARY KEY (fingerprint, label)
           ) WITHOUT ROWID""",
        """CREATE TABLE tile (
               id           INTEGER PRIMARY KEY,
               fingerprint  TEXT NOT NULL,
               op_class     TEXT NOT NULL,     -- 'gemm_ukernel', 'depthwise_tile', 'gpu_tile'
               dtype        TEXT NOT NULL,
               isa          TEXT NOT NULL,
               params       TEXT NOT NULL,     -- tile parameters, canonical JSON
               source       TEXT NOT NULL,     -- 'static', 'llvm-mca:<model>', 'host', 'adb:<serial>', 'published:<ref>'
               origin       TEXT NOT NULL,     -- '' for computed rows; the measuring database's id otherwise
               cycles_per_k REAL,
               seconds      REAL,              -- per k step (micro-kernels) or per call
               gflops       REAL,
               efficiency   REAL,              -- fraction of the description's FMA peak
               bound        TEXT NOT NULL,
               repeats      INTEGER NOT NULL,
               spread       REAL,              -- (max - min) / median of the repeats
               conditions   TEXT NOT NULL,     -- canonical JSON: governor, clocks, temperatures, throttling
               emulated     INTEGER NOT NULL,  -- 1: an emulator's timing, never used to rank tiles
               compiler     TEXT NOT NULL,
               xfc_version  TEXT NOT NULL,
               created_at   TEXT NOT NULL,
               UNIQUE (fingerprint, op_class, dtype, isa, params, source, origin)
           )""",
        "CREATE INDEX tile_lookup ON tile (fingerprint, op_class, dtype, isa)",
    ),
    # 2: operator-level plans and calibrated / measured facts (the host probe writes here too).
    (
        """CREATE TABLE operator (
               id           INTEGER PRIMARY KEY,
               fingerprint  TEXT NOT NULL,
               op_key       TEXT NOT NULL,     -- OperatorSpec.key()
               cluster      TEXT NOT NULL,
               threads      INTEGER NOT NULL,
               plan         TEXT NOT NULL,     -- canonical JSON of the chosen schedule
               predicted_s  REAL,
               measured_s   REAL,
               gflops       REAL,
               source       TEXT NOT NULL,
               origin       TEXT NOT NULL,
               repeats      INTEGER NOT NULL,
               spread       REAL,
               conditions   TEXT NOT NULL,
               compiler     TEXT NOT NULL,
               xfc_version  TEXT NOT NULL,
               created_at   TEXT NOT NULL,
               UNIQUE (fingerprint, op_key, cluster, threads, source, origin)
           )""",
        """CREATE TABLE calibration (
               subject      TEXT NOT NULL,     -- a hardware fingerprint, or 'cpu:<key>' for host probe facts
               name         TEXT NOT NULL,     -- e.g. 'fma_per_cycle@256', 'clock_ghz'
               value        REAL NOT NULL,
               unit         TEXT NOT NULL,
               method       TEXT NOT NULL,
               source       TEXT NOT NULL,
               origin       TEXT NOT NULL,
               repeats      INTEGER NOT NULL,
               spread       REAL,
               conditions   TEXT NOT NULL,
               compiler     TEXT NOT NULL,
               xfc_version  TEXT NOT NULL,
               created_at   TEXT NOT NULL,
               PRIMARY KEY (subject, name, source, origin)
           ) WITHOUT ROWID""",
    ),
    # 3: build claims, so concurrent builders split the work and a killed one's task is retaken.
    (
        """CREATE TABLE claim (
               task       TEXT PRIMARY KEY,    -- hash of a task's key
               host       TEXT NOT NULL,
               pid        INTEGER NOT NULL,
               claimed_at REAL NOT NULL        -- unix seconds
           ) WITHOUT ROWID""",
    ),
)

SCHEMA_VERSION = len(MIGRATIONS)


def user_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def application_id(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA application_id").fetchone()[0])


def migrate(conn: sqlite3.Connection, target: int = SCHEMA_VERSION) -> tuple[int, int]:
    """Apply the missing migration steps up to target inside the caller's write transaction.

    Returns (version before, version after). The caller has checked that the file is not newer.
    """
    before = user_version(conn)
    for version in range(before + 1, target + 1):
        for statement in MIGRATIONS[version - 1]:
            conn.execute(statement)
    if target > before:
        # PRAGMA takes no parameters; target is an int from this module, never user text.
        conn.execute(f"PRAGMA user_version = {int(target)}")
    return before, max(before, target)
