"""The Python API behind `import xfc`: the same machine and the same tile database as the command line.

`xfc synth --hw host` describes this machine as the host probe measures it (cached per machine in
the per-user tile database; XFC_HOST_PROBE=off keeps the assumptions) and plans with the tile
database (`--tile-db auto` by default). A Python user gets the same: load_hardware goes through the
probe, and synthesize / compile take `tile_db` ('auto', a path, or 'off') as `--tile-db` does, so
one request gives one plan whichever way it is made. Like cli/, this module is a composition root:
it reaches the tile database (xfc.tiledb), which the library below never imports. Warnings (a
missing database, a probe that could not run) are Python warnings, not printed lines.
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Iterator, Optional

from . import settings

TILE_DB_DEFAULT = "auto"


def _warn(message: str) -> None:
    warnings.warn(f"xfc: {message}", stacklevel=3)


def load_hardware(name: str, *, remeasure: bool = False):
    """A hardware description by name, file or 'host' (the probed host, as `xfc hw show host`)."""
    from .tiledb.hostdesc import load_hardware as load
    return load(name, settings.environment(), remeasure=remeasure, warn=_warn)


@contextmanager
def tile_db_inputs(tile_db: str, hw, cluster: Optional[str]) -> Iterator[tuple]:
    """(evaluator, constants, report entry) for tile_db, closed afterwards (xfc.tiledb.evaluators)."""
    from .tiledb.evaluators import synthesis_inputs
    evaluator, constants, entry = synthesis_inputs(tile_db, hw, cluster, settings.environment(), _warn)
    try:
        yield evaluator, constants, entry
    finally:
        if evaluator is not None:
            evaluator.close()


def synthesize(spec, hw, *, tile_db: str = TILE_DB_DEFAULT, cluster: Optional[str] = None,
               threads: Optional[int] = None, lowering: str = "auto"):
    """A CPU kernel plan for spec on hw (xfc.cpu.explain.CpuSynthesis: .plan, .explain(), .report()),
    planned as `xfc synth` plans it."""
    from .pipeline import synthesize_timed
    with tile_db_inputs(tile_db, hw, cluster) as (evaluator, constants, _):
        result, _seconds = synthesize_timed(spec, hw, cluster, threads, evaluator, constants, lowering)
    return result


def compile(spec, hw, *, tile_db: str = TILE_DB_DEFAULT, cluster: Optional[str] = None,  # noqa: A001
            threads: Optional[int] = None, lowering: str = "auto", out_dir=None):
    """Synthesize (as synthesize does), render and build -> xfc.Kernel (xfc.pipeline.compile)."""
    from .pipeline import compile as compile_kernel
    with tile_db_inputs(tile_db, hw, cluster) as (evaluator, constants, _):
        return compile_kernel(spec, hw, cluster=cluster, threads=threads, evaluator=evaluator, constants=constants,
                              lowering=lowering, out_dir=out_dir)


def compile_model(model, hw="host", *, threads: Optional[int] = None, input_shapes: Optional[dict] = None,
                  cluster: Optional[str] = None, out_dir=None):
    """A whole ONNX network as a callable (xfc.runners.hostnet.HostNetwork): `net(x) -> y`, one C call per
    inference (xfc/model/runtime/api.py). hw: 'host' (probed, as `xfc hw show host`) or an x86-64
    description; input_shapes: {'input': (1, 3, 224, 224)} for dynamic inputs; threads: the kernels are
    synthesized for it and the network runs with it (default: the cluster's cores)."""
    from .model.runtime.api import compile_network
    if isinstance(hw, str):
        hw = load_hardware(hw)
    shapes = {k: tuple(v) for k, v in (input_shapes or {}).items()}
    return compile_network(model, hw, threads=threads, input_shapes=shapes, cluster=cluster, out_dir=out_dir)

