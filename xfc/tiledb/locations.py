"""Where tile databases live. Pure: the environment is passed in by the caller (the CLI).

  shipped   <repository>/tile_db/<description name>.sqlite   built by `make tiledb` (computed rows only)
  per-user  $XFC_CACHE_DIR/tile-db.sqlite, else $XDG_CACHE_HOME/xfc/tile-db.sqlite,
            else ~/.cache/xfc/tile-db.sqlite                    host measurements, probe results

`--tile-db auto` (see resolve) picks the shipped file for shipped, unedited hardware and the
per-user database for `--hw host` and user descriptions.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Optional

from ..errors import OperatorError
from ..hardware.load import SHIPPED_ROOT
from ..hardware.model import HardwareDescription
from ..paths import TILE_DB_DIR
from ..settings import cache_dir

SHIPPED_DB_ROOT = TILE_DB_DIR
USER_DB_NAME = "tile-db.sqlite"


def user_cache_dir(environ: Mapping[str, str]) -> Path:
    return cache_dir(environ)


def user_db_path(environ: Mapping[str, str]) -> Path:
    return user_cache_dir(environ) / USER_DB_NAME


def shipped_db_path(name: str) -> Path:
    return SHIPPED_DB_ROOT / f"{name}.sqlite"


def is_shipped_location(path: Path) -> bool:
    """True for paths inside the repository's tile_db/ (host measurements never go there)."""
    try:
        Path(path).resolve().relative_to(SHIPPED_DB_ROOT.resolve())
        return True
    except ValueError:
        return False


def is_shipped_hardware(hw: HardwareDescription) -> bool:
    if hw.kind == "host" or not hw.source_path:
        return False
    path = Path(hw.source_path)
    try:
        path.resolve().relative_to(SHIPPED_ROOT.resolve())
        return True
    except (ValueError, OSError):
        return False


SQLITE_MAGIC = b"SQLite format 3\x00"


def _looks_like_sqlite(path: Path) -> bool:
    """An empty file or one that starts with SQLite's header (an unreadable one is left to the
    evaluator, which says why)."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError:
        return True
    return head in (b"", SQLITE_MAGIC)


def resolve(choice: str, hw: HardwareDescription, environ: Mapping[str, str]) -> Optional[Path]:
    """The database a `--tile-db PATH|auto|off` choice means for hw (None: off).

    auto: the shipped database of this description when it is shipped and its file exists,
    else the per-user database. A shipped description that was edited keeps its name but gets a
    new fingerprint, so its shipped rows stop matching (the evaluator says so). An explicit PATH
    that does not exist, is a directory or is not an SQLite file at all is an OperatorError (exit 2):
    the user named it, so a typo is bad input. A locked, older- or newer-schema or foreign database
    is the evaluator's warning.
    """
    if choice == "off":
        return None
    if choice != "auto":
        path = Path(choice)
        if not path.exists():   # an explicit path is a request: missing is bad input, not a warning
            raise OperatorError(f"--tile-db {choice}: no such file (give an existing tile database, or auto / off)")
        if path.is_dir():
            raise OperatorError(f"--tile-db {choice}: a directory, not a tile database file (or auto / off)")
        if not _looks_like_sqlite(path):
            raise OperatorError(f"--tile-db {choice}: not an SQLite file, so not a tile database "
                                f"(xfc tiledb build writes one; or auto / off)")
        return path
    if is_shipped_hardware(hw):
        shipped = shipped_db_path(Path(hw.source_path).stem)
        if shipped.exists():
            return shipped
    return user_db_path(environ)
