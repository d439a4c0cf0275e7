"""Hardware descriptions: strict YAML loading, validation, reference resolution, derived figures.

One place owns all of it (see hardware_descriptions/SCHEMA.md for the file format):
  load(name_or_path)      -> HardwareDescription (SoC, single CPU core, single GPU, or 'host')
  validate_file(path)     -> the same, for one file, raising HardwareError on any problem
  derived_figures(hw)     -> peak GFLOP/s per core / cluster / GPU and the machine balance

Every error is a HardwareError whose one-line message names the file, the field path and the
value. Files are parsed with a safe loader that also refuses anchors/aliases (no alias bombs)
and any tag that would construct a Python object.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

from .errors import HardwareError

SHIPPED_ROOT = Path(__file__).resolve().parent.parent / "hardware_descriptions"
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


def _no_duplicate_keys(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key '{key}'", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicate_keys)


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


def _type_name(value) -> str:
    return "null" if value is None else type(value).__name__


def _string(ctx, path, v):
    if not isinstance(v, str) or not v.strip():
        raise ctx.fail(path, f"must be a non-empty string, got {_type_name(v)} {v!r}")
    return v


def _any_string(ctx, path, v):
    if not isinstance(v, str):
        raise ctx.fail(path, f"must be a string, got {_type_name(v)} {v!r}")
    return v


def _name(ctx, path, v):
    _string(ctx, path, v)
    if not NAME_RE.match(v):
        raise ctx.fail(path, f"'{v}' must be lowercase letters, digits, '.' and '-'")
    return v


def _bool(ctx, path, v):
    if not isinstance(v, bool):
        raise ctx.fail(path, f"must be true or false, got {_type_name(v)} {v!r}")
    return v


def _positive_int(ctx, path, v):
    if isinstance(v, bool) or not isinstance(v, int):
        raise ctx.fail(path, f"must be an integer, got {_type_name(v)} {v!r}")
    if v <= 0:
        raise ctx.fail(path, f"must be > 0, got {v}")
    return v


def _nonneg_int(ctx, path, v):
    if isinstance(v, bool) or not isinstance(v, int):
        raise ctx.fail(path, f"must be an integer, got {_type_name(v)} {v!r}")
    if v < 0:
        raise ctx.fail(path, f"must be >= 0, got {v}")
    return v


def _positive_number(ctx, path, v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ctx.fail(path, f"must be a number, got {_type_name(v)} {v!r}")
    if not v > 0 or v != v or v == float("inf"):
        raise ctx.fail(path, f"must be a finite number > 0, got {v}")
    return float(v)


def _optional(check: Checker) -> Checker:
    def inner(ctx, path, v):
        return None if v is None else check(ctx, path, v)
    return inner


def _one_of(*choices: str) -> Checker:
    def inner(ctx, path, v):
        if v not in choices:
            raise ctx.fail(path, f"must be one of {', '.join(choices)}, got {v!r}")
        return v
    return inner


def _list_of(check: Checker, non_empty: bool = False) -> Checker:
    def inner(ctx, path, v):
        if not isinstance(v, list):
            raise ctx.fail(path, f"must be a list, got {_type_name(v)} {v!r}")
        if non_empty and not v:
            raise ctx.fail(path, "must not be empty")
        return tuple(check(ctx, f"{path}[{i}]", item) for i, item in enumerate(v))
    return inner


def _power_of_two(ctx, path, v):
    _positive_int(ctx, path, v)
    if v & (v - 1):
        raise ctx.fail(path, f"must be a power of two, got {v}")
    return v


def _mapping(schema: dict[str, tuple[bool, Checker]]) -> Checker:
    """schema: field -> (required, checker). Unknown keys are errors."""
    def inner(ctx, path, v):
        if not isinstance(v, dict):
            raise ctx.fail(path, f"must be a mapping, got {_type_name(v)} {v!r}")
        out = {}
        for key in v:
            if key not in schema:
                sub = f"{path}.{key}" if path else str(key)
                raise ctx.fail(sub, f"unknown key (allowed here: {', '.join(schema)})")
        for key, (required, check) in schema.items():
            sub = f"{path}.{key}" if path else key
            if key not in v:
                if required:
                    raise HardwareError(f"{ctx.where}: missing required field '{sub}'")
                out[key] = None
                continue
            out[key] = check(ctx, sub, v[key])
        return out
    return inner


REQ, OPT = True, False

_CACHE = {"size_kib": (REQ, _positive_number), "line_bytes": (REQ, _power_of_two), "ways": (REQ, _positive_int)}
_COMMON = {
    "kind": (REQ, _string),
    "name": (REQ, _name),
    "sources": (REQ, _list_of(_string, non_empty=True)),
    "uncertain": (OPT, _list_of(_string)),
    "notes": (OPT, _any_string),
}

SCHEMAS: dict[str, dict[str, tuple[bool, Checker]]] = {
    "cpu_core": {
        **_COMMON,
        "vendor": (REQ, _string),
        "isa": (REQ, _one_of("armv8.0-a", "armv8.2-a", "armv9.0-a", "x86-64")),
        "features": (REQ, _list_of(_one_of(*CPU_FEATURES))),
        "gcc_march": (REQ, _string),
        "qemu_cpu": (REQ, _any_string),
        "pipeline": (REQ, _one_of("in_order", "out_of_order")),
        "decode_width": (REQ, _positive_int),
        "vector_bits": (REQ, _one_of(128, 256, 512)),
        "vector_registers": (REQ, _positive_int),
        "fma_per_cycle": (REQ, _positive_number),
        "fma_latency_cycles": (REQ, _positive_int),
        "load_rules": (REQ, _mapping({
            "vector_loads_per_cycle": (REQ, _positive_number),
            "ld128_dual_issues_with_fma": (REQ, _bool),
            "ld128_blocking_cycles": (REQ, _nonneg_int),
            "ld64_dual_issues_with_fma": (REQ, _bool),
        })),
        "l1d": (REQ, _mapping(_CACHE)),
        "l2": (REQ, _mapping({**_CACHE, "shared_by_cores": (REQ, _positive_int)})),
        "typical_max_clock_ghz": (REQ, _positive_number),
    },
    "gpu": {
        **_COMMON,
        "vendor": (REQ, _one_of("arm", "qualcomm")),
        "family": (REQ, _one_of("mali", "adreno")),
        "architecture": (REQ, _string),
        "compute_unit_name": (REQ, _string),
        "compute_units": (REQ, _positive_int),
        "max_clock_mhz": (REQ, _positive_number),
        "warp_width": (REQ, _power_of_two),
        "half_warp_width": (REQ, _optional(_power_of_two)),
        "fp32_flop_per_clock_per_cu": (REQ, _positive_number),
        "fp16_flop_per_clock_per_cu": (REQ, _optional(_positive_number)),
        "registers_per_thread_full_occupancy": (REQ, _positive_int),
        "register_file_bytes_per_cu": (REQ, _optional(_positive_int)),
        "max_waves_per_cu": (REQ, _optional(_positive_int)),
        "local_memory": (REQ, _mapping({"size_kib": (REQ, _positive_number), "on_chip": (REQ, _bool)})),
        "max_work_group_size": (REQ, _positive_int),
        "preferred_work_group_size": (REQ, _positive_int),
        "l1_kib_per_cu": (REQ, _positive_number),
        "l2_kib": (REQ, _positive_number),
        "opencl_version": (REQ, _string),
        "extensions": (REQ, _list_of(_string)),
        "coalescing_threads": (REQ, _positive_int),
        "image_support": (REQ, _bool),
    },
    "soc": {
        **_COMMON,
        "vendor": (REQ, _string),
        "marketing_name": (REQ, _string),
        "clusters": (REQ, _list_of(_mapping({
            "role": (REQ, _one_of(*CLUSTER_ROLES)),
            "core": (REQ, _name),
            "count": (REQ, _positive_int),
            "max_clock_ghz": (REQ, _positive_number),
            "cpu_ids": (REQ, _list_of(_nonneg_int, non_empty=True)),
            "l2_kib": (OPT, _positive_number),
        }), non_empty=True)),
        "l3_kib": (REQ, _optional(_positive_number)),
        "slc_kib": (REQ, _optional(_positive_number)),
        "gpu": (REQ, _optional(_mapping({
            "ref": (REQ, _name),
            "compute_units": (REQ, _positive_int),
            "clock_mhz": (REQ, _positive_number),
        }))),
        "memory": (REQ, _mapping({
            "type": (REQ, _string),
            "peak_bandwidth_gbps": (REQ, _positive_number),
            "channels": (REQ, _positive_int),
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
    if kind is None:
        raise HardwareError(f"{ctx.where}: missing required field 'kind' (one of {', '.join(SCHEMAS)})")
    if kind not in SCHEMAS:
        raise ctx.fail("kind", f"must be one of {', '.join(SCHEMAS)}, got {kind!r}")
    clean = _mapping(SCHEMAS[kind])(ctx, "", raw)
    if clean["name"] != path.stem:
        raise ctx.fail("name", f"'{clean['name']}' must match the file name '{path.stem}'")
    if kind != "alias":
        clean["uncertain"] = _check_uncertain_paths(ctx, raw, clean.get("uncertain"))
    _check_semantics(ctx, kind, clean)
    return clean


def _check_semantics(ctx: _Ctx, kind: str, d: dict) -> None:
    """Cross-field rules: values that are each fine but impossible together."""
    if kind == "cpu_core":
        lanes = d["vector_bits"] // 32
        if d["vector_registers"] < 8:
            raise ctx.fail("vector_registers", f"{d['vector_registers']} is too few for any micro-kernel (need >= 8)")
        if d["l2"]["size_kib"] < d["l1d"]["size_kib"]:
            raise ctx.fail("l2.size_kib", f"{d['l2']['size_kib']} is smaller than l1d.size_kib {d['l1d']['size_kib']}")
        if d["vendor"] == "arm" and "neon" not in d["features"]:
            raise ctx.fail("features", "an Arm AArch64 core must list 'neon'")
        if lanes < 4:
            raise ctx.fail("vector_bits", "must hold at least 4 fp32 lanes")
    elif kind == "gpu":
        if d["preferred_work_group_size"] > d["max_work_group_size"]:
            raise ctx.fail("preferred_work_group_size",
                           f"{d['preferred_work_group_size']} exceeds max_work_group_size {d['max_work_group_size']}")
        if d["half_warp_width"] is not None and d["half_warp_width"] >= d["warp_width"]:
            raise ctx.fail("half_warp_width", f"{d['half_warp_width']} must be smaller than warp_width {d['warp_width']}")
    elif kind == "soc":
        roles = [c["role"] for c in d["clusters"]]
        for i, cluster in enumerate(d["clusters"]):
            if roles.count(cluster["role"]) > 1:
                raise ctx.fail(f"clusters[{i}].role", f"'{cluster['role']}' appears more than once")
            if len(cluster["cpu_ids"]) != cluster["count"]:
                raise ctx.fail(f"clusters[{i}].cpu_ids",
                               f"lists {len(cluster['cpu_ids'])} CPUs but count is {cluster['count']}")
        ids = [cpu for c in d["clusters"] for cpu in c["cpu_ids"]]
        if len(set(ids)) != len(ids):
            raise ctx.fail("clusters", f"a CPU id appears in two clusters ({sorted(ids)})")


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


def _find(name: str, kind_dir: Optional[str], near: Optional[Path]) -> Optional[Path]:
    for candidate in _candidates(name, kind_dir, near):
        if candidate.is_file():
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
        typical_max_clock_ghz=d["typical_max_clock_ghz"])


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
    for i, c in enumerate(d["clusters"]):
        _, core_d = resolve(c["core"], "cpu", f"clusters[{i}].core", "cpu_core")
        core = _core(core_d)
        l2 = _cache(core_d["l2"], shared_by=core_d["l2"]["shared_by_cores"], size_kib_override=c.get("l2_kib"))
        clusters.append(CpuCluster(role=c["role"], core=core, count=c["count"], clock_ghz=c["max_clock_ghz"],
                                   cpu_ids=tuple(c["cpu_ids"]), l2=l2))
        uncertain += [u for u in _tagged(core.name, core_d["uncertain"]) if u not in uncertain]
    clusters.sort(key=lambda cl: -cl.peak_gflops_per_core)
    gpu = None
    if d["gpu"] is not None:
        _, gpu_d = resolve(d["gpu"]["ref"], "gpu", "gpu.ref", "gpu")
        gpu = _gpu(gpu_d, d["gpu"]["compute_units"], d["gpu"]["clock_mhz"])
        uncertain += [u for u in _tagged(gpu_d["name"], gpu_d["uncertain"]) if u not in uncertain]
    return HardwareDescription(
        name=d["name"], kind=kind, marketing_name=d["marketing_name"], clusters=tuple(clusters), gpu=gpu,
        l3_bytes=int(d["l3_kib"] * 1024) if d["l3_kib"] else None,
        slc_bytes=int(d["slc_kib"] * 1024) if d["slc_kib"] else None,
        memory=MemoryDescription(**d["memory"]), target_arch="aarch64", sources=tuple(sources),
        uncertain=tuple(uncertain), source_path=where, notes=d.get("notes") or "")


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
    if path.is_file():
        return _load_path(path)
    if path.suffix in (".yaml", ".yml") or os.sep in text:
        shipped = SHIPPED_ROOT / text
        if shipped.is_file():
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
