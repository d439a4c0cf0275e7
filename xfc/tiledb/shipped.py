"""The shipped databases under tile_db/: one per shipped SoC and CPU core, static rows only.

    python -m xfc.tiledb.shipped [--out DIR] [NAME ...]      (what `make tiledb` runs)

For every description in hardware_descriptions/soc and hardware_descriptions/cpu (aliases are
the same SoCs under another name and are skipped) it builds <name>.sqlite from scratch with the
static evaluator in a temporary file, compacts it into a single self-contained file (rollback
journal, so read-only installs can open it), moves it into place and writes the deterministic
export <name>.jsonl beside it. Timestamps come from SOURCE_DATE_EPOCH when it is set, so the
same inputs give byte-identical exports. Measured rows never go here: this path has no
measuring evaluator, and `xfc tiledb build` refuses host measurements for tile_db/.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

from ..errors import XfcError
from ..hardware.load import SHIPPED_ROOT, validate_file
from .build import plan_tasks, register_hardware, run_build
from .evaluators import StaticDbEvaluator
from .exchange import write_export
from .locations import SHIPPED_DB_ROOT
from .store import TileDb, TileDbError, check_header, timestamps


def shipped_descriptions() -> list[Path]:
    return sorted((SHIPPED_ROOT / "soc").glob("*.yaml")) + sorted((SHIPPED_ROOT / "cpu").glob("*.yaml"))


def build_one(description: Path, out_dir: Path, created_at: Callable[[], str]) -> tuple[Path, Path, int]:
    """(database, export, tile rows) for one description, rebuilt from scratch."""
    hw = validate_file(description)
    target = out_dir / f"{description.stem}.sqlite"
    if target.exists():
        check_header(target)             # replace only xfc's own file
    tmp = out_dir / f".{description.stem}.building.sqlite"
    for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
        with contextlib.suppress(FileNotFoundError):
            if leftover.exists():
                if leftover == tmp:
                    check_header(leftover)
                leftover.unlink()
    evaluator = StaticDbEvaluator()
    with TileDb.open(tmp) as db:
        register_hardware(db, hw)
        tasks = plan_tasks(db, hw, [evaluator], ["gemm", "operators"])
        run_build(db, tasks, progress=None, created_at=created_at)
        db.compact(journal="delete")
        rows = db.count("tile")
    os.replace(tmp, target)
    with TileDb.open(target, readonly=True) as db:
        write_export(db, out_dir / f"{description.stem}.jsonl")
    return target, out_dir / f"{description.stem}.jsonl", rows


def build_all(out_dir: Path, created_at: Callable[[], str], names: Sequence[str] = (),
              log=sys.stderr) -> list[tuple[str, int]]:
    files = shipped_descriptions()
    if names:
        known = {f.stem: f for f in files}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise XfcError(f"not a shipped SoC or core: {', '.join(unknown)}")
        files = [known[n] for n in names]
    out_dir.mkdir(parents=True, exist_ok=True)
    done = []
    for i, f in enumerate(files, 1):
        _, _, rows = build_one(f, out_dir, created_at)
        if log is not None:
            print(f"[{i}/{len(files)}] {out_dir / (f.stem + '.sqlite')}: {rows} static tile rows", file=log)
        done.append((f.stem, rows))
    return done


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m xfc.tiledb.shipped", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(SHIPPED_DB_ROOT), help="output directory (default: tile_db/)")
    ap.add_argument("names", nargs="*", help="only these descriptions (file stems)")
    args = ap.parse_args(argv)
    try:
        build_all(Path(args.out), timestamps(os.environ), args.names)
    except (XfcError, TileDbError) as exc:
        print(f"xfc: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
