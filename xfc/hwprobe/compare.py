"""Where a shipped description disagrees with a device. Pure.

Only what the device shows is compared: CPU count, clusters (CPUs, clocks, CPU parts, ISA
features, cache sizes/ways/lines/sharing where the kernel exposes cacheinfo), the L3, the
Android ids and the GPU model, compute units and clock where the driver names them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from xfc.errors import HardwareError
from xfc.hardware import CpuCluster, HardwareDescription

from .draft import Draft
from .facts import CPUINFO, ClusterFacts, l3_entry, xfc_features

CLOCK_TOLERANCE = 0.005      # 0.5%: a phone's 2841.6 MHz is the 2.84 GHz of the data sheets


@dataclass(frozen=True)
class Difference:
    field: str           # path in the shipped description, e.g. clusters.prime.max_clock_ghz
    shipped: str
    device: str
    source: str

    def line(self) -> str:
        return f"{self.field}: shipped {self.shipped}, device {self.device}  ({self.source})"


@dataclass(frozen=True)
class Comparison:
    name: str
    checked: tuple[str, ...]             # fields compared
    differences: tuple[Difference, ...]

    @property
    def agrees(self) -> bool:
        return not self.differences

    def to_json(self) -> dict:
        return {"name": self.name, "checked": list(self.checked), "agrees": self.agrees,
                "differences": [d.__dict__ for d in self.differences]}


def _kib(n: Optional[int]) -> str:
    return "none" if n is None else f"{n / 1024:g} KiB"


def _pair(device: tuple[tuple[str, ClusterFacts], ...], hw: HardwareDescription):
    """(device cluster, shipped cluster or None), shipped clusters left over."""
    left = list(hw.clusters)
    pairs = []
    for role, cf in device:
        same = next((c for c in left if set(c.cpu_ids) == set(cf.cpu_ids)), None)
        pairs.append([role, cf, same])
        if same is not None:
            left.remove(same)
    for p in pairs:   # the rest by rank (fastest first), then by role
        if p[2] is None and left:
            ranked = sorted(left, key=lambda c: (-c.clock_ghz, -max(c.cpu_ids)))
            by_role = next((c for c in left if c.role == p[0]), None)
            p[2] = by_role if by_role is not None and by_role.count == p[1].count else ranked[0]
            left.remove(p[2])
    return pairs, left


def compare(draft: Draft, hw: HardwareDescription) -> Comparison:
    if hw.kind != "soc":
        raise HardwareError(f"--compare {hw.name}: a {hw.kind.replace('_', ' ')} description; compare against a "
                            "SoC description (see 'xfc hw list')")
    facts = draft.facts
    checked: list[str] = []
    diffs: list[Difference] = []

    def check(path: str, shipped, device, src: str, same: Optional[bool] = None) -> None:
        checked.append(path)
        if not (same if same is not None else shipped == device):
            diffs.append(Difference(path, str(shipped), str(device), src))

    n_device = sum(cf.count for _, cf in draft.clusters)
    check("cpus", sum(c.count for c in hw.clusters), n_device, facts.src(CPUINFO))
    check("clusters", len(hw.clusters), len(draft.clusters), draft.clusters[0][1].cpus_source)
    pairs, left = _pair(draft.clusters, hw)
    for role, cf, cl in pairs:
        if cl is None:
            diffs.append(Difference(f"clusters ({role})", "no such cluster",
                                    f"CPUs {list(cf.cpu_ids)} at {cf.max_clock_ghz} GHz", cf.cpus_source))
            continue
        _compare_cluster(f"clusters.{cl.role}", cf, cl, check, facts.src)
    for cl in left:
        diffs.append(Difference(f"clusters.{cl.role}", f"CPUs {list(cl.cpu_ids)} ({cl.core.name})",
                                "no such cluster", draft.clusters[0][1].cpus_source))
    l3 = l3_entry(facts)
    if l3 is not None:
        check("l3_kib", _kib(hw.l3_bytes), _kib(l3.size_bytes), facts.src(f"{l3.path}/size"))
    if hw.android is not None:
        model = facts.prop("ro.soc.model")
        if model:
            check("android.soc_model", list(hw.android.soc_models), model, facts.src("getprop ro.soc.model"),
                  model.lower() in (m.lower() for m in hw.android.soc_models))
        for key in ("ro.board.platform", "ro.hardware"):
            value = facts.prop(key)
            if value and key == "ro.board.platform":
                check("android.board_platform", list(hw.android.board_platforms), value, facts.src(f"getprop {key}"),
                      value.lower() in (p.lower() for p in hw.android.board_platforms))
    g = facts.gpu
    if g is not None and g.model:
        check("gpu.ref", hw.gpu.name if hw.gpu else "none", g.model, g.source)
        if hw.gpu is not None and hw.gpu.name == g.model:
            if g.compute_units:
                check("gpu.compute_units", hw.gpu.compute_units, g.compute_units, g.source)
            if g.clock_mhz:
                check("gpu.clock_mhz", f"{hw.gpu.max_clock_mhz:g} MHz", f"{g.clock_mhz:g} MHz", g.clock_source,
                      abs(hw.gpu.max_clock_mhz - g.clock_mhz) <= CLOCK_TOLERANCE * hw.gpu.max_clock_mhz)
    return Comparison(hw.name, tuple(checked), tuple(diffs))


def _compare_cluster(p: str, cf: ClusterFacts, cl: CpuCluster, check, src) -> None:
    core = cl.core
    check(f"{p}.cpu_ids", list(cl.cpu_ids), list(cf.cpu_ids), cf.cpus_source,
          set(cl.cpu_ids) == set(cf.cpu_ids))
    check(f"{p}.count", cl.count, cf.count, cf.cpus_source)
    if cf.max_clock_ghz:
        check(f"{p}.max_clock_ghz", f"{cl.clock_ghz:g} GHz", f"{cf.max_clock_ghz:g} GHz", cf.clock_source,
              abs(cl.clock_ghz - cf.max_clock_ghz) <= CLOCK_TOLERANCE * cl.clock_ghz)
    if cf.midr is not None and cf.midr.key is not None:
        ids = ", ".join(f"{i:#04x}/{q:#05x}" for i, q in cl.cpuinfo_ids) or "none"
        check(f"{p}.core", f"{core.name} (CPU ids {ids})", f"{cf.midr.implementer:#04x}/{cf.midr.part:#05x}",
              cf.midr_source, cf.midr.key in cl.cpuinfo_ids)
    if cf.hwcaps:
        have = set(xfc_features(cf.hwcaps))
        check(f"{p}.core features", ",".join(sorted(core.features)), ",".join(sorted(have)) + " (from hwcaps)",
              cf.midr_source + " Features", have == set(core.features))
    # l1d is per core; the L2 size is the cluster's (l2_kib), its geometry the core's.
    for level, size_key, described_bytes, found in (("l1d", "core l1d.size_kib", core.l1d.size_bytes, cf.l1d),
                                             ("l2", "l2_kib", cl.l2.size_bytes, cf.l2)):
        if found is None or not found.size_bytes:
            continue
        described = getattr(core, level)
        check(f"{p}.{size_key}", _kib(described_bytes), _kib(found.size_bytes), src(found.path))
        if found.ways:
            check(f"{p}.core {level}.ways", described.ways, found.ways, src(found.path))
        if found.line_bytes:
            check(f"{p}.core {level}.line_bytes", described.line_bytes, found.line_bytes, src(found.path))
        if level == "l2" and cf.l2_shared_by:
            check(f"{p}.core l2.shared_by_cores", core.l2.shared_by_cores, cf.l2_shared_by, src(found.path))
