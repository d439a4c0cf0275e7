"""The Python API behind `import xfc`: the same machine and the same tile database as the command line.

`xfc synth --hw host` describes this machine as the host probe measures it (cached per machine in
the per-user tile database; XFC_HOST_PROBE=off keeps the assumptions) and plans with the tile
database (`--tile-db auto` by default). A Python user gets the same: load_hardware goes through the
probe, and synthesize / compile take `tile_db` ('auto', a path, or 'off') as `--tile-db` does, so
one request gives one plan whichever way it is made. Like cli/, this module is a composition root:
it reaches the tile database (xfc.tiledb), which the library below never imports. Warnings (a
missing database, a probe that could not run) are Python warnings, not printed lines. Bad
arguments are OperatorError (xfc.errors) naming the parameter as a Python caller spells it
(`threads=`, `input_shapes['x']`, `out_dir`), never a command-line flag.
"""
from __future__ import annotations

import numbers
import re
import warnings
from contextlib import contextmanager
from typing import Iterator, Optional

from . import settings
from .errors import OperatorError

TILE_DB_DEFAULT = "auto"


def _warn(message: str) -> None:
    warnings.warn(f"xfc: {message}", stacklevel=3)


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _checked_threads(threads) -> Optional[int]:
    """threads= as the library below takes it (a plain int or None), or OperatorError."""
    if threads is None:
        return None
    if not _is_int(threads) or threads < 1:
        raise OperatorError(f"threads={threads!r}: must be a positive integer, or None for every core of the cluster")
    return int(threads)


def _check_threads_fit(threads: Optional[int], hw, cluster: Optional[str]) -> None:
    if threads is None:
        return
    chosen = hw.cluster(cluster)
    if threads > chosen.count:
        raise OperatorError(f"threads={threads}: more than the {chosen.count} cores of {hw.name}'s {chosen.role} "
                            f"cluster; pass at most {chosen.count}")


def _checked_input_shapes(input_shapes) -> dict[str, tuple[int, ...]]:
    """input_shapes= ({name: (1, 3, 224, 224)}) checked before the model is read, or OperatorError."""
    example = "e.g. {'input': (1, 3, 224, 224)}"
    if input_shapes is None:
        return {}
    if not isinstance(input_shapes, dict):
        raise OperatorError(f"input_shapes must be a dict of input name -> shape ({example}), "
                            f"got {type(input_shapes).__name__}")
    shapes = {}
    for name, dims in input_shapes.items():
        if name is not None and (not isinstance(name, str) or not name):   # None: the only dynamic input
            raise OperatorError(f"input_shapes: the key {name!r} is not an input name ({example}; None: the "
                                f"model's only dynamic input)")
        where = f"input_shapes[{name!r}]"
        if isinstance(dims, str):
            # The command line's 1x3x224x224: say which tuple was meant rather than guess.
            parts = re.split(r"[x,]", dims.strip().lower())
            meant = f"; write {tuple(int(p) for p in parts)}" if all(p.isdigit() for p in parts) else ""
            raise OperatorError(f"{where} is the string {dims!r}: a shape is a sequence of positive ints such as "
                                f"(1, 3, 224, 224), not a string{meant}")
        try:
            dims = tuple(dims)
        except TypeError:
            raise OperatorError(f"{where} is {dims!r}: a shape is a sequence of positive ints such as "
                                f"(1, 3, 224, 224)") from None
        if not dims or not all(_is_int(d) for d in dims):
            raise OperatorError(f"{where} is {dims!r}: a shape is a non-empty sequence of positive ints such as "
                                f"(1, 3, 224, 224)")
        if any(d < 1 for d in dims):
            raise OperatorError(f"{where} is {tuple(int(d) for d in dims)}: dimensions must be positive")
        shapes[name] = tuple(int(d) for d in dims)
    return shapes


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
    threads = _checked_threads(threads)
    _check_threads_fit(threads, hw, cluster)
    with tile_db_inputs(tile_db, hw, cluster) as (evaluator, constants, _):
        result, _seconds = synthesize_timed(spec, hw, cluster, threads, evaluator, constants, lowering)
    return result


def compile(spec, hw, *, tile_db: str = TILE_DB_DEFAULT, cluster: Optional[str] = None,  # noqa: A001
            threads: Optional[int] = None, lowering: str = "auto", out_dir=None, force: bool = False):
    """Synthesize (as synthesize does), render and build -> xfc.Kernel (xfc.pipeline.compile). out_dir:
    a new, empty or xfc-written directory; force=True writes beside files xfc did not write there
    (never replacing them), as `xfc synth --force` does."""
    from .pipeline import compile as compile_kernel
    threads = _checked_threads(threads)
    _check_threads_fit(threads, hw, cluster)
    with tile_db_inputs(tile_db, hw, cluster) as (evaluator, constants, _):
        return compile_kernel(spec, hw, cluster=cluster, threads=threads, evaluator=evaluator, constants=constants,
                              lowering=lowering, out_dir=out_dir, force=force)


def compile_model(model, hw="host", *, threads: Optional[int] = None, input_shapes: Optional[dict] = None,
                  cluster: Optional[str] = None, out_dir=None, force: bool = False):
    """A whole ONNX network (a file path, or an onnx.ModelProto, left unchanged) as a callable
    (xfc.runners.hostnet.HostNetwork): `net(x) -> y`, one C call per
    inference (xfc/model/runtime/api.py). hw: 'host' (probed, as `xfc hw show host`) or an x86-64
    description; input_shapes: {'input': (1, 3, 224, 224)} (a tuple of positive ints per input) for dynamic
    inputs; threads: the kernels are synthesized for it and the network runs with it (default: the
    cluster's cores); out_dir: keep the sources and library there (a new, empty or xfc-written
    directory; force=True writes beside files xfc did not write, never replacing them)."""
    from .model.runtime.api import compile_network
    shapes = _checked_input_shapes(input_shapes)
    threads = _checked_threads(threads)     # both before the host probe, which can take seconds
    # Not capped at the cluster's cores here: an int8 network's kernels take more threads than cores.
    if isinstance(hw, str):
        hw = load_hardware(hw)
    try:
        return compile_network(model, hw, threads=threads, input_shapes=shapes, cluster=cluster, out_dir=out_dir,
                               force=force)
    except OperatorError as exc:
        # the planner's thread check speaks the command line's words: here the parameter is threads=
        text = str(exc)
        if text.startswith("--threads "):
            raise OperatorError("threads=" + text[len("--threads "):]) from None
        raise

