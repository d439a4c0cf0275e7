"""Published measurements (tile_db/published.yaml) next to xfc's predictions, and the one fit they
allow: a GPU's ALU efficiency (the share of its described FLOP rate it really issues) from a
published FMA-peak micro-benchmark.

A fitted efficiency is applied to every GPU of the same family and generation prefix only as a
labelled what-if in the benchmark table (benchmarks/gpu_published.py); synthesis keeps the
description's figures unless it is given an efficiency. With one figure per GPU, a prediction for
the GPU the figure came from is a fit, not a validation, and the table says so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml

from ..errors import XfcError
from ..paths import TILE_DB_DIR

PUBLISHED_PATH = TILE_DB_DIR / "published.yaml"
KINDS = ("fma_peak", "sgemm")


@dataclass(frozen=True)
class PublishedFigure:
    id: str
    hardware: str
    kind: str
    dtype: str
    gflops: float
    comparable: bool
    uncertain: bool
    source: str
    why: str = ""
    notes: str = ""
    m: int = 0
    n: int = 0
    k: int = 0

    @property
    def source_tag(self) -> str:
        """The tile-database source kind for this figure."""
        return f"published:{self.id}"


def _fail(path: Path, where: str, message: str) -> XfcError:
    return XfcError(f"{path}: {where}: {message}")


def load_published(path: Path = PUBLISHED_PATH) -> list[PublishedFigure]:
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise XfcError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise XfcError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("figures"), list):
        raise XfcError(f"{path}: expected a mapping with a 'figures' list")
    out, seen = [], set()
    for i, entry in enumerate(doc["figures"]):
        where = f"figures[{i}]"
        if not isinstance(entry, dict):
            raise _fail(path, where, "expected a mapping")
        known = set(PublishedFigure.__dataclass_fields__)
        extra = sorted(set(entry) - known)
        if extra:
            raise _fail(path, where, f"unknown field(s) {', '.join(extra)}")
        for field in ("id", "hardware", "kind", "dtype", "gflops", "comparable", "uncertain", "source"):
            if field not in entry:
                raise _fail(path, where, f"missing field '{field}'")
        if entry["kind"] not in KINDS:
            raise _fail(path, f"{where}.kind", f"{entry['kind']!r} (expected one of: {', '.join(KINDS)})")
        gflops = entry["gflops"]
        if isinstance(gflops, bool) or not isinstance(gflops, (int, float)) or not (0 < gflops < 1e6) \
                or math.isnan(gflops):
            raise _fail(path, f"{where}.gflops", f"{gflops!r} (expected a positive number)")
        if entry["kind"] == "sgemm" and not all(isinstance(entry.get(d), int) and entry[d] > 0 for d in "mnk"):
            raise _fail(path, where, "an sgemm figure needs positive integers m, n and k")
        if not entry["comparable"] and not entry.get("why"):
            raise _fail(path, where, "a figure marked comparable: false must say why")
        if entry["id"] in seen:
            raise _fail(path, f"{where}.id", f"duplicate id {entry['id']!r}")
        seen.add(entry["id"])
        out.append(PublishedFigure(**{**entry, "gflops": float(gflops)}))
    return out


def family_key(gpu_name: str) -> str:
    """GPUs that share an ALU design well enough to share a fitted efficiency: 'adreno-6', 'mali-g7'."""
    head, _, number = gpu_name.partition("-")
    return f"{head}-{number[:1]}" if head == "adreno" else f"{head}-{number[:2]}"


def alu_efficiencies(figures: list[PublishedFigure], described_peak_gflops) -> dict[str, tuple[float, str]]:
    """{gpu name: (efficiency, figure id)} from comparable FMA-peak figures: published / described peak."""
    out = {}
    for f in figures:
        if f.kind == "fma_peak" and f.comparable:
            out[f.hardware] = (f.gflops / described_peak_gflops(f.hardware), f.id)
    return out


def efficiency_for(gpu_name: str, fitted: dict[str, tuple[float, str]]) -> Optional[tuple[float, str, str]]:
    """(efficiency, figure id, how) for gpu_name: its own fit, else one from its family, else None."""
    if gpu_name in fitted:
        eff, fid = fitted[gpu_name]
        return eff, fid, "fitted on this GPU's own figure (a fit, not a prediction)"
    same = sorted((name, v) for name, v in fitted.items() if family_key(name) == family_key(gpu_name))
    if same:
        name, (eff, fid) = same[0]
        return eff, fid, f"carried over from {name} (same family): a prediction"
    return None
