"""Where xfc's data lives: the one resolver for hardware_descriptions/, templates/ and tile_db/.

In a checkout (and an editable install) they are top-level folders beside the xfc package; a
wheel carries them inside the package as xfc/data/<folder> (see pyproject.toml). The first
location that exists wins; nothing else in xfc works out where the repository is.
"""
from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
IMPORT_ROOT = PACKAGE_DIR.parent      # the directory that holds the xfc package (for child PYTHONPATH)


def data_dir(name: str) -> Path:
    """The folder `name` of xfc's data: xfc/data/<name> in an installed wheel, else <checkout>/<name>."""
    installed = PACKAGE_DIR / "data" / name
    return installed if installed.is_dir() else IMPORT_ROOT / name


HARDWARE_DIR = data_dir("hardware_descriptions")   # the shipped hardware descriptions (and SCHEMA.md)
TEMPLATES_DIR = data_dir("templates")              # Jinja templates: cpu/, opencl/
TILE_DB_DIR = data_dir("tile_db")                  # shipped tile databases (JSON-lines exports)
