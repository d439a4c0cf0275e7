"""The offline tile database: evaluated micro-tiles, operator plans and calibration facts per
hardware fingerprint, in one SQLite file (stdlib sqlite3, WAL, versioned schema, no pickle).

One concern per module:
  schema.py       DDL as numbered migrations, application_id, version checks
  store.py        opening (foreign/corrupt/newer files refused), records, queries, transactions
  fingerprint.py  the description facts that matter to a tile -> a stable hash
  locations.py    where databases live (shipped tile_db/, the per-user cache)
  exchange.py     deterministic JSON-lines export, import and merge (provenance kept)
  evaluators.py   static and host micro-kernel evaluators; TileDbEvaluator for synthesis
  plancache.py    warm synthesis: plans xfc synth recorded, answered by lookup
  hostcc.py       the host compiler and machine conditions (argument lists, timeouts)
  device.py       the adb device evaluator: aarch64 micro-kernels and operators timed on a phone
  probe.py        the host FMA/clock probe, cached in the per-user database
  build.py        resumable, concurrent-safe `tiledb build`
  cli.py          `xfc tiledb ...`

docs/tile-db.md describes the schema, keys, sources and their ranking.
"""
from .store import TileDbError

__all__ = ["TileDbError"]
