"""Loading hardware descriptions: strict YAML, references between files, the dataclasses.

  load(name_or_path)   what a user typed after --hw: 'host', 'host:<isa>', a path, a shipped
                       file name or a bare name -> HardwareDescription
  validate_file(path)  one file (resolving its references), or HardwareError
  load_path(path)      the same for a path known to exist (shipped descriptions, `xfc hw list`)
  shipped_files()      every shipped description, aliases last

Files are parsed with a safe loader that also refuses anchors/aliases (no alias bombs), duplicate
keys and any tag that would construct a Python object; every error is one HardwareError line
naming the file (and, through schema.py, the field).
"""
from __future__ import annotations

import copy
import difflib
import functools
import os
from pathlib import Path
from typing import Optional

import yaml

from ..errors import HardwareError
from ..paths import HARDWARE_DIR
from ..settings import FROM_ENVIRONMENT
from . import rules
from .host import detect_host
from .model import (AndroidIds, CacheLevel, CpuCluster, CpuCore, GpuDescription, HardwareDescription, LoadRules,
                    MemoryDescription)
from .schema import Ctx, LongInteger, check_file, display

SHIPPED_ROOT = HARDWARE_DIR
KIND_DIRS = {"cpu_core": "cpu", "gpu": "gpu", "soc": "soc"}
MAX_FILE_BYTES = 256 * 1024


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
        return LongInteger(sum(ch.isdigit() for ch in text))
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


def display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


@functools.lru_cache(maxsize=256)
def _parsed_once(text: str):
    return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - _StrictLoader is a SafeLoader


def _parsed(text: str):
    """The YAML document in text, parsed once per process per distinct text: a SoC file pulls in its
    cores and GPU, so a command (or a test run) that loads many descriptions would otherwise parse
    the same shipped files again and again in pure-Python PyYAML. Keyed by the text, so an edited
    file is parsed afresh; a deep copy, so no caller sees another's edits; errors are not cached."""
    return copy.deepcopy(_parsed_once(text))


def read_yaml(path: Path) -> dict:
    """Read one file as a mapping, or raise a one-line HardwareError naming the file."""
    where = display(path)
    try:
        if path.is_dir():
            raise HardwareError(f"{where}: a directory, not a YAML file")
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
        data = _parsed(text)
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
        typical_max_clock_ghz=d["typical_max_clock_ghz"], cpuinfo_id=_cpuinfo_id(d["cpuinfo"]),
        fp16_fma_per_cycle=d.get("fp16_fma_per_cycle"),
        sdot_per_cycle=d.get("sdot_per_cycle"), smmla_per_cycle=d.get("smmla_per_cycle"))


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


def load_path(path: Path, stack: tuple[Path, ...] = ()) -> HardwareDescription:
    resolved = path.resolve()
    if resolved in stack:
        chain = " -> ".join(display(p) for p in (*stack, resolved))
        raise HardwareError(f"{display(path)}: reference cycle: {chain}")
    stack = (*stack, resolved)
    d = check_file(path, read_yaml(path))
    where = display(path)
    kind = d["kind"]

    def resolve(ref: str, kind_dir: Optional[str], field_path: str, expect_kind: Optional[str]) -> tuple[Path, dict]:
        target = _find(ref, kind_dir, path.parent) or _find(ref, None, path.parent)
        if target is None:
            raise HardwareError(f"{where}: field '{field_path}': unknown reference '{ref}' "
                                f"(no {kind_dir + '/' if kind_dir else ''}{ref}.yaml beside this file or shipped)")
        if target.resolve() in stack:
            chain = " -> ".join(display(p) for p in (*stack, target.resolve()))
            raise HardwareError(f"{where}: field '{field_path}': reference cycle: {chain}")
        data = check_file(target, read_yaml(target))
        if expect_kind and data["kind"] != expect_kind:
            raise HardwareError(f"{where}: field '{field_path}': '{ref}' is a {data['kind']}, expected {expect_kind}")
        return target, data

    if kind == "alias":
        target = _find(d["ref"], None, path.parent)
        if target is None:
            raise HardwareError(f"{where}: field 'ref': unknown reference '{d['ref']}'")
        inner = load_path(target, stack)
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
    rules.check_soc_references(d, core_ds, gpu_d, Ctx(where).fail)
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
    return load_path(Path(path))


def is_host_name(name_or_path: str) -> bool:
    """True when --hw names this machine ('host' or 'host:<isa>')."""
    text = str(name_or_path).strip()
    return text == "host" or text.lower().startswith("host:")


def load(name_or_path: str, *, host_isa_cap=FROM_ENVIRONMENT, host_measurement=None) -> HardwareDescription:
    """Resolve what a user typed after --hw: 'host', 'host:<isa>' (avx512, avx2, generic: the host
    seen as that smaller x86-64 core), a path, a shipped file name, or a bare name.
    host_isa_cap: the widest ISA 'host' may claim (None: no cap; default: XFC_HOST_ISA).
    host_measurement: the host probe's figures (xfc.hardware.host.HostMeasurement) applied to a
    host description; None keeps the assumed FMA figures (see xfc.tiledb.hostdesc for the loader
    that measures)."""
    text = str(name_or_path).strip()
    if not text:
        raise HardwareError("--hw: empty hardware name")
    if text == "host" or text.lower().startswith("host:"):
        isa = text.partition(":")[2].strip().lower() if ":" in text else None
        if isa == "":
            raise HardwareError(f"--hw {text}: name an ISA after 'host:' (avx512, avx2 or generic)")
        return detect_host(isa, host_isa_cap, measured=host_measurement)
    path = Path(text)
    if _is_file(path):
        return load_path(path)
    if (path.suffix in (".yaml", ".yml") or os.sep in text) and path.is_dir():   # a path, not a shipped name
        raise HardwareError(f"--hw {text}: a directory, not a hardware description file")
    if path.suffix in (".yaml", ".yml") or os.sep in text:
        shipped = SHIPPED_ROOT / text
        if _is_file(shipped):
            return load_path(shipped)
        found = _find(path.stem, None, None) if os.sep not in text else None
        if found is not None:
            return load_path(found)
        raise HardwareError(f"--hw {text}: no such file (and no shipped description of that name{_closest(path.stem)}; "
                            f"see 'xfc hw list')")
    found = _find(text.lower(), None, None)
    if found is None:
        raise HardwareError(f"--hw {text}: unknown hardware (not a file and not a shipped description"
                            f"{_closest(text)}; see 'xfc hw list')")
    return load_path(found)


def _closest(name: str) -> str:
    """'; did you mean X?' for the shipped name closest to a mistyped one ('' when none is close)."""
    names = sorted({p.stem for p in shipped_files()} | {"host"})
    close = difflib.get_close_matches(name.lower(), names, n=1, cutoff=0.75)
    return f"; did you mean '{close[0]}'?" if close else ""


def shipped_files() -> list[Path]:
    """Every shipped description, aliases last, in a stable order."""
    files = []
    for kind_dir in ("cpu", "gpu", "soc"):
        files += sorted((SHIPPED_ROOT / kind_dir).glob("*.yaml"))
    files += sorted(SHIPPED_ROOT.glob("*.yaml"))
    return files
