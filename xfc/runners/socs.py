"""A small table of phone SoCs: Android properties -> xfc hardware-description name.

Used by `xfc devices` (to say which hardware description matches a connected phone) and by
the virtual ADB device (to answer `getprop` and to fake a plausible CPU topology).

Property values are what these SoCs usually report (`ro.board.platform`, and `ro.soc.model`
on Android 12+). Clock figures are nominal maxima, only used to fake cpufreq on the virtual
device; the hardware descriptions in hardware_descriptions/soc/ remain the authority.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cluster:
    role: str
    core: str
    cpu_ids: tuple[int, ...]
    max_khz: int


@dataclass(frozen=True)
class SocInfo:
    name: str                 # hardware description name, e.g. "snapdragon-865"
    marketing_name: str
    soc_manufacturer: str     # ro.soc.manufacturer
    soc_model: str            # ro.soc.model
    board_platform: str       # ro.board.platform
    qemu_cpu: str             # qemu-aarch64 -cpu value with a similar feature set
    clusters: tuple[Cluster, ...]   # fastest first

    @property
    def cpu_count(self) -> int:
        return sum(len(c.cpu_ids) for c in self.clusters)


def _c(role: str, core: str, ids: range | tuple[int, ...], ghz: float) -> Cluster:
    return Cluster(role, core, tuple(ids), int(round(ghz * 1e6)))


SOCS: dict[str, SocInfo] = {s.name: s for s in (
    SocInfo("snapdragon-855", "Snapdragon 855", "QTI", "SM8150", "msmnile", "cortex-a76",
            (_c("prime", "cortex-a76", (7,), 2.84), _c("big", "cortex-a76", range(4, 7), 2.42),
             _c("little", "cortex-a55", range(0, 4), 1.78))),
    SocInfo("snapdragon-865", "Snapdragon 865", "QTI", "SM8250", "kona", "cortex-a76",
            (_c("prime", "cortex-a77", (7,), 2.84), _c("big", "cortex-a77", range(4, 7), 2.42),
             _c("little", "cortex-a55", range(0, 4), 1.80))),
    SocInfo("snapdragon-888", "Snapdragon 888", "QTI", "SM8350", "lahaina", "cortex-a76",
            (_c("prime", "cortex-x1", (7,), 2.84), _c("big", "cortex-a78", range(4, 7), 2.42),
             _c("little", "cortex-a55", range(0, 4), 1.80))),
    SocInfo("snapdragon-8-gen-1", "Snapdragon 8 Gen 1", "QTI", "SM8450", "taro", "max",
            (_c("prime", "cortex-x2", (7,), 3.00), _c("big", "cortex-a710", range(4, 7), 2.50),
             _c("little", "cortex-a510", range(0, 4), 1.80))),
    SocInfo("snapdragon-8-gen-2", "Snapdragon 8 Gen 2", "QTI", "SM8550", "kalama", "max",
            (_c("prime", "cortex-x3", (7,), 3.19), _c("big", "cortex-a715", range(3, 7), 2.80),
             _c("little", "cortex-a510", range(0, 3), 2.02))),
    SocInfo("snapdragon-8-gen-3", "Snapdragon 8 Gen 3", "QTI", "SM8650", "pineapple", "max",
            (_c("prime", "cortex-x4", (7,), 3.30), _c("big", "cortex-a720", range(2, 7), 3.15),
             _c("little", "cortex-a520", range(0, 2), 2.27))),
    SocInfo("dimensity-9000", "Dimensity 9000", "Mediatek", "MT6983", "mt6983", "max",
            (_c("prime", "cortex-x2", (7,), 3.05), _c("big", "cortex-a710", range(4, 7), 2.85),
             _c("little", "cortex-a510", range(0, 4), 1.80))),
    SocInfo("google-tensor-g2", "Google Tensor G2", "Google", "GS201", "gs201", "cortex-a76",
            (_c("prime", "cortex-x1", (6, 7), 2.85), _c("big", "cortex-a78", (4, 5), 2.35),
             _c("little", "cortex-a55", range(0, 4), 1.80))),
    SocInfo("dimensity-1200", "Dimensity 1200", "Mediatek", "MT6893", "mt6893", "cortex-a76",
            (_c("prime", "cortex-a78", (7,), 3.00), _c("big", "cortex-a78", range(4, 7), 2.60),
             _c("little", "cortex-a55", range(0, 4), 2.00))),
    SocInfo("kirin-9000", "Kirin 9000", "HiSilicon", "Kirin9000", "kirin9000", "cortex-a76",
            (_c("prime", "cortex-a77", (7,), 3.13), _c("big", "cortex-a77", range(4, 7), 2.54),
             _c("little", "cortex-a55", range(0, 4), 2.05))),
    SocInfo("kirin-980", "Kirin 980", "HiSilicon", "Kirin980", "kirin980", "cortex-a76",
            (_c("big", "cortex-a76", (6, 7), 2.60), _c("mid", "cortex-a76", (4, 5), 1.92),
             _c("little", "cortex-a55", range(0, 4), 1.80))),
    SocInfo("exynos-2100", "Exynos 2100", "Samsung", "s5e9840", "exynos2100", "cortex-a76",
            (_c("prime", "cortex-x1", (7,), 2.91), _c("big", "cortex-a78", range(4, 7), 2.81),
             _c("little", "cortex-a55", range(0, 4), 2.20))),
)}


def match_soc(board_platform: str | None = None, soc_model: str | None = None) -> str | None:
    """The hardware-description name for a phone's properties, or None when unknown.

    `ro.soc.model` is checked first (it is the more specific), then `ro.board.platform`.
    """
    model = (soc_model or "").strip().lower()
    platform = (board_platform or "").strip().lower()
    if model:
        for soc in SOCS.values():
            if soc.soc_model.lower() == model:
                return soc.name
    if platform:
        for soc in SOCS.values():
            if soc.board_platform.lower() == platform:
                return soc.name
    return None


def get_soc(name: str) -> SocInfo:
    try:
        return SOCS[name]
    except KeyError:
        from xfc.errors import DeviceError
        known = ", ".join(sorted(SOCS))
        raise DeviceError(f"unknown SoC '{name}' for the virtual device; known: {known}") from None
