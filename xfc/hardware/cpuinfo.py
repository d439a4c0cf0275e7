"""arm64 /proc/cpuinfo text -> per-CPU MIDR and Features. A pure function; no device.

Two formats exist: current arm64 kernels print a `processor` block per CPU with its own MIDR
(implementer, part, variant, revision) and Features; older kernels list the CPUs and print ONE
block of MIDR and Features, which describes whichever CPU read the file. Both the device identity
check (xfc.hardware.identity) and the hardware probe (xfc.hwprobe) read it through here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional


@dataclass(frozen=True)
class Midr:
    """The MIDR fields /proc/cpuinfo prints for one CPU (None: the line was missing)."""
    implementer: Optional[int]
    part: Optional[int]
    variant: Optional[int] = None
    revision: Optional[int] = None

    @property
    def key(self) -> Optional[tuple[int, int]]:
        if self.implementer is None or self.part is None:
            return None
        return (self.implementer, self.part)

    @property
    def text(self) -> str:
        if self.key is None:
            return "unknown CPU part"
        return f"CPU implementer {self.implementer:#04x} part {self.part:#05x}"


@dataclass(frozen=True)
class Cpuinfo:
    """What /proc/cpuinfo says.

    format 'per-cpu': every `processor` block carries its own MIDR and Features (arm64 kernels
    since about 3.19). format 'older-kernel': the CPUs are listed, but one block of MIDR and
    Features follows (or precedes) them; it describes whichever CPU read the file, so it names
    the core of one CPU only, and nobody can tell which."""
    format: str
    cpus: tuple[int, ...]                      # processor numbers listed
    midrs: Mapping[int, Midr]                  # per-cpu format: CPU -> MIDR
    shared_midr: Optional[Midr]                # older-kernel format: the one MIDR block
    features: Mapping[int, tuple[str, ...]]    # CPU -> hwcaps (older format: the same for all)
    hardware: str = ""

    def midr(self, cpu: int) -> Optional[Midr]:
        return self.midrs.get(cpu)


def parse_int(text: str) -> Optional[int]:
    """A decimal or 0x-prefixed integer; None when it is neither."""
    try:
        return int(text.strip(), 0)
    except ValueError:
        return None


_MIDR_KEYS = {"cpu implementer": "implementer", "cpu part": "part", "cpu variant": "variant",
              "cpu revision": "revision"}


def parse_cpuinfo(text: str) -> Cpuinfo:
    """Both arm64 formats (see Cpuinfo). Lines it does not know are ignored."""
    pre: dict = {}
    blocks: list[dict] = []
    hardware = ""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip().lower(), value.strip()
        if key == "processor" and value.isdigit():
            blocks.append({"cpu": int(value)})
            continue
        target = blocks[-1] if blocks else pre
        if key == "features":
            target["features"] = tuple(value.split())
        elif key in _MIDR_KEYS:
            target[_MIDR_KEYS[key]] = parse_int(value)
        elif key == "hardware":
            hardware = value
    cpus = tuple(b["cpu"] for b in blocks)

    def midr(d: dict) -> Midr:
        return Midr(d.get("implementer"), d.get("part"), d.get("variant"), d.get("revision"))

    if blocks and all("part" in b for b in blocks):
        shared = pre.get("features", ())
        return Cpuinfo("per-cpu", cpus, {b["cpu"]: midr(b) for b in blocks}, None,
                       {b["cpu"]: b.get("features", shared) for b in blocks}, hardware)
    # Older kernels: one block describes the reading CPU; Features (elf_hwcap) hold for all.
    holder = next((b for b in reversed(blocks) if "part" in b), pre)
    feats = holder.get("features") or pre.get("features") or next(
        (b["features"] for b in blocks if "features" in b), ())
    one = midr(holder) if "part" in holder else None
    return Cpuinfo("older-kernel", cpus, {}, one, {c: feats for c in cpus}, hardware)
