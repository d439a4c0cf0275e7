"""pyproject.toml ships every package and every data folder xfc.paths resolves (a wheel carries
hardware_descriptions/, templates/ and tile_db/ as xfc/data/<folder>)."""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
DATA = {"xfc.data.hardware_descriptions": "hardware_descriptions", "xfc.data.templates": "templates",
        "xfc.data.tile_db": "tile_db"}


def test_every_python_package_is_listed():
    found = {".".join(p.parent.relative_to(ROOT).parts) for top in ("xfc", "android_runner")
             for p in (ROOT / top).rglob("__init__.py")}
    listed = {p for p in SETUPTOOLS["packages"] if not p.startswith("xfc.data.")}
    assert listed == found


def test_every_data_folder_and_file_is_shipped():
    assert SETUPTOOLS["package-dir"] == DATA
    shipped = set()
    for package in SETUPTOOLS["packages"]:
        top = next((t for t in DATA if package == t or package.startswith(t + ".")), None)
        if top is None:
            continue
        folder = ROOT / DATA[top] / Path(*package[len(top):].split(".")[1:])
        assert folder.is_dir(), package
        for pattern in SETUPTOOLS["package-data"].get(package, []):
            shipped |= {f for f in folder.glob(pattern) if f.is_file()}
    # tile_db/<name>.sqlite are built on demand by `make tiledb` from the shipped .jsonl exports
    # (tile_db/README.md) and are not part of the source tree
    wanted = {f for name in DATA.values() for f in (ROOT / name).rglob("*")
              if f.is_file() and not f.name.startswith(".")
              and not (f.parent.name == "tile_db" and ".sqlite" in f.name)}
    assert sorted(map(str, wanted - shipped)) == []


def test_android_runner_ships_its_stand_in_harness():
    """The installed android_runner builds its stand-in harness from its own package, not tests/."""
    assert "*.c" in SETUPTOOLS["package-data"]["android_runner"]
    assert (ROOT / "android_runner" / "standin_harness.c").is_file()
