"""Who is this device? Android properties and /proc/cpuinfo -> the shipped SoC description.

Pure functions over data; reading the device is AdbRunner.read_identity (adb.py). The facts
(ro.soc.model, ro.board.platform, CPU implementer/part per cluster) live in the hardware
descriptions (hardware_descriptions/soc/*.yaml `android:`, cpu/*.yaml `cpuinfo:`), nowhere else.

    identity = identity_from(serial, props, cpuinfo_text)
    match = match_identity(identity)            # Match(name='snapdragon-865', how='ro.soc.model', ...)
    notes = check_description(identity, hw, cluster)   # HardwareError (exit 2) if it cannot run
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Mapping, Optional, Sequence

from ..errors import HardwareError
from .cpuinfo import Midr
from .cpuinfo import parse_cpuinfo as read_cpuinfo
from .load import SHIPPED_ROOT, validate_file
from .model import CpuCluster, CpuCore, HardwareDescription

# Linux arm64 hwcap names as /proc/cpuinfo prints them, in the kernel's order (for a faithful
# Features line on the virtual device).
HWCAP_ORDER = ("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt "
               "fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs "
               "sb paca pacg dcpodp sve2 sveaes svepmull svebitperm svesha3 svesm4 flagm2 frint "
               "svei8mm svebf16 i8mm bf16 bti").split()

# xfc feature name -> the hwcaps a CPU with it reports
FEATURE_HWCAPS = {"neon": ("fp", "asimd"), "fp16": ("fphp", "asimdhp"), "dotprod": ("asimddp",),
                  "i8mm": ("i8mm",), "bf16": ("bf16",), "sve2": ("sve", "sve2")}
# -march extension -> the hwcaps code built with it may need
MARCH_EXT_HWCAPS = {"fp16": ("fphp", "asimdhp"), "dotprod": ("asimddp",), "i8mm": ("i8mm",),
                    "bf16": ("bf16",), "sve": ("sve",), "sve2": ("sve", "sve2"), "lse": ("atomics",),
                    "rdma": ("asimdrdm",), "crc": ("crc32",)}
# Instructions the kernel must switch on for EL0: if the Features line lacks them, they trap.
KERNEL_GATED = frozenset({"sve", "sve2"})

# Extra hwcaps a core of each ISA level reports (beyond its xfc features), for the virtual device.
_ISA_HWCAPS = {
    "armv8.0-a": "fp asimd evtstrm aes pmull sha1 sha2 crc32 cpuid",
    "armv8.2-a": "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics cpuid asimdrdm lrcpc dcpop",
    "armv9.0-a": ("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics cpuid asimdrdm jscvt fcma lrcpc "
                  "dcpop sha3 sm3 sm4 sha512 asimdfhm dit uscat ilrcpc flagm ssbs sb paca pacg dcpodp "
                  "flagm2 frint bti"),
}


@dataclass(frozen=True)
class CpuId:
    """One `processor` block of /proc/cpuinfo."""

    cpu: int
    implementer: Optional[int]
    part: Optional[int]
    features: tuple[str, ...]

    @property
    def id_text(self) -> str:
        if self.implementer is None or self.part is None:
            return "?"
        return f"{self.implementer:#04x}/{self.part:#05x}"


@dataclass(frozen=True)
class DeviceIdentity:
    """What a device says it is, read before anything is built."""

    serial: str
    model: str
    soc_model: str          # ro.soc.model
    soc_manufacturer: str   # ro.soc.manufacturer
    board_platform: str     # ro.board.platform
    hardware: str           # ro.hardware
    chipname: str           # ro.chipname (Samsung)
    abi: str                # ro.product.cpu.abi
    cpus: tuple[CpuId, ...]
    virtual: bool = False

    def features(self, cpu_ids: Optional[Iterable[int]] = None) -> frozenset[str]:
        """Hwcaps every one of these CPUs (default: all) reports."""
        want = None if cpu_ids is None else set(cpu_ids)
        sets = [frozenset(c.features) for c in self.cpus if want is None or c.cpu in want]
        return frozenset.intersection(*sets) if sets else frozenset()

    def cpu_summary(self) -> str:
        """e.g. '8 CPUs: 4x 0x51/0x805, 4x 0x41/0xd0d'."""
        if not self.cpus:
            return "CPUs unknown"
        counts = Counter(c.id_text for c in self.cpus)
        return f"{len(self.cpus)} CPUs: " + ", ".join(f"{n}x {k}" for k, n in counts.items())

    def describe(self) -> str:
        """One line of what was read, for error messages."""
        return (f"ro.soc.model '{self.soc_model}', ro.board.platform '{self.board_platform}', "
                f"ro.hardware '{self.hardware}', ABI '{self.abi}', {self.cpu_summary()}")


def parse_cpuinfo(text: str) -> tuple[CpuId, ...]:
    """Per-CPU implementer, part and Features from arm64 /proc/cpuinfo text.

    Older kernels print one MIDR block for whichever CPU read the file: no CPU gets a part then
    (nobody can tell which it describes), and their Features line applies to every CPU.
    """
    info = read_cpuinfo(text)
    none = Midr(None, None)
    return tuple(CpuId(cpu=c, implementer=info.midrs.get(c, none).implementer,
                       part=info.midrs.get(c, none).part, features=info.features.get(c, ()))
                 for c in info.cpus)


def parse_getprop(text: str) -> dict[str, str]:
    """`getprop` output ('[key]: [value]' lines) as a dict."""
    props = {}
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("[") or "]: [" not in line:
            continue
        key, _, value = line.partition("]: [")
        props[key[1:]] = value[:-1] if value.endswith("]") else value
    return props


def identity_from(serial: str, props: Mapping[str, str], cpuinfo_text: str) -> DeviceIdentity:
    g = lambda k: (props.get(k) or "").strip()  # noqa: E731
    return DeviceIdentity(serial=serial, model=g("ro.product.model"), soc_model=g("ro.soc.model"),
                          soc_manufacturer=g("ro.soc.manufacturer"),
                          board_platform=g("ro.board.platform"), hardware=g("ro.hardware"),
                          chipname=g("ro.chipname"), abi=g("ro.product.cpu.abi"),
                          cpus=parse_cpuinfo(cpuinfo_text),
                          virtual=g("ro.xfc.virtual_device") == "1")


# ---------------------------------------------------------------------------------------------
# ISA features: what a description needs, what a core reports.
# ---------------------------------------------------------------------------------------------

_MARCH_RE = re.compile(r"^armv(\d+)(?:\.(\d+))?-a$")


def march_hwcaps(march: str) -> frozenset[str]:
    """Hwcaps code compiled with this -march may use ('' or an x86 march: none)."""
    base, *exts = (march or "").strip().lower().split("+")
    m = _MARCH_RE.match(base)
    if not m:
        return frozenset()
    major, minor = int(m.group(1)), int(m.group(2) or 0)
    caps = {"fp", "asimd"}
    if (major, minor) >= (8, 1):
        caps |= {"atomics"}           # LSE atomics: gcc uses them for OpenMP reductions
    if major >= 9:
        caps |= {"sve", "sve2"}       # armv9-a implies SVE2 in gcc
    for ext in exts:
        if ext.startswith("no"):
            caps -= set(MARCH_EXT_HWCAPS.get(ext[2:], ()))
        else:
            caps |= set(MARCH_EXT_HWCAPS.get(ext, ()))
    return frozenset(caps)


def required_hwcaps(core: CpuCore) -> frozenset[str]:
    """Hwcaps a device CPU must report to run a kernel built for this core."""
    caps = set(march_hwcaps(core.gcc_march))
    for feature in core.features:
        caps |= set(FEATURE_HWCAPS.get(feature, ()))
    return frozenset(caps)


def core_hwcaps(core: CpuCore) -> tuple[str, ...]:
    """The Features line a CPU of this core reports (in kernel order), from its description."""
    caps = set(_ISA_HWCAPS.get(core.isa, "fp asimd").split())
    for feature in core.features:
        caps |= set(FEATURE_HWCAPS.get(feature, ()))
    if "sve2" in caps:
        caps |= {"svei8mm"} if "i8mm" in caps else set()
        caps |= {"svebf16"} if "bf16" in caps else set()
    return tuple(c for c in HWCAP_ORDER if c in caps)


def _ordered(caps: Iterable[str]) -> list[str]:
    caps = set(caps)
    return [c for c in HWCAP_ORDER if c in caps] + sorted(caps - set(HWCAP_ORDER))


# ---------------------------------------------------------------------------------------------
# Matching a device to a shipped description.
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Match:
    name: Optional[str]                 # the description, or None
    how: str = ""                       # 'ro.soc.model', 'ro.board.platform', ... or 'cpuinfo'
    value: str = ""                     # the property value (or CPU summary) that matched
    candidates: tuple[str, ...] = ()    # several descriptions fit the CPUs: ambiguous

    def describe(self) -> str:
        if self.name:
            return f"{self.name} (by {self.how} {self.value})"
        if self.candidates:
            return f"one of {', '.join(self.candidates)} (by its CPUs)"
        return "no shipped description"


@lru_cache(maxsize=1)
def shipped_socs() -> tuple[HardwareDescription, ...]:
    """Every shipped SoC description (hardware_descriptions/soc/*.yaml), in name order."""
    return tuple(validate_file(p) for p in sorted((SHIPPED_ROOT / "soc").glob("*.yaml")))


def soc_description(name: str) -> HardwareDescription:
    for hw in shipped_socs():
        if hw.name == name:
            return hw
    known = ", ".join(hw.name for hw in shipped_socs())
    raise HardwareError(f"no shipped SoC description '{name}' (known: {known})")


def cpus_fit(identity: DeviceIdentity, hw: HardwareDescription) -> bool:
    """The device's CPUs are exactly this description's clusters, by CPU implementer/part.

    Counted per set of accepted ids, not by CPU number: the cpu_ids in descriptions follow a
    convention, the ids come from the silicon."""
    if not identity.cpus or not hw.clusters or any(not c.cpuinfo_ids for c in hw.clusters):
        return False
    if sum(c.count for c in hw.clusters) != len(identity.cpus):
        return False
    want: Counter = Counter()
    for c in hw.clusters:
        want[frozenset(c.cpuinfo_ids)] += c.count
    have: Counter = Counter()
    for cpu in identity.cpus:
        key = (cpu.implementer, cpu.part)
        groups = [g for g in want if key in g]
        if len(groups) != 1:
            return False
        have[groups[0]] += 1
    return have == want


def match_identity(identity: DeviceIdentity,
                   socs: Optional[Sequence[HardwareDescription]] = None) -> Match:
    """Properties first (ro.soc.model, then platform names), then CPU implementer/part."""
    socs = shipped_socs() if socs is None else tuple(socs)
    model = identity.soc_model.lower()
    if model:
        for hw in socs:
            if hw.android and model in (m.lower() for m in hw.android.soc_models):
                return Match(hw.name, "ro.soc.model", identity.soc_model)
    for prop, value in (("ro.board.platform", identity.board_platform),
                        ("ro.hardware", identity.hardware), ("ro.chipname", identity.chipname)):
        if not value:
            continue
        for hw in socs:
            if hw.android and value.lower() in (p.lower() for p in hw.android.board_platforms):
                return Match(hw.name, prop, value)
    fits = tuple(hw.name for hw in socs if cpus_fit(identity, hw))
    if len(fits) == 1:
        return Match(fits[0], "cpuinfo", identity.cpu_summary())
    return Match(None, candidates=fits)


def _cluster_text(hw: HardwareDescription, cluster: CpuCluster) -> str:
    return f"{hw.name} ({cluster.role} cluster: {cluster.core.name}, -march={cluster.core.gcc_march})"


def check_description(identity: DeviceIdentity, hw: HardwareDescription, cluster: CpuCluster,
                      match: Optional[Match] = None) -> tuple[str, ...]:
    """Raise HardwareError (exit 2) when a kernel for `cluster` of `hw` cannot run on the device;
    otherwise return notes worth printing (e.g. 'the device is a different SoC')."""
    notes: list[str] = []
    match = match if match is not None else match_identity(identity)
    if not identity.cpus:
        return ("could not read per-CPU Features from /proc/cpuinfo: ISA features not checked",)
    present = {c.cpu for c in identity.cpus}
    absent = [c for c in cluster.cpu_ids if c not in present]
    if absent and hw.kind == "soc":
        raise HardwareError(
            f"--hw {_cluster_text(hw, cluster)} pins to CPUs {list(cluster.cpu_ids)}, but device "
            f"{identity.serial} has CPUs {sorted(present)}; {_suggest(match, hw)}")
    checked = [c for c in cluster.cpu_ids if c in present] if hw.kind == "soc" else sorted(present)
    have = identity.features(checked)
    missing = required_hwcaps(cluster.core) - have
    if missing:
        ids = {(c.implementer, c.part) for c in identity.cpus if c.cpu in set(checked)}
        own = bool(cluster.cpuinfo_ids) and ids <= set(cluster.cpuinfo_ids)
        if own and not (missing & KERNEL_GATED):
            # The silicon is the described core; an old kernel just does not list newer hwcaps.
            notes.append(f"device CPUs {checked} do not list {' '.join(_ordered(missing))} in "
                         f"/proc/cpuinfo, but they are {cluster.core.name} cores, which have them "
                         "(an older kernel?)")
        else:
            raise HardwareError(
                f"--hw {_cluster_text(hw, cluster)} needs CPU features that device "
                f"{identity.serial} lacks: {' '.join(_ordered(missing))} (its CPUs {checked} report: "
                f"{' '.join(_ordered(have)) or 'none'}); {_suggest(match, hw)}")
    if match.name and match.name != hw.name and hw.kind == "soc":
        notes.append(f"device {identity.serial} looks like {match.describe()}; the kernel is tuned "
                     f"for {hw.name}")
    return tuple(notes)


def _suggest(match: Match, hw: HardwareDescription) -> str:
    if match.name and match.name != hw.name:
        return f"the device matches {match.describe()}: use --hw {match.name}, or omit --hw"
    if match.candidates:
        return f"the device fits {', '.join(match.candidates)}: pass one of them with --hw"
    return "no shipped description matches the device: write one (see hardware_descriptions/SCHEMA.md)"


def pick_description(identity: DeviceIdentity, match: Optional[Match] = None) -> tuple[HardwareDescription, Match]:
    """The shipped description for a device when no --hw was given, or HardwareError (exit 2)."""
    match = match if match is not None else match_identity(identity)
    if match.name:
        return soc_description(match.name), match
    if match.candidates:
        raise HardwareError(f"device {identity.serial} could be {', '.join(match.candidates)} "
                            f"(read {identity.describe()}): pass --hw NAME")
    raise HardwareError(f"device {identity.serial} matches no shipped hardware description "
                        f"(read {identity.describe()}): pass --hw NAME or FILE (see 'xfc hw list')")


def cpu_features_text(identity: Optional[DeviceIdentity], cpu_ids: Optional[Sequence[int]]) -> str:
    """'device CPU features: fp asimd ...' for the SIGILL message ('' when unknown)."""
    if identity is None or not identity.cpus:
        return ""
    feats = identity.features(cpu_ids if cpu_ids else None)
    return "device CPU features: " + (" ".join(_ordered(feats)) or "none")
