"""Hardware descriptions: strict YAML loading, validation, reference resolution, derived figures.

One place owns all of it (see hardware_descriptions/SCHEMA.md for the file format):
  load(name_or_path)      -> HardwareDescription (SoC, single CPU core, single GPU, or 'host')
  validate_file(path)     -> the same, for one file, raising HardwareError on any problem
  derived_figures(hw)     -> peak GFLOP/s per core / cluster / GPU and the machine balance

Every error is a HardwareError whose one-line message names the file, the field path, the
value and what the field accepts, for any value YAML can produce. Files are parsed with a safe
loader that also refuses anchors/aliases (no alias bombs) and any tag that would construct a
Python object. Numeric fields are checked against the plausible ranges of hardware_ranges.py;
values that are each plausible but physically impossible together are refused by the rules in
hardware_rules.py.
"""
from __future__ import annotations

import datetime
import os
import re
import reprlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

from . import hardware_rules
from .errors import HardwareError
from .hardware_ranges import PLAUSIBLE
from .paths import HARDWARE_DIR

SHIPPED_ROOT = HARDWARE_DIR
KIND_DIRS = {"cpu_core": "cpu", "gpu": "gpu", "soc": "soc"}
MAX_FILE_BYTES = 256 * 1024
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9.-]*$")
CPU_FEATURES = ("neon", "fp16", "dotprod", "i8mm", "bf16", "sve2", "avx2", "avx512f", "fma")
CLUSTER_ROLES = ("prime", "big", "mid", "little")


# ---------------------------------------------------------------------------------------------
# Dataclasses that flow out of this module.
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CacheLevel:
    size_bytes: int
    line_bytes: int
    ways: int
    shared_by_cores: int = 1


@dataclass(frozen=True)
class LoadRules:
    vector_loads_per_cycle: float     # 128-bit vector loads issued per cycle
    ld128_dual_issues_with_fma: bool  # False on A53/A55-class in-order cores
    ld128_blocking_cycles: int        # cycles a 128-bit load blocks the pipe
    ld64_dual_issues_with_fma: bool


@dataclass(frozen=True)
class CpuCore:
    name: str
    vendor: str
    isa: str
    features: tuple[str, ...]
    gcc_march: str
    qemu_cpu: str
    pipeline: str                 # 'in_order' | 'out_of_order'
    decode_width: int
    vector_bits: int
    vector_registers: int
    fma_per_cycle: float          # vector FMA instructions of vector_bits per cycle
    fma_latency_cycles: int
    load_rules: LoadRules
    l1d: CacheLevel
    l2: CacheLevel
    typical_max_clock_ghz: float
    cpuinfo_id: Optional[tuple[int, int]] = None   # (CPU implementer, CPU part) in /proc/cpuinfo

    @property
    def fp32_lanes(self) -> int:
        return self.vector_bits // 32

    @property
    def fp32_flop_per_cycle(self) -> float:
        return self.fp32_lanes * 2 * self.fma_per_cycle

    @property
    def isa_family(self) -> str:
        """Which code generator dialect fits: neon, avx512, avx2 or generic."""
        if "neon" in self.features:
            return "neon"
        if "avx512f" in self.features:
            return "avx512"
        if "avx2" in self.features and "fma" in self.features:
            return "avx2"
        return "generic"


@dataclass(frozen=True)
class CpuCluster:
    role: str
    core: CpuCore
    count: int
    clock_ghz: float
    cpu_ids: tuple[int, ...]
    l2: CacheLevel               # the core's L2, with this SoC's size override applied
    cpuinfo_ids: tuple[tuple[int, int], ...] = ()  # (implementer, part) pairs its CPUs may report

    @property
    def peak_gflops_per_core(self) -> float:
        return self.core.fp32_flop_per_cycle * self.clock_ghz

    @property
    def peak_gflops(self) -> float:
        return self.peak_gflops_per_core * self.count


@dataclass(frozen=True)
class GpuDescription:
    name: str
    vendor: str
    family: str                  # 'mali' | 'adreno'
    architecture: str
    compute_unit_name: str
    compute_units: int
    max_clock_mhz: float
    warp_width: int
    half_warp_width: Optional[int]
    fp32_flop_per_clock_per_cu: float
    fp16_flop_per_clock_per_cu: Optional[float]
    registers_per_thread_full_occupancy: int
    register_file_bytes_per_cu: Optional[int]
    max_waves_per_cu: Optional[int]
    local_memory_kib: float
    local_memory_on_chip: bool
    max_work_group_size: int
    preferred_work_group_size: int
    l1_kib_per_cu: float
    l2_kib: float
    opencl_version: str
    extensions: tuple[str, ...]
    coalescing_threads: int
    image_support: bool

    @property
    def peak_fp32_gflops(self) -> float:
        return self.compute_units * self.fp32_flop_per_clock_per_cu * self.max_clock_mhz / 1000.0

    @property
    def peak_fp16_gflops(self) -> Optional[float]:
        if self.fp16_flop_per_clock_per_cu is None:
            return None
        return self.compute_units * self.fp16_flop_per_clock_per_cu * self.max_clock_mhz / 1000.0


@dataclass(frozen=True)
class MemoryDescription:
    type: str
    peak_bandwidth_gbps: float
    channels: int


@dataclass(frozen=True)
class AndroidIds:
    """What identifies a SoC on Android (compared case-insensitively)."""
    soc_models: tuple[str, ...]          # ro.soc.model (Android 12+)
    board_platforms: tuple[str, ...]     # ro.board.platform, ro.hardware or ro.chipname
    soc_manufacturer: str = ""           # ro.soc.manufacturer (the virtual device reports it)


@dataclass(frozen=True)
class HardwareDescription:
    name: str
    kind: str                         # 'soc' | 'cpu_core' | 'gpu' | 'host'
    marketing_name: str
    clusters: tuple[CpuCluster, ...]  # fastest first; empty for a GPU-only description
    gpu: Optional[GpuDescription]
    l3_bytes: Optional[int]
    slc_bytes: Optional[int]
    memory: Optional[MemoryDescription]
    target_arch: str                  # 'aarch64' | 'x86_64'
    sources: tuple[str, ...]
    uncertain: tuple[str, ...]        # field paths to check on a device, prefixed by file name
    source_path: str                  # the file it was loaded from ('' for host detection)
    notes: str = ""
    android: Optional["AndroidIds"] = None   # how an Android phone with this SoC names it

    def cluster(self, role: Optional[str] = None) -> CpuCluster:
        """The cluster to synthesize for: the named role, or the default 'big' one.

        Default: the 'big' cluster, else the only/fastest one (XNNPACK likewise tunes for the
        big cores and gives the others the same tile shapes).
        """
        if not self.clusters:
            raise HardwareError(f"{self.name}: has no CPU clusters (it describes only a GPU)")
        roles = [c.role for c in self.clusters]
        if role is None:
            return self.clusters[roles.index("big")] if "big" in roles else self.clusters[0]
        if role not in roles:
            raise HardwareError(f"{self.name}: no '{role}' cluster (it has: {', '.join(roles)})")
        return self.clusters[roles.index(role)]


# ---------------------------------------------------------------------------------------------
# Strict YAML reading.
# ---------------------------------------------------------------------------------------------

class _LongInteger:
    """An integer literal too long for Python to convert (more than int_max_str_digits digits).

    The loader returns this marker instead of failing, so the field checker can name the field
    ("got an integer of 5000 digits"); no field accepts it."""

    def __init__(self, digits: int):
        self.digits = digits

    def __str__(self) -> str:
        return f"an integer of {self.digits} digits"

    __repr__ = __str__


_MAX_INT_LITERAL_CHARS = 4000  # below Python's default int/str conversion limit (4300 digits)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors and aliases: HDL files never need them, and refusing
    them makes 'billion laughs' alias bombs impossible."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, "anchors and aliases are not allowed in hardware descriptions", event.start_mark)
        event = self.peek_event()
        if getattr(event, "anchor", None):
            raise yaml.composer.ComposerError(
                None, None, "anchors and aliases are not allowed in hardware descriptions", event.start_mark)
        return super().compose_node(parent, index)

    def construct_object(self, node, deep=False):
        # PyYAML's scalar constructors raise plain Python errors for some well-formed text
        # ('2001-13-45' as a date, '!!int abc', '!!bool maybe'); turn them into a marked YAML
        # error so the file gets a one-line message with the line and column.
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError, IndexError) as exc:
            tag = str(node.tag).rsplit(":", 1)[-1]
            value = node.value if isinstance(node.value, str) else ""
            shown = value if len(value) <= 40 else value[:37] + "..."
            detail = f" ({exc})" if isinstance(exc, ValueError) and str(exc) else ""
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {shown!r} as a YAML {tag}{detail}", node.start_mark) from None


def _construct_int(loader, node):
    text = loader.construct_scalar(node)
    if len(text) > _MAX_INT_LITERAL_CHARS:
        return _LongInteger(sum(ch.isdigit() for ch in text))
    return yaml.SafeLoader.construct_yaml_int(loader, node)


def _no_duplicate_keys(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
        except TypeError:   # a list or mapping as a key: construct_mapping reports it with a mark
            break
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key '{key}'", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicate_keys)
_StrictLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def read_yaml(path: Path) -> dict:
    """Read one file as a mapping, or raise a one-line HardwareError naming the file."""
    where = _display(path)
    try:
        if not path.is_file():
            raise HardwareError(f"{where}: no such file")
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise HardwareError(f"{where}: file is {size} bytes; hardware descriptions are at most {MAX_FILE_BYTES}")
        raw = path.read_bytes()
    except OSError as exc:
        raise HardwareError(f"{where}: cannot read ({exc.strerror})") from None
    if b"\x00" in raw:
        raise HardwareError(f"{where}: binary data, not a YAML text file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HardwareError(f"{where}: not UTF-8 text (bad byte at offset {exc.start})") from None
    if not text.strip():
        raise HardwareError(f"{where}: file is empty")
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - _StrictLoader is a SafeLoader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = exc.problem or exc.context or "invalid YAML"
        if "could not determine a constructor" in str(problem) or "constructor for the tag" in str(problem):
            problem = f"YAML tag not allowed: {problem}"
        raise HardwareError(f"{where}: not valid YAML{line}: {problem}") from None
    except yaml.YAMLError as exc:
        raise HardwareError(f"{where}: not valid YAML: {str(exc).splitlines()[0]}") from None
    except RecursionError:
        raise HardwareError(f"{where}: YAML nested too deeply") from None
    if data is None:
        raise HardwareError(f"{where}: file is empty")
    if not isinstance(data, dict):
        raise HardwareError(f"{where}: top level must be a mapping of fields, got {type(data).__name__}")
    return data


# ---------------------------------------------------------------------------------------------
# Schema: one table per kind; each field has a checker that returns the cleaned value.
# ---------------------------------------------------------------------------------------------

class _Ctx:
    def __init__(self, where: str):
        self.where = where

    def fail(self, path: str, message: str) -> HardwareError:
        return HardwareError(f"{self.where}: field '{path}': {message}")


Checker = Callable[[_Ctx, str, Any], Any]

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
    if isinstance(value, _LongInteger):
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


def _reject(ctx: _Ctx, path: str, check: Checker, value) -> HardwareError:
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
# range in hardware_ranges.PLAUSIBLE; give any new numeric field a range there too (the sweep in
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
    """A numeric field checked against its plausible range in hardware_ranges.PLAUSIBLE."""
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


def _check_uncertain_paths(ctx: _Ctx, raw: dict, paths) -> tuple[str, ...]:
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


def _checked(path: Path, raw: dict) -> dict:
    ctx = _Ctx(_display(path))
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


def _check_semantics(ctx: _Ctx, kind: str, d: dict) -> None:
    """Cross-field rules inside one file (xfc/hardware_rules.py): values that are each
    plausible but impossible together."""
    check = {"cpu_core": hardware_rules.check_cpu_core, "gpu": hardware_rules.check_gpu,
             "soc": hardware_rules.check_soc}.get(kind)
    if check is not None:
        check(d, ctx.fail)


# ---------------------------------------------------------------------------------------------
# Reference resolution and building the dataclasses.
# ---------------------------------------------------------------------------------------------

def _candidates(name: str, kind_dir: Optional[str], near: Optional[Path]) -> list[Path]:
    """Where a referenced name may live: beside the referencing file first, then shipped."""
    out = []
    roots = ([near, near.parent] if near is not None else []) + [SHIPPED_ROOT]
    for root in roots:
        dirs = [kind_dir] if kind_dir else list(KIND_DIRS.values())
        for sub in dirs + [""]:
            out.append((root / sub / f"{name}.yaml") if sub else (root / f"{name}.yaml"))
    return out


def _is_file(path: Path) -> bool:
    """Path.is_file() that answers False instead of raising (a name too long for the file system)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def _find(name: str, kind_dir: Optional[str], near: Optional[Path]) -> Optional[Path]:
    for candidate in _candidates(name, kind_dir, near):
        if _is_file(candidate):
            return candidate
    return None


def _cache(d: dict, shared_by: int = 1, size_kib_override: Optional[float] = None) -> CacheLevel:
    size_kib = size_kib_override if size_kib_override is not None else d["size_kib"]
    return CacheLevel(size_bytes=int(size_kib * 1024), line_bytes=d["line_bytes"], ways=d["ways"],
                      shared_by_cores=shared_by)


def _core(d: dict) -> CpuCore:
    lr = d["load_rules"]
    return CpuCore(
        name=d["name"], vendor=d["vendor"], isa=d["isa"], features=tuple(d["features"]),
        gcc_march=d["gcc_march"], qemu_cpu=d["qemu_cpu"], pipeline=d["pipeline"],
        decode_width=d["decode_width"], vector_bits=d["vector_bits"], vector_registers=d["vector_registers"],
        fma_per_cycle=d["fma_per_cycle"], fma_latency_cycles=d["fma_latency_cycles"],
        load_rules=LoadRules(**lr), l1d=_cache(d["l1d"]),
        l2=_cache(d["l2"], shared_by=d["l2"]["shared_by_cores"]),
        typical_max_clock_ghz=d["typical_max_clock_ghz"], cpuinfo_id=_cpuinfo_id(d["cpuinfo"]))


def _cpuinfo_id(d: Optional[dict]) -> Optional[tuple[int, int]]:
    return None if d is None else (d["implementer"], d["part"])


def _gpu(d: dict, compute_units: Optional[int] = None, clock_mhz: Optional[float] = None) -> GpuDescription:
    return GpuDescription(
        name=d["name"], vendor=d["vendor"], family=d["family"], architecture=d["architecture"],
        compute_unit_name=d["compute_unit_name"],
        compute_units=compute_units or d["compute_units"], max_clock_mhz=clock_mhz or d["max_clock_mhz"],
        warp_width=d["warp_width"], half_warp_width=d["half_warp_width"],
        fp32_flop_per_clock_per_cu=d["fp32_flop_per_clock_per_cu"],
        fp16_flop_per_clock_per_cu=d["fp16_flop_per_clock_per_cu"],
        registers_per_thread_full_occupancy=d["registers_per_thread_full_occupancy"],
        register_file_bytes_per_cu=d["register_file_bytes_per_cu"], max_waves_per_cu=d["max_waves_per_cu"],
        local_memory_kib=d["local_memory"]["size_kib"], local_memory_on_chip=d["local_memory"]["on_chip"],
        max_work_group_size=d["max_work_group_size"], preferred_work_group_size=d["preferred_work_group_size"],
        l1_kib_per_cu=d["l1_kib_per_cu"], l2_kib=d["l2_kib"], opencl_version=d["opencl_version"],
        extensions=tuple(d["extensions"]), coalescing_threads=d["coalescing_threads"],
        image_support=d["image_support"])


def _tagged(prefix: str, paths) -> tuple[str, ...]:
    return tuple(f"{prefix}:{p}" for p in paths or ())


def _load_path(path: Path, stack: tuple[Path, ...] = ()) -> HardwareDescription:
    resolved = path.resolve()
    if resolved in stack:
        chain = " -> ".join(_display(p) for p in (*stack, resolved))
        raise HardwareError(f"{_display(path)}: reference cycle: {chain}")
    stack = (*stack, resolved)
    d = _checked(path, read_yaml(path))
    where = _display(path)
    kind = d["kind"]

    def resolve(ref: str, kind_dir: Optional[str], field_path: str, expect_kind: Optional[str]) -> tuple[Path, dict]:
        target = _find(ref, kind_dir, path.parent) or _find(ref, None, path.parent)
        if target is None:
            raise HardwareError(f"{where}: field '{field_path}': unknown reference '{ref}' "
                                f"(no {kind_dir + '/' if kind_dir else ''}{ref}.yaml beside this file or shipped)")
        if target.resolve() in stack:
            chain = " -> ".join(_display(p) for p in (*stack, target.resolve()))
            raise HardwareError(f"{where}: field '{field_path}': reference cycle: {chain}")
        data = _checked(target, read_yaml(target))
        if expect_kind and data["kind"] != expect_kind:
            raise HardwareError(f"{where}: field '{field_path}': '{ref}' is a {data['kind']}, expected {expect_kind}")
        return target, data

    if kind == "alias":
        target = _find(d["ref"], None, path.parent)
        if target is None:
            raise HardwareError(f"{where}: field 'ref': unknown reference '{d['ref']}'")
        inner = _load_path(target, stack)
        return inner
    if kind == "cpu_core":
        core = _core(d)
        cluster = CpuCluster(role="big", core=core, count=1, clock_ghz=core.typical_max_clock_ghz,
                             cpu_ids=(0,), l2=core.l2)
        return HardwareDescription(
            name=d["name"], kind=kind, marketing_name=d["name"], clusters=(cluster,), gpu=None,
            l3_bytes=None, slc_bytes=None, memory=None, target_arch="aarch64" if core.vendor == "arm" else "x86_64",
            sources=d["sources"], uncertain=_tagged(d["name"], d["uncertain"]), source_path=where,
            notes=d.get("notes") or "")
    if kind == "gpu":
        return HardwareDescription(
            name=d["name"], kind=kind, marketing_name=d["name"], clusters=(), gpu=_gpu(d), l3_bytes=None,
            slc_bytes=None, memory=None, target_arch="aarch64", sources=d["sources"],
            uncertain=_tagged(d["name"], d["uncertain"]), source_path=where, notes=d.get("notes") or "")
    # soc
    clusters = []
    uncertain = list(_tagged(d["name"], d["uncertain"]))
    sources = list(d["sources"])
    core_ds = [resolve(c["core"], "cpu", f"clusters[{i}].core", "cpu_core")[1] for i, c in enumerate(d["clusters"])]
    gpu_d = resolve(d["gpu"]["ref"], "gpu", "gpu.ref", "gpu")[1] if d["gpu"] is not None else None
    hardware_rules.check_soc_references(d, core_ds, gpu_d, _Ctx(where).fail)
    for c, core_d in zip(d["clusters"], core_ds):
        core = _core(core_d)
        l2 = _cache(core_d["l2"], shared_by=core_d["l2"]["shared_by_cores"], size_kib_override=c.get("l2_kib"))
        # A SoC vendor may report its own ids for a licensed core (e.g. Kryo): the cluster lists them.
        ids = tuple(_cpuinfo_id(x) for x in c["cpuinfo"] or ()) + ((core.cpuinfo_id,) if core.cpuinfo_id else ())
        clusters.append(CpuCluster(role=c["role"], core=core, count=c["count"], clock_ghz=c["max_clock_ghz"],
                                   cpu_ids=tuple(c["cpu_ids"]), l2=l2, cpuinfo_ids=tuple(dict.fromkeys(ids))))
        uncertain += [u for u in _tagged(core.name, core_d["uncertain"]) if u not in uncertain]
    clusters.sort(key=lambda cl: -cl.peak_gflops_per_core)
    gpu = None
    if gpu_d is not None:
        gpu = _gpu(gpu_d, d["gpu"]["compute_units"], d["gpu"]["clock_mhz"])
        uncertain += [u for u in _tagged(gpu_d["name"], gpu_d["uncertain"]) if u not in uncertain]
    return HardwareDescription(
        name=d["name"], kind=kind, marketing_name=d["marketing_name"], clusters=tuple(clusters), gpu=gpu,
        l3_bytes=int(d["l3_kib"] * 1024) if d["l3_kib"] else None,
        slc_bytes=int(d["slc_kib"] * 1024) if d["slc_kib"] else None,
        memory=MemoryDescription(**d["memory"]), target_arch="aarch64", sources=tuple(sources),
        uncertain=tuple(uncertain), source_path=where, notes=d.get("notes") or "",
        android=AndroidIds(tuple(d["android"]["soc_model"]), tuple(d["android"]["board_platform"]),
                           d["android"]["soc_manufacturer"] or "") if d["android"] else None)


def validate_file(path: str | os.PathLike) -> HardwareDescription:
    """Load one file (resolving its references) or raise HardwareError."""
    return _load_path(Path(path))


def load(name_or_path: str) -> HardwareDescription:
    """Resolve what a user typed after --hw: 'host', 'host:<isa>' (avx512, avx2, generic: the host
    seen as that smaller x86-64 core), a path, a shipped file name, or a bare name."""
    text = str(name_or_path).strip()
    if not text:
        raise HardwareError("--hw: empty hardware name")
    if text == "host" or text.lower().startswith("host:"):
        from .host import detect_host  # I/O (and the XFC_HOST_ISA variable) lives in host.py
        isa = text.partition(":")[2].strip().lower() if ":" in text else None
        if isa == "":
            raise HardwareError(f"--hw {text}: name an ISA after 'host:' (avx512, avx2 or generic)")
        return detect_host(isa)
    path = Path(text)
    if _is_file(path):
        return _load_path(path)
    if path.suffix in (".yaml", ".yml") or os.sep in text:
        shipped = SHIPPED_ROOT / text
        if _is_file(shipped):
            return _load_path(shipped)
        found = _find(path.stem, None, None) if os.sep not in text else None
        if found is not None:
            return _load_path(found)
        raise HardwareError(f"--hw {text}: no such file (and no shipped description of that name; see 'xfc hw list')")
    found = _find(text.lower(), None, None)
    if found is None:
        raise HardwareError(f"--hw {text}: unknown hardware (not a file and not a shipped description; see 'xfc hw list')")
    return _load_path(found)


def shipped_files() -> list[Path]:
    """Every shipped description, aliases last, in a stable order."""
    files = []
    for kind_dir in ("cpu", "gpu", "soc"):
        files += sorted((SHIPPED_ROOT / kind_dir).glob("*.yaml"))
    files += sorted(SHIPPED_ROOT.glob("*.yaml"))
    return files


# ---------------------------------------------------------------------------------------------
# Derived figures: the only place peak numbers are computed.
# ---------------------------------------------------------------------------------------------

def derived_figures(hw: HardwareDescription) -> dict:
    """Peak FP32 GFLOP/s per core, per cluster, whole CPU, GPU, and the machine balance."""
    clusters = []
    for c in hw.clusters:
        clusters.append({
            "role": c.role, "core": c.core.name, "count": c.count, "clock_ghz": c.clock_ghz,
            "fp32_flop_per_cycle_per_core": c.core.fp32_flop_per_cycle,
            "peak_gflops_per_core": round(c.peak_gflops_per_core, 3),
            "peak_gflops_cluster": round(c.peak_gflops, 3),
        })
    cpu_total = sum(c.peak_gflops for c in hw.clusters)
    gpu_peak = hw.gpu.peak_fp32_gflops if hw.gpu else None
    out = {
        "clusters": clusters,
        "cpu_peak_gflops": round(cpu_total, 3) if hw.clusters else None,
        "gpu_peak_fp32_gflops": round(gpu_peak, 3) if gpu_peak is not None else None,
        "gpu_peak_fp16_gflops": round(hw.gpu.peak_fp16_gflops, 3) if hw.gpu and hw.gpu.peak_fp16_gflops else None,
        "dram_bandwidth_gbps": hw.memory.peak_bandwidth_gbps if hw.memory else None,
    }
    if hw.memory and hw.clusters:
        out["cpu_bytes_per_flop"] = round(hw.memory.peak_bandwidth_gbps / cpu_total, 4)
    if hw.memory and gpu_peak:
        out["gpu_bytes_per_flop"] = round(hw.memory.peak_bandwidth_gbps / gpu_peak, 4)
    return out
