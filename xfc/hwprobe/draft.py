"""Device facts -> a draft SoC description in the shipped schema (plus core files for unknown
CPU parts). Pure: shipped descriptions are read through xfc.hardware, nothing is written.

Each value records where it came from (`Draft.provenance`: field path -> source, rendered as a
comment beside the value). Values the device shows are cited as `device:<serial> <path>`.
What it cannot show (FMA pipes, latencies, load rules, memory bandwidth, the SLC) comes from
the matched shipped core / SoC description, cited by file, or is a placeholder; both kinds are
listed under `uncertain`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Mapping, Optional, Sequence

from xfc.errors import HardwareError
from xfc.hardware import SHIPPED_ROOT, CpuCluster, CpuCore, GpuDescription, HardwareDescription, load
from xfc.hardware.schema import NAME_RE
from xfc.hardware.load import read_yaml
from xfc.hardware.rules import cache_geometry_problem
from xfc.hardware.identity import Match, match_identity, shipped_socs

from .facts import CPUINFO, MEMINFO, ClusterFacts, DeviceFacts, cluster_facts, l3_entry, xfc_features
from xfc.hardware.cpuinfo import Midr

from .parse import CacheEntry

ROLES_BY_COUNT = {1: ("big",), 2: ("big", "little"), 3: ("prime", "big", "little"),
                  4: ("prime", "big", "mid", "little")}
# MIDR implementer codes (Arm ARM, "MIDR_EL1"; the same table is in Linux
# arch/arm64/include/asm/cputype.h): used to name a core file for an unknown part.
IMPLEMENTERS = {0x41: "arm", 0x42: "broadcom", 0x43: "cavium", 0x46: "fujitsu", 0x48: "hisilicon",
                0x4E: "nvidia", 0x50: "apm", 0x51: "qualcomm", 0x53: "samsung", 0x61: "apple",
                0x6D: "microsoft", 0xC0: "ampere"}
# Arm part numbers of cores xfc ships no description for (source: torvalds/linux
# arch/arm64/include/asm/cputype.h, ARM_CPU_PART_*): a new core file gets the real name.
ARM_PARTS = {0xD04: "cortex-a35", 0xD07: "cortex-a57", 0xD08: "cortex-a72", 0xD09: "cortex-a73",
             0xD0E: "cortex-a76ae", 0xD42: "cortex-a78ae", 0xD4B: "cortex-a78c", 0xD4C: "cortex-x1c",
             0xD80: "cortex-a520", 0xD81: "cortex-a720", 0xD82: "cortex-x4", 0xD85: "cortex-x925",
             0xD87: "cortex-a725"}
ARCH_SOURCE = "Arm Architecture Reference Manual: AArch64 has 32 x 128-bit SIMD registers"
PLACEHOLDER = "xfc hw probe placeholder (the device does not expose it; check it)"
# Placeholders for a core the device cannot describe, by pipeline (in-order: A55-class).
_CORE_DEFAULTS = {
    "in_order": dict(decode_width=2, fma_per_cycle=1, fma_latency_cycles=4,
                     load_rules=dict(vector_loads_per_cycle=1, ld128_dual_issues_with_fma=False,
                                     ld128_blocking_cycles=2, ld64_dual_issues_with_fma=True),
                     l1d=(32, 64, 4), l2=(128, 64, 4)),
    "out_of_order": dict(decode_width=4, fma_per_cycle=2, fma_latency_cycles=4,
                         load_rules=dict(vector_loads_per_cycle=2, ld128_dual_issues_with_fma=True,
                                         ld128_blocking_cycles=0, ld64_dual_issues_with_fma=True),
                         l1d=(64, 64, 4), l2=(256, 64, 8)),
}
_DEFAULT_MEMORY = {"type": "unknown", "peak_bandwidth_gbps": 34.1, "channels": 4}
_VENDORS = {"qti": "qualcomm", "qualcomm": "qualcomm", "qcom": "qualcomm", "mediatek": "mediatek",
            "mtk": "mediatek", "samsung": "samsung", "hisilicon": "hisilicon", "huawei": "hisilicon",
            "google": "google", "unisoc": "unisoc", "spreadtrum": "unisoc"}


@dataclass(frozen=True)
class CoreDraft:
    """A new cpu_core file for a CPU part no shipped description knows."""
    name: str
    data: Mapping
    provenance: Mapping[str, str]


@dataclass(frozen=True)
class Draft:
    name: str
    serial: str
    data: Mapping                       # the SoC file, in schema order
    provenance: Mapping[str, str]       # field path (as `uncertain` writes it) -> source
    new_cores: tuple[CoreDraft, ...]
    notes: tuple[str, ...]
    match: Match
    clusters: tuple[tuple[str, ClusterFacts], ...]   # (role, what the device said)
    facts: DeviceFacts = field(repr=False)

    @property
    def uncertain(self) -> tuple[str, ...]:
        return tuple(self.data.get("uncertain", ()))


@lru_cache(maxsize=None)
def _shipped(name: str) -> Optional[HardwareDescription]:
    try:
        return load(name)
    except HardwareError:
        return None


def shipped_core(name: str) -> Optional[CpuCore]:
    hw = _shipped(name)
    return hw.clusters[0].core if hw is not None and hw.kind == "cpu_core" else None


def shipped_gpu(name: str) -> Optional[GpuDescription]:
    hw = _shipped(name)
    return hw.gpu if hw is not None and hw.kind == "gpu" else None


def midr_table(socs: Sequence[HardwareDescription]) -> dict[tuple[int, int], dict[str, str]]:
    """(implementer, part) -> {core name: where the shipped files say so}."""
    table: dict[tuple[int, int], dict[str, str]] = {}
    for hw in socs:
        for cl in hw.clusters:
            core = cl.core
            if core.cpuinfo_id:
                table.setdefault(core.cpuinfo_id, {}).setdefault(core.name, f"cpu/{core.name}.yaml cpuinfo")
            for ids in cl.cpuinfo_ids:
                table.setdefault(ids, {}).setdefault(core.name, f"soc/{hw.name}.yaml clusters.{cl.role}.cpuinfo")
    return table


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------

class _Record:
    """Values with their sources, and the uncertain paths, as the draft is assembled."""

    def __init__(self):
        self.provenance: dict[str, str] = {}
        self.uncertain: list[str] = []
        self.notes: list[str] = []

    def put(self, path: str, source: str, uncertain: bool = False) -> None:
        self.provenance[path] = source
        if uncertain and path not in self.uncertain:
            self.uncertain.append(path)

    def sources(self) -> list[str]:
        out: list[str] = []
        for s in self.provenance.values():
            if s not in out:
                out.append(s)
        return out


def _kib(n_bytes: int) -> float | int:
    kib = n_bytes / 1024
    return int(kib) if kib.is_integer() else kib


def _cache_ok(entry: Optional[CacheEntry]) -> bool:
    return bool(entry and entry.size_bytes and entry.ways and entry.line_bytes)


def _roles(clusters: Sequence[ClusterFacts], matched: Optional[HardwareDescription]) -> list[str]:
    """Roles for the device clusters (fastest first): the matched description's role for the
    cluster with the same CPUs when that gives each a distinct role, else by count."""
    if len(clusters) > 4:
        raise HardwareError(f"the device has {len(clusters)} CPU clusters (cpufreq policies); the schema "
                            "names at most 4 (prime, big, mid, little): write the description by hand")
    if matched is not None:
        by_cpus = {frozenset(c.cpu_ids): c.role for c in matched.clusters}
        roles = [by_cpus.get(frozenset(c.cpu_ids)) for c in clusters]
        if None in roles and len(matched.clusters) == len(clusters):
            ranked = sorted(matched.clusters, key=lambda c: (-c.clock_ghz, -max(c.cpu_ids)))
            roles = [r.role for r in ranked]
        if None not in roles and len(set(roles)) == len(roles):
            return roles
    return list(ROLES_BY_COUNT[len(clusters)])


def _matched_cluster(matched: Optional[HardwareDescription], role: str,
                     cf: ClusterFacts) -> Optional[CpuCluster]:
    if matched is None:
        return None
    for c in matched.clusters:
        if set(c.cpu_ids) == set(cf.cpu_ids):
            return c
    return next((c for c in matched.clusters if c.role == role and c.count == cf.count), None)


def _isa_from(features: Sequence[str], hwcaps: Sequence[str]) -> str:
    caps = set(hwcaps)
    if "sve2" in features:
        return "armv9.0-a"
    if {"fp16", "dotprod", "i8mm", "bf16"} & set(features) or {"atomics", "asimdrdm"} <= caps:
        return "armv8.2-a"
    return "armv8.0-a"


def _march(isa: str, features: Sequence[str]) -> str:
    if isa == "armv9.0-a":
        return "armv9-a" + "".join(f"+{f}" for f in ("i8mm", "bf16") if f in features)
    if isa == "armv8.2-a":
        return "armv8.2-a" + "".join(f"+{f}" for f in ("fp16", "dotprod", "i8mm", "bf16") if f in features)
    return "armv8-a"


def _qemu_cpu(isa: str, features: Sequence[str]) -> str:
    if isa == "armv8.0-a":
        return "cortex-a53"
    if isa == "armv8.2-a" and not {"i8mm", "bf16"} & set(features):
        return "cortex-a76"      # qemu 7.2's Armv8.2 model: fp16 + dotprod, faults on i8mm/bf16/SVE
    return "max"


def _fit_geometry(entry: CacheEntry) -> Optional[tuple[float, int, int]]:
    """(size KiB, line, ways) the schema accepts for a sysfs cache entry, or None."""
    size_kib = entry.size_bytes / 1024
    if cache_geometry_problem(size_kib, entry.line_bytes, entry.ways) is None:
        return (_kib(entry.size_bytes), entry.line_bytes, entry.ways)
    return None


def _core_name(midr: Midr) -> str:
    impl, part = midr.implementer, midr.part
    if impl == 0x41 and part in ARM_PARTS:
        return ARM_PARTS[part]
    vendor = IMPLEMENTERS.get(impl, f"implementer-{impl:02x}")
    return f"{vendor}-part-{part:03x}"


# ---------------------------------------------------------------------------------------------
# the core of each cluster
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _CoreChoice:
    name: str
    source: str
    uncertain: bool
    new: Optional[CoreDraft] = None


def _choose_core(role: str, cf: ClusterFacts, facts: DeviceFacts, mcl: Optional[CpuCluster],
                 matched: Optional[HardwareDescription], table: Mapping, slowest: bool,
                 rec: _Record) -> _CoreChoice:
    midr = cf.midr
    if midr is None:
        # Older-kernel cpuinfo: the one MIDR printed belongs to some CPU; which is unknown.
        shared = facts.cpuinfo.shared_midr
        if mcl is not None:
            rec.notes.append(f"{role} cluster: /proc/cpuinfo is in the older-kernel format (one CPU part "
                             f"for all CPUs), so the core ({mcl.core.name}) is taken from the matched "
                             "description; check it")
            return _CoreChoice(mcl.core.name, f"{mcl.core.name} from the matched description (older-kernel "
                                              "cpuinfo names no part per CPU)", True)
        n_clusters = len(cluster_facts(facts))
        if shared is not None and shared.key is not None and n_clusters == 1:
            midr = shared
        else:
            raise HardwareError(
                f"device {facts.serial}: /proc/cpuinfo is in the older-kernel format (one block: "
                f"{shared.text if shared else 'no CPU part'} for CPUs {list(facts.cpuinfo.cpus)}) and the CPUs form "
                f"{n_clusters} clusters, so which core each cluster has cannot be read, and no shipped "
                "description matches the device's properties: write the clusters' cores by hand")
    if cf.mixed_midrs:
        rec.notes.append(f"{role} cluster: its CPUs report different parts ({', '.join(cf.mixed_midrs)}); "
                         f"the most common one ({midr.text}) is used")
    if midr.key is not None:
        if mcl is not None and midr.key in mcl.cpuinfo_ids:
            return _CoreChoice(mcl.core.name, f"{cf.midr_source} ({midr.text}) -> {mcl.core.name}", False)
        same = sorted({c.core.name for c in (matched.clusters if matched else ()) if midr.key in c.cpuinfo_ids})
        if len(same) == 1:   # the matched SoC uses this part for one core design
            return _CoreChoice(same[0], f"{cf.midr_source} ({midr.text}) -> {same[0]} (as in {matched.name})", False)
        candidates = table.get(midr.key, {})
        if len(candidates) == 1:
            name, where = next(iter(candidates.items()))
            return _CoreChoice(name, f"{cf.midr_source} ({midr.text}) -> {name} ({where})", False)
        if candidates:
            names = sorted(candidates)
            rec.notes.append(f"{role} cluster: {midr.text} is {' or '.join(names)} in different shipped SoCs; "
                             f"{names[0]} was picked: check it")
            return _CoreChoice(names[0], f"{cf.midr_source} ({midr.text}) -> one of {', '.join(names)}", True)
    if midr.key is None:
        raise HardwareError(f"device {facts.serial}: /proc/cpuinfo gives no CPU implementer/part for CPUs "
                            f"{list(cf.cpu_ids)}; cannot tell their core")
    return _new_core(cf, facts, midr, slowest, rec)


def _new_core(cf: ClusterFacts, facts: DeviceFacts, midr: Midr, slowest: bool, rec: _Record) -> _CoreChoice:
    """A cpu_core file from what the device shows, placeholders (uncertain) for the rest."""
    name = _core_name(midr)
    prov: dict[str, str] = {}
    unc: list[str] = []

    def put(path: str, src: str, uncertain: bool = False) -> None:
        prov[path] = src
        if uncertain:
            unc.append(path)

    features = ("neon",) + tuple(f for f in xfc_features(cf.hwcaps) if f != "neon")
    isa = _isa_from(features, cf.hwcaps)
    pipeline = "in_order" if slowest else "out_of_order"
    dflt = _CORE_DEFAULTS[pipeline]
    feat_src = facts.src(CPUINFO) + " Features"
    put("vendor", f"{facts.src(CPUINFO)} ({midr.text}; the ISA is Arm's)")
    put("isa", f"{feat_src} (the oldest level with these features)", True)
    put("features", feat_src)
    put("gcc_march", "derived from isa and features")
    put("qemu_cpu", "derived from isa and features (the qemu-aarch64 model with the same ones)")
    put("pipeline", f"{PLACEHOLDER}: {'the slowest cluster' if slowest else 'a faster cluster'}", True)
    for key in ("decode_width", "fma_per_cycle", "fma_latency_cycles"):
        put(key, PLACEHOLDER, True)
    for key in dflt["load_rules"]:
        put(f"load_rules.{key}", PLACEHOLDER, True)
    put("vector_bits", ARCH_SOURCE)
    put("vector_registers", ARCH_SOURCE)

    def cache(level: str, entry: Optional[CacheEntry], default: tuple) -> tuple:
        geometry = _fit_geometry(entry) if _cache_ok(entry) else None
        if geometry is not None:
            for key in ("size_kib", "line_bytes", "ways"):
                put(f"{level}.{key}", facts.src(entry.path))
            return geometry
        if _cache_ok(entry):
            rec.notes.append(f"{name}: {entry.path} reads {entry.size_bytes // 1024} KiB, {entry.ways} ways, "
                             f"{entry.line_bytes}-byte lines, which is not a power-of-two set count; a placeholder is used")
        for key in ("size_kib", "line_bytes", "ways"):
            put(f"{level}.{key}", PLACEHOLDER + (" (the kernel exposes no cache entry)" if not entry else ""), True)
        return default

    l1 = cache("l1d", cf.l1d, dflt["l1d"])
    l2 = cache("l2", cf.l2, dflt["l2"])
    if l2[0] < l1[0]:
        l2 = (max(l1[0], dflt["l2"][0]),) + dflt["l2"][1:]
        for key in ("size_kib", "line_bytes", "ways"):
            put(f"l2.{key}", PLACEHOLDER + " (the device's L2 was smaller than its L1d)", True)
    shared = cf.l2_shared_by
    if shared and shared <= cf.count and cf.l2 is not None:
        put("l2.shared_by_cores", facts.src(f"{cf.l2.path}/shared_cpu_list"))
    else:
        shared = 1
        put("l2.shared_by_cores", PLACEHOLDER, True)
    clock = cf.max_clock_ghz or 2.0
    put("typical_max_clock_ghz", cf.clock_source or PLACEHOLDER, not cf.max_clock_ghz)
    put("cpuinfo", facts.src(CPUINFO))
    data = {
        "kind": "cpu_core", "name": name, "sources": [], "uncertain": unc,
        "notes": (f"Drafted by xfc hw probe from device {facts.serial} ({midr.text}, no shipped description). "
                  "Only the features, caches and clock were read from the device; every field under "
                  "'uncertain' is a placeholder for an Armv8/v9 core of this kind: correct them from the "
                  "core's Software Optimization Guide."),
        "vendor": "arm", "isa": isa, "features": list(features), "gcc_march": _march(isa, features),
        "qemu_cpu": _qemu_cpu(isa, features), "pipeline": pipeline,
        "decode_width": dflt["decode_width"], "vector_bits": 128, "vector_registers": 32,
        "fma_per_cycle": dflt["fma_per_cycle"], "fma_latency_cycles": dflt["fma_latency_cycles"],
        "load_rules": dict(dflt["load_rules"]),
        "l1d": {"size_kib": l1[0], "line_bytes": l1[1], "ways": l1[2]},
        "l2": {"size_kib": l2[0], "line_bytes": l2[1], "ways": l2[2], "shared_by_cores": shared},
        "typical_max_clock_ghz": clock,
        "cpuinfo": {"implementer": midr.implementer, "part": midr.part},
    }
    srcs: list[str] = []
    for s in prov.values():
        if s not in srcs:
            srcs.append(s)
    data["sources"] = srcs
    note = f"{midr.text} matches no shipped core; drafted core file {name}.yaml ({len(unc)} uncertain fields)"
    if note not in rec.notes:
        rec.notes.append(note)
    return _CoreChoice(name, f"{cf.midr_source} ({midr.text}) -> new core file {name}.yaml", False,
                       CoreDraft(name, data, prov))


# ---------------------------------------------------------------------------------------------
# the SoC file
# ---------------------------------------------------------------------------------------------

def check_name(name: str) -> str:
    if not NAME_RE.match(name or ""):
        raise HardwareError(f"draft name '{name}': a description name is lowercase letters, digits, '.' and "
                            "'-' (and equals its file name without .yaml)")
    return name


def default_name(facts: DeviceFacts, match: Match) -> str:
    base = match.name or facts.prop("ro.soc.model") or facts.prop("ro.board.platform") or "device"
    slug = re.sub(r"[^a-z0-9.-]+", "-", base.lower()).strip("-.") or "device"
    return f"{slug}-probed"


def draft_description(facts: DeviceFacts, name: Optional[str] = None,
                      socs: Optional[Sequence[HardwareDescription]] = None) -> Draft:
    """The draft for this device (see the module docstring); HardwareError when none can be made."""
    socs = tuple(shipped_socs() if socs is None else socs)
    match = match_identity(facts.identity(), socs)
    name = check_name(name or default_name(facts, match))
    matched = next((hw for hw in socs if hw.name == match.name), None)
    msrc = f"shipped soc/{matched.name}.yaml (matched by {match.how})" if matched else ""
    rec = _Record()
    clusters = cluster_facts(facts)
    roles = _roles(clusters, matched)
    table = midr_table(socs)
    cluster_dicts, new_cores = [], []
    l2_sizes: list[float] = []
    for i, (role, cf) in enumerate(zip(roles, clusters)):
        p = f"clusters.{role}"
        mcl = _matched_cluster(matched, role, cf)
        slowest = len(clusters) > 1 and i == len(clusters) - 1
        choice = _choose_core(role, cf, facts, mcl, matched, table, slowest, rec)
        if choice.new is not None and choice.new.name not in {c.name for c in new_cores}:
            new_cores.append(choice.new)
        core = shipped_core(choice.name) if choice.new is None else None
        rec.put(f"{p}.role", cf.cpus_source)
        rec.put(f"{p}.core", choice.source, choice.uncertain)
        rec.put(f"{p}.count", cf.cpus_source)
        if cf.max_clock_ghz:
            clock = cf.max_clock_ghz
            rec.put(f"{p}.max_clock_ghz", cf.clock_source)
        elif mcl is not None:
            clock = mcl.clock_ghz
            rec.put(f"{p}.max_clock_ghz", f"{msrc} (no cpufreq on the device)", True)
        else:
            clock = core.typical_max_clock_ghz if core else choice.new.data["typical_max_clock_ghz"]
            rec.put(f"{p}.max_clock_ghz", "the core's typical clock (no cpufreq on the device)", True)
        rec.put(f"{p}.cpu_ids", cf.cpus_source)
        d = {"role": role, "core": choice.name, "count": cf.count, "max_clock_ghz": clock,
             "cpu_ids": list(cf.cpu_ids)}
        if cf.midr is not None and cf.midr.key is not None:
            d["cpuinfo"] = [{"implementer": cf.midr.implementer, "part": cf.midr.part}]
            rec.put(f"{p}.cpuinfo", cf.midr_source)
        if core is not None:
            l2 = _cluster_l2(p, role, cf, core, mcl, msrc, rec, facts)
            if l2 is not None:
                d["l2_kib"] = l2
            l2_sizes.append(l2 if l2 is not None else core.l2.size_bytes / 1024)
            _feature_note(role, cf, core, rec)
        else:
            l2_sizes.append(choice.new.data["l2"]["size_kib"])
        cluster_dicts.append(d)

    # Shared caches: the DSU L3 shows as a level-3 cache entry; the SLC never does.
    entry = l3_entry(facts)
    if entry is not None and entry.size_bytes / 1024 >= max(l2_sizes + [128]):
        l3 = _kib(entry.size_bytes)
        rec.put("l3_kib", facts.src(f"{entry.path}/size"))
    elif matched is not None:
        l3 = _kib(matched.l3_bytes) if matched.l3_bytes else None
        rec.put("l3_kib", f"{msrc} (the kernel exposes no level-3 cache entry)", True)
    else:
        l3 = None
        rec.put("l3_kib", "none exposed by the device (cache/index*/level 3)", True)
    if l3 is not None and l3 < max(l2_sizes):
        rec.notes.append(f"l3_kib {l3} KiB is smaller than a cluster's L2; set to null")
        l3 = None
    slc = _kib(matched.slc_bytes) if matched is not None and matched.slc_bytes else None
    rec.put("slc_kib", (f"{msrc}" if matched else "unknown") + " (no phone exposes its system-level cache)", True)

    vendor = _vendor(facts, matched, rec)
    gpu = _gpu_section(facts, matched, msrc, vendor, rec)
    if gpu is not None and vendor == "unknown" and gpu["family"] == "adreno":
        vendor = "qualcomm"
        rec.put("vendor", f"{rec.provenance['gpu.ref']} (Adreno GPUs are only in Qualcomm SoCs)")
    if gpu is not None and (vendor == "qualcomm") != (gpu["family"] == "adreno"):
        rec.notes.append(f"GPU {gpu['ref']} does not fit a {vendor} SoC; gpu left null")
        gpu = None
    gpu_d = None
    if gpu is not None:
        gpu_d = {"ref": gpu["ref"], "compute_units": gpu["compute_units"], "clock_mhz": gpu["clock_mhz"]}
    else:
        rec.put("gpu", "no GPU model could be read (OpenCL query not run; see notes)", True)

    if matched is not None and matched.memory is not None:
        mem = {"type": matched.memory.type, "peak_bandwidth_gbps": matched.memory.peak_bandwidth_gbps,
               "channels": matched.memory.channels}
        msrc_mem = f"{msrc} (DRAM type and bandwidth are not exposed)"
    else:
        mem, msrc_mem = dict(_DEFAULT_MEMORY), PLACEHOLDER + " (an LPDDR4X-4266 x64 phone)"
    for key in mem:
        rec.put(f"memory.{key}", msrc_mem, True)
    if facts.mem_total_bytes:
        rec.notes.append(f"memory size: MemTotal {facts.mem_total_bytes / 2**30:.2f} GiB "
                         f"({facts.src(MEMINFO)})")

    marketing = matched.marketing_name if matched else (
        facts.prop("ro.soc.model") or facts.prop("ro.board.platform") or "unknown SoC") + " (probed)"
    rec.put("marketing_name", msrc or facts.src("getprop ro.soc.model"), matched is None)
    android = _android(facts, rec)

    android_version = facts.prop("ro.build.version.release")
    notes = [f"Drafted by xfc hw probe from device {facts.serial} "
             f"({facts.prop('ro.product.model') or 'unknown model'}"
             + (f", Android {android_version} (SDK {facts.prop('ro.build.version.sdk') or '?'})" if android_version else "")
             + f", ABIs {facts.prop('ro.product.cpu.abilist') or facts.prop('ro.product.cpu.abi') or 'unknown'}); "
             f"matched shipped description: {match.describe()}."] + rec.notes
    if facts.vendor_opencl:
        notes.append(f"{facts.vendor_opencl} exists; the OpenCL device query needs an NDK-built program "
                     "and was not run: GPU figures come from the driver's sysfs files or the matched description")
    data: dict = {
        "kind": "soc", "name": name, "sources": rec.sources(), "uncertain": list(rec.uncertain),
        "notes": "\n".join(notes), "vendor": vendor, "marketing_name": marketing,
        "clusters": cluster_dicts, "l3_kib": l3, "slc_kib": slc, "gpu": gpu_d, "memory": mem,
    }
    if android is not None:
        data["android"] = android
    return Draft(name=name, serial=facts.serial, data=data, provenance=dict(rec.provenance),
                 new_cores=tuple(new_cores), notes=tuple(rec.notes), match=match,
                 clusters=tuple(zip(roles, clusters)), facts=facts)


def _cluster_l2(p: str, role: str, cf: ClusterFacts, core: CpuCore, mcl: Optional[CpuCluster],
                msrc: str, rec: _Record, facts: DeviceFacts) -> Optional[float]:
    """The cluster's l2_kib: the device's when the core's L2 geometry allows it."""
    entry = cf.l2
    if _cache_ok(entry):
        kib = _kib(entry.size_bytes)
        problem = cache_geometry_problem(kib, core.l2.line_bytes, core.l2.ways)
        if problem is None and kib * 1024 >= core.l1d.size_bytes:
            rec.put(f"{p}.l2_kib", facts.src(f"{entry.path}/size"))
            return kib
        rec.notes.append(f"{role} cluster: the device's L2 ({entry.size_bytes // 1024} KiB, {entry.ways} ways, "
                         f"{entry.line_bytes}-byte lines) does not fit the {core.name} L2 geometry; check it")
    if mcl is not None:
        rec.put(f"{p}.l2_kib", f"{msrc} (the kernel exposes no usable L2 entry)", True)
        return _kib(mcl.l2.size_bytes)
    return None


def _feature_note(role: str, cf: ClusterFacts, core: CpuCore, rec: _Record) -> None:
    if not cf.hwcaps:
        return
    have = set(xfc_features(cf.hwcaps))
    missing = [f for f in core.features if f not in have]
    extra = [f for f in have if f not in core.features]
    if missing:
        rec.notes.append(f"{role} cluster: the device's Features line lacks {', '.join(missing)}, which "
                         f"{core.name} has (an older kernel?)")
    if extra:
        rec.notes.append(f"{role} cluster: the device reports {', '.join(extra)}, which the shipped "
                         f"{core.name} description does not list")


def _vendor(facts: DeviceFacts, matched: Optional[HardwareDescription], rec: _Record) -> str:
    maker = facts.prop("ro.soc.manufacturer").lower()
    if maker in _VENDORS:
        rec.put("vendor", facts.src("getprop ro.soc.manufacturer"))
        return _VENDORS[maker]
    if matched is not None:
        # the matched description's vendor (its SoC was recognised by the device's properties)
        rec.put("vendor", f"shipped soc/{matched.name}.yaml")
        return _vendor_of(matched)
    rec.put("vendor", PLACEHOLDER, True)
    return "unknown"


def _vendor_of(hw: HardwareDescription) -> str:
    """The `vendor` field of a shipped SoC file (HardwareDescription does not carry it)."""
    try:
        return str(read_yaml(SHIPPED_ROOT / "soc" / f"{hw.name}.yaml").get("vendor", "unknown"))
    except (HardwareError, OSError):
        return "unknown"


def _gpu_section(facts: DeviceFacts, matched: Optional[HardwareDescription], msrc: str, vendor: str,
                 rec: _Record) -> Optional[dict]:
    g = facts.gpu
    mg = matched.gpu if matched is not None else None
    if g is not None and g.model:
        desc = shipped_gpu(g.model)
        if desc is None:
            rec.notes.append(f"GPU {g.raw!r} ({g.source}) has no shipped description ({g.model}.yaml): "
                             "gpu left null; write one to use --target gpu")
            return None
        rec.put("gpu.ref", f"{g.source} ({g.raw})")
        if g.compute_units:
            cu = g.compute_units
            rec.put("gpu.compute_units", g.source)
        elif desc.family == "adreno":
            cu = desc.compute_units
            rec.put("gpu.compute_units", f"shipped gpu/{desc.name}.yaml (an Adreno model has one configuration)")
        elif mg is not None and mg.name == desc.name:
            cu = mg.compute_units
            rec.put("gpu.compute_units", msrc, True)
        else:
            cu = desc.compute_units
            rec.put("gpu.compute_units", f"shipped gpu/{desc.name}.yaml default", True)
        if g.clock_mhz:
            clock = g.clock_mhz
            rec.put("gpu.clock_mhz", g.clock_source)
        elif mg is not None and mg.name == desc.name:
            clock = mg.max_clock_mhz
            rec.put("gpu.clock_mhz", f"{msrc} (the driver exposes no clock)", True)
        else:
            clock = desc.max_clock_mhz
            rec.put("gpu.clock_mhz", f"shipped gpu/{desc.name}.yaml default", True)
        return {"ref": desc.name, "family": desc.family, "compute_units": cu, "clock_mhz": clock}
    if mg is not None and (g is None or g.family in ("", mg.family)):
        rec.put("gpu.ref", f"{msrc}" + (f"; {g.source} says {g.family}" if g else "") +
                " (the GPU model is not exposed)", True)
        rec.put("gpu.compute_units", msrc, True)
        rec.put("gpu.clock_mhz", msrc, True)
        return {"ref": mg.name, "family": mg.family, "compute_units": mg.compute_units,
                "clock_mhz": mg.max_clock_mhz}
    rec.notes.append("the GPU model could not be read (no kgsl or Mali gpuinfo file" +
                     (f"; {g.source} says {g.family}" if g else "") + "): gpu left null")
    return None


def _android(facts: DeviceFacts, rec: _Record) -> Optional[dict]:
    model = facts.prop("ro.soc.model")
    platform_key = next((k for k in ("ro.board.platform", "ro.hardware", "ro.chipname") if facts.prop(k)), None)
    if not model and platform_key is None:
        return None
    platform = facts.prop(platform_key) if platform_key else model
    out = {"soc_model": [model or platform], "board_platform": [platform]}
    rec.put("android.soc_model", facts.src("getprop ro.soc.model" if model else f"getprop {platform_key}"))
    rec.put("android.board_platform", facts.src(f"getprop {platform_key or 'ro.soc.model'}"))
    maker = facts.prop("ro.soc.manufacturer")
    if maker:
        out["soc_manufacturer"] = maker
        rec.put("android.soc_manufacturer", facts.src("getprop ro.soc.manufacturer"))
    return out


__all__ = ["Draft", "CoreDraft", "draft_description", "default_name", "check_name", "midr_table"]
