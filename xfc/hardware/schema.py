"""The schema of hardware description files: one table per kind, one checker per field.

check_file(path, raw) takes the mapping read from one YAML file and returns it cleaned (every
field of the right type and within its plausible range), or raises a one-line HardwareError
naming the file, the field path, the value and what the field accepts. Numeric fields are
checked against the plausible ranges of ranges.py; values that are each plausible but physically
impossible together are refused by the rules in rules.py. Reading the file (strict YAML) and
resolving references between files is load.py's job.
"""
from __future__ import annotations

import datetime
import re
import reprlib
from pathlib import Path
from typing import Any, Callable

from ..errors import HardwareError
from . import rules
from .model import CLUSTER_ROLES, CPU_FEATURES
from .ranges import PLAUSIBLE

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9.-]*$")


class LongInteger:
    """An integer literal too long for Python to convert (more than int_max_str_digits digits).

    The loader returns this marker instead of failing, so the field checker can name the field
    ("got an integer of 5000 digits"); no field accepts it."""

    def __init__(self, digits: int):
        self.digits = digits

    def __str__(self) -> str:
        return f"an integer of {self.digits} digits"

    __repr__ = __str__


def display(path: Path) -> str:
    """A path as messages show it: relative to the current directory when it is below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


class Ctx:
    def __init__(self, where: str):
        self.where = where

    def fail(self, path: str, message: str) -> HardwareError:
        return HardwareError(f"{self.where}: field '{path}': {message}")


Checker = Callable[[Ctx, str, Any], Any]

_SHORT = reprlib.Repr()
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict = 40, 40, 2, 4, 4
_SHORT.maxset = _SHORT.maxfrozenset = _SHORT.maxtuple = 4


def _shown(value) -> str:
    """Any value YAML can produce, as a short one-line text for an error message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if value.bit_length() > 133:   # more than 40 digits: no need to print them
            return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
        return str(value)
    if isinstance(value, float):
        if value != value:
            return ".nan"
        if value in (float("inf"), float("-inf")):
            return ".inf" if value > 0 else "-.inf"
        return repr(value)
    if isinstance(value, LongInteger):
        return str(value)
    if isinstance(value, (datetime.date, datetime.datetime)):   # YAML reads 2001-12-14 as a date
        return f"{type(value).__name__} {value.isoformat()}"
    kind = {"str": "string", "dict": "mapping"}.get(type(value).__name__, type(value).__name__)
    try:
        return f"{kind} {_SHORT.repr(value)}"
    except Exception:  # noqa: BLE001 - a value that cannot even be shown is still reported
        return kind


def _accepts(check: Checker) -> str:
    """What a checker accepts, for messages ('an integer from 8 to 64 registers (...)')."""
    return getattr(check, "accepts", "a valid value")


def _accepting(text: str):
    """Decorator: attach the description of what a checker accepts."""
    def mark(check):
        check.accepts = text
        return check
    return mark


def _reject(ctx: Ctx, path: str, check: Checker, value) -> HardwareError:
    return ctx.fail(path, f"must be {_accepts(check)}, got {_shown(value)}")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@_accepting("a non-empty string")
def _string(ctx, path, v):
    if not isinstance(v, str) or not v.strip():
        raise _reject(ctx, path, _string, v)
    return v


@_accepting("a string")
def _any_string(ctx, path, v):
    if not isinstance(v, str):
        raise _reject(ctx, path, _any_string, v)
    return v


MAX_NAME_CHARS = 100  # names are file names; far below any file system's limit


@_accepting(f"a name of lowercase letters, digits, '.' and '-' (at most {MAX_NAME_CHARS} characters)")
def _name(ctx, path, v):
    if not isinstance(v, str) or not NAME_RE.match(v) or len(v) > MAX_NAME_CHARS:
        raise _reject(ctx, path, _name, v)
    return v


@_accepting("true or false")
def _bool(ctx, path, v):
    if not isinstance(v, bool):
        raise _reject(ctx, path, _bool, v)
    return v


# Generic numeric checkers. Every numeric field of the shipped schema uses _plausible(key) with a
# range in ranges.PLAUSIBLE; give any new numeric field a range there too (the sweep in
# tests/test_hardware_fields.py feeds every field 10**30 and expects a refusal).

@_accepting("an integer > 0")
def _positive_int(ctx, path, v):
    if not _is_int(v) or v <= 0:
        raise _reject(ctx, path, _positive_int, v)
    return v


@_accepting("an integer >= 0")
def _nonneg_int(ctx, path, v):
    if not _is_int(v) or v < 0:
        raise _reject(ctx, path, _nonneg_int, v)
    return v


@_accepting("a finite number > 0")
def _positive_number(ctx, path, v):
    if not _is_number(v) or not 0 < v < float("inf"):   # NaN fails the comparison too
        raise _reject(ctx, path, _positive_number, v)
    return float(v)


def _plausible(key: str) -> Checker:
    """A numeric field checked against its plausible range in ranges.PLAUSIBLE."""
    rng = PLAUSIBLE[key]   # a KeyError here is a typo in this file, caught at import

    def inner(ctx, path, v):
        if not (_is_int(v) if rng.integer else _is_number(v)) or not rng.contains(v):
            raise _reject(ctx, path, inner, v)
        return v if rng.integer else float(v)
    inner.accepts = rng.accepts()
    inner.plausible_key = key
    return inner


def _optional(check: Checker) -> Checker:
    def inner(ctx, path, v):
        return None if v is None else check(ctx, path, v)
    inner.accepts = f"{_accepts(check)} or null"
    inner.item = check
    return inner


def _one_of(*choices) -> Checker:
    def inner(ctx, path, v):
        # type first: an unhashable or oddly-equal value (1 == True) is never a choice
        if not any(type(v) is type(c) and v == c for c in choices):
            raise _reject(ctx, path, inner, v)
        return v
    inner.accepts = "one of " + ", ".join(str(c) for c in choices)
    return inner


def _list_of(check: Checker, non_empty: bool = False) -> Checker:
    def inner(ctx, path, v):
        if not isinstance(v, list) or (non_empty and not v):
            raise _reject(ctx, path, inner, v)
        return tuple(check(ctx, f"{path}[{i}]", item) for i, item in enumerate(v))
    inner.accepts = f"a {'non-empty ' if non_empty else ''}list of {_accepts(check)}"
    inner.item = check
    return inner


def _int_below(limit: int) -> Checker:
    """MIDR implementer / part numbers: 1 .. limit-1 (0 is reserved, never a real implementer or part)."""
    def inner(ctx, path, v):
        if not _is_int(v) or not 0 < v < limit:
            raise ctx.fail(path, f"must be an integer from 0x1 to {limit - 1:#x}, got {_shown(v)}")
        return v
    return inner


@_accepting("a power of two")
def _power_of_two(ctx, path, v):
    if not _is_int(v) or v <= 0 or v & (v - 1):
        raise _reject(ctx, path, _power_of_two, v)
    return v


def _key_text(key) -> str:
    if isinstance(key, str):
        return key if len(key) <= 40 else key[:37] + "..."
    return _shown(key)


def _mapping(schema: dict[str, tuple[bool, Checker]]) -> Checker:
    """schema: field -> (required, checker). Unknown keys are errors."""
    def inner(ctx, path, v):
        if not isinstance(v, dict):
            raise _reject(ctx, path, inner, v)
        out = {}
        for key in v:
            if not isinstance(key, str) or key not in schema:
                sub = f"{path}.{_key_text(key)}" if path else _key_text(key)
                raise ctx.fail(sub, f"unknown key (allowed here: {', '.join(schema)})")
        for key, (required, check) in schema.items():
            sub = f"{path}.{key}" if path else key
            if key not in v:
                if required:
                    raise HardwareError(f"{ctx.where}: missing required field '{sub}' (must be {_accepts(check)})")
                out[key] = None
                continue
            out[key] = check(ctx, sub, v[key])
        return out
    inner.accepts = f"a mapping with the keys {', '.join(schema)}"
    inner.schema = schema
    return inner


REQ, OPT = True, False

def _cache_schema(level: str) -> dict[str, tuple[bool, Checker]]:
    return {"size_kib": (REQ, _plausible(f"cpu_core.{level}.size_kib")),
            "line_bytes": (REQ, _plausible(f"cpu_core.{level}.line_bytes")),
            "ways": (REQ, _plausible(f"cpu_core.{level}.ways"))}


_COMMON = {
    "kind": (REQ, _string),
    "name": (REQ, _name),
    "sources": (REQ, _list_of(_string, non_empty=True)),
    "uncertain": (OPT, _list_of(_string)),
    "notes": (OPT, _any_string),
}

# /proc/cpuinfo "CPU implementer" (8 bits) and "CPU part" (12 bits), written 0x41 / 0xd0d.
_CPUINFO_ID = {"implementer": (REQ, _int_below(0x100)), "part": (REQ, _int_below(0x1000))}

SCHEMAS: dict[str, dict[str, tuple[bool, Checker]]] = {
    "cpu_core": {
        **_COMMON,
        "vendor": (REQ, _string),
        "isa": (REQ, _one_of("armv8.0-a", "armv8.2-a", "armv9.0-a", "x86-64")),
        "features": (REQ, _list_of(_one_of(*CPU_FEATURES))),
        "gcc_march": (REQ, _string),
        "qemu_cpu": (REQ, _any_string),
        "pipeline": (REQ, _one_of("in_order", "out_of_order")),
        "decode_width": (REQ, _plausible("cpu_core.decode_width")),
        "vector_bits": (REQ, _plausible("cpu_core.vector_bits")),
        "vector_registers": (REQ, _plausible("cpu_core.vector_registers")),
        "fma_per_cycle": (REQ, _plausible("cpu_core.fma_per_cycle")),
        "fp16_fma_per_cycle": (OPT, _plausible("cpu_core.fp16_fma_per_cycle")),
        "fma_latency_cycles": (REQ, _plausible("cpu_core.fma_latency_cycles")),
        "load_rules": (REQ, _mapping({
            "vector_loads_per_cycle": (REQ, _plausible("cpu_core.load_rules.vector_loads_per_cycle")),
            "ld128_dual_issues_with_fma": (REQ, _bool),
            "ld128_blocking_cycles": (REQ, _plausible("cpu_core.load_rules.ld128_blocking_cycles")),
            "ld64_dual_issues_with_fma": (REQ, _bool),
        })),
        "l1d": (REQ, _mapping(_cache_schema("l1d"))),
        "l2": (REQ, _mapping({**_cache_schema("l2"),
                              "shared_by_cores": (REQ, _plausible("cpu_core.l2.shared_by_cores"))})),
        "typical_max_clock_ghz": (REQ, _plausible("cpu_core.typical_max_clock_ghz")),
        "cpuinfo": (OPT, _mapping(_CPUINFO_ID)),
        "sdot_per_cycle": (OPT, _plausible("cpu_core.sdot_per_cycle")),
        "smmla_per_cycle": (OPT, _plausible("cpu_core.smmla_per_cycle")),
    },
    "gpu": {
        **_COMMON,
        "vendor": (REQ, _one_of("arm", "qualcomm")),
        "family": (REQ, _one_of("mali", "adreno")),
        "architecture": (REQ, _string),
        "compute_unit_name": (REQ, _string),
        "compute_units": (REQ, _plausible("gpu.compute_units")),
        "max_clock_mhz": (REQ, _plausible("gpu.max_clock_mhz")),
        "warp_width": (REQ, _plausible("gpu.warp_width")),
        "half_warp_width": (REQ, _optional(_plausible("gpu.half_warp_width"))),
        "fp32_flop_per_clock_per_cu": (REQ, _plausible("gpu.fp32_flop_per_clock_per_cu")),
        "fp16_flop_per_clock_per_cu": (REQ, _optional(_plausible("gpu.fp16_flop_per_clock_per_cu"))),
        "registers_per_thread_full_occupancy": (REQ, _plausible("gpu.registers_per_thread_full_occupancy")),
        "register_file_bytes_per_cu": (REQ, _optional(_plausible("gpu.register_file_bytes_per_cu"))),
        "max_waves_per_cu": (REQ, _optional(_plausible("gpu.max_waves_per_cu"))),
        "local_memory": (REQ, _mapping({"size_kib": (REQ, _plausible("gpu.local_memory.size_kib")),
                                     "on_chip": (REQ, _bool)})),
        "max_work_group_size": (REQ, _plausible("gpu.max_work_group_size")),
        "preferred_work_group_size": (REQ, _plausible("gpu.preferred_work_group_size")),
        "l1_kib_per_cu": (REQ, _plausible("gpu.l1_kib_per_cu")),
        "l2_kib": (REQ, _plausible("gpu.l2_kib")),
        "opencl_version": (REQ, _string),
        "extensions": (REQ, _list_of(_string)),
        "coalescing_threads": (REQ, _plausible("gpu.coalescing_threads")),
        "image_support": (REQ, _bool),
    },
    "soc": {
        **_COMMON,
        "vendor": (REQ, _string),
        "marketing_name": (REQ, _string),
        "clusters": (REQ, _list_of(_mapping({
            "role": (REQ, _one_of(*CLUSTER_ROLES)),
            "core": (REQ, _name),
            "count": (REQ, _plausible("soc.clusters[].count")),
            "max_clock_ghz": (REQ, _plausible("soc.clusters[].max_clock_ghz")),
            "cpu_ids": (REQ, _list_of(_plausible("soc.clusters[].cpu_ids[]"), non_empty=True)),
            "l2_kib": (OPT, _plausible("soc.clusters[].l2_kib")),
            "cpuinfo": (OPT, _list_of(_mapping(_CPUINFO_ID), non_empty=True)),
        }), non_empty=True)),
        "android": (OPT, _mapping({
            "soc_model": (REQ, _list_of(_string, non_empty=True)),
            "board_platform": (REQ, _list_of(_string, non_empty=True)),
            "soc_manufacturer": (OPT, _string),
        })),
        "l3_kib": (REQ, _optional(_plausible("soc.l3_kib"))),
        "slc_kib": (REQ, _optional(_plausible("soc.slc_kib"))),
        "gpu": (REQ, _optional(_mapping({
            "ref": (REQ, _name),
            "compute_units": (REQ, _plausible("soc.gpu.compute_units")),
            "clock_mhz": (REQ, _plausible("soc.gpu.clock_mhz")),
        }))),
        "memory": (REQ, _mapping({
            "type": (REQ, _string),
            "peak_bandwidth_gbps": (REQ, _plausible("soc.memory.peak_bandwidth_gbps")),
            "channels": (REQ, _plausible("soc.memory.channels")),
        })),
    },
    "alias": {
        "kind": (REQ, _string),
        "name": (REQ, _name),
        "ref": (REQ, _name),
        "sources": (REQ, _list_of(_string)),
        "notes": (OPT, _any_string),
    },
}


def _check_uncertain_paths(ctx: Ctx, raw: dict, paths) -> tuple[str, ...]:
    for i, path in enumerate(paths or ()):
        node: Any = raw
        for segment in path.split("."):
            if isinstance(node, list):  # cluster lists are addressed by role
                match = [item for item in node if isinstance(item, dict) and item.get("role") == segment]
                node = match[0] if match else _MISSING
            elif isinstance(node, dict) and segment in node:
                node = node[segment]
            else:
                node = _MISSING
            if node is _MISSING:
                raise ctx.fail(f"uncertain[{i}]", f"'{path}' does not name a field of this file")
    return tuple(paths or ())


_MISSING = object()


def check_file(path: Path, raw: dict) -> dict:
    """The cleaned fields of one file (not yet resolving its references), or HardwareError."""
    ctx = Ctx(display(path))
    kind = raw.get("kind")
    kinds = ", ".join(SCHEMAS)
    if kind is None:
        raise HardwareError(f"{ctx.where}: missing required field 'kind' (must be one of {kinds})")
    if not isinstance(kind, str) or kind not in SCHEMAS:
        raise ctx.fail("kind", f"must be one of {kinds}, got {_shown(kind)}")
    clean = _mapping(SCHEMAS[kind])(ctx, "", raw)
    if clean["name"] != path.stem:
        raise ctx.fail("name", f"'{clean['name']}' must match the file name '{path.stem}'")
    if kind != "alias":
        clean["uncertain"] = _check_uncertain_paths(ctx, raw, clean.get("uncertain"))
    _check_semantics(ctx, kind, clean)
    return clean


def _check_semantics(ctx: Ctx, kind: str, d: dict) -> None:
    """Cross-field rules inside one file (xfc/rules.py): values that are each
    plausible but impossible together."""
    check = {"cpu_core": rules.check_cpu_core, "gpu": rules.check_gpu,
             "soc": rules.check_soc}.get(kind)
    if check is not None:
        check(d, ctx.fail)
