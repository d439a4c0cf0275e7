"""Cross-field rules for hardware descriptions: values that each pass their own range check but
cannot be true of real hardware together.

Pure functions over the cleaned field dicts that xfc/hardware/schema.py produces (every field already
has the right type and a plausible value). Each rule reports through `fail(field_path, message)`,
which returns the exception to raise; the message names the values involved. Only rules that
hold for every real part are here, each with the reason as a comment.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

Fail = Callable[[str, str], Exception]

X86_FEATURES = ("avx2", "avx512f", "fma")
# Features that Armv8.0-A cannot have: FEAT_FP16, FEAT_DotProd, FEAT_I8MM, FEAT_BF16 arrive in
# Armv8.2-A at the earliest, SVE2 in Armv9.0-A.
POST_V80_FEATURES = ("fp16", "dotprod", "i8mm", "bf16", "sve2")
# (bits, registers) of each SIMD dialect's register file, fixed by the architecture.
DIALECT_REGISTERS = (("neon", 128, 32), ("avx512f", 512, 32), ("avx2", 256, 16))
# A SoC runs a core design (or a GPU) at a clock near the one it was designed for: shipped SoCs
# stay within 0.68x..1.24x of the typical clock; beyond these factors it is a unit slip.
CLOCK_FACTOR_LOW, CLOCK_FACTOR_HIGH = 1 / 3, 2.0


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def cache_geometry_problem(size_kib: float, line_bytes: int, ways: int) -> Optional[str]:
    """Why a set-associative cache of this size cannot exist, or None.

    size = sets x ways x line, and the set index is a bit field of the address, so the number
    of sets is a whole power of two (a 12-way 48 KiB L1 has 64 sets; the way count need not be
    a power of two)."""
    size_bytes = size_kib * 1024
    if not float(size_bytes).is_integer():
        return f"{size_kib:g} KiB is not a whole number of bytes"
    per_set = line_bytes * ways
    sets, rest = divmod(int(size_bytes), per_set)
    if rest or sets < 1:
        return f"{size_kib:g} KiB is not a whole number of sets of {ways} ways x {line_bytes}-byte lines"
    if not _power_of_two(sets):
        return (f"{size_kib:g} KiB with {ways} ways x {line_bytes}-byte lines gives {sets} sets; "
                f"the set count of a cache is a power of two")
    return None


def _kib(x: float) -> str:
    return f"{x:g} KiB"


def check_cpu_core(d: dict, fail: Fail) -> None:
    features = d["features"]
    x86 = [f for f in features if f in X86_FEATURES]
    # One core implements one instruction set: NEON is AArch64's, AVX/FMA3 are x86's.
    if "neon" in features and x86:
        raise fail("features", f"lists neon and the x86 feature {x86[0]}; a core implements one ISA")
    # AdvSIMD (NEON) is mandatory in every Armv8/v9 A-profile core, and x86-64 has none.
    if d["isa"].startswith("armv") and "neon" not in features:
        raise fail("features", f"isa {d['isa']} always has 'neon' (AdvSIMD is mandatory in AArch64)")
    if d["isa"] == "x86-64" and "neon" in features:
        raise fail("features", "an x86-64 core cannot list 'neon'")
    if d["vendor"] == "arm" and "neon" not in features:
        raise fail("features", "an Arm AArch64 core must list 'neon'")
    if d["isa"] == "armv8.0-a":
        late = [f for f in features if f in POST_V80_FEATURES]
        if late:
            raise fail("features", f"'{late[0]}' needs Armv8.2-A or later, but isa is armv8.0-a")
    # The register file of the SIMD dialect the code generator emits is architectural:
    # AArch64 has 32 x 128-bit V registers, AVX-512 32 x 512-bit zmm, AVX2 16 x 256-bit ymm.
    for feature, bits, registers in DIALECT_REGISTERS:
        if feature in features:
            if d["vector_bits"] != bits:
                raise fail("vector_bits", f"{d['vector_bits']} does not match the {bits}-bit registers of {feature}")
            if d["vector_registers"] != registers:
                raise fail("vector_registers",
                           f"{d['vector_registers']} does not match the {registers} architectural "
                           f"registers of {feature}")
            break
    # An FMA is one instruction, and no core has more FP/SIMD pipes than decode slots.
    if d["fma_per_cycle"] > d["decode_width"]:
        raise fail("fma_per_cycle", f"{d['fma_per_cycle']:g} exceeds decode_width {d['decode_width']}")
    fp16_rate = d.get("fp16_fma_per_cycle")
    if fp16_rate is not None:   # an AArch64 figure (FMLA .8h); x86 cores have no fp16 kernels and ignore it
        if "neon" in features and "fp16" not in features:
            raise fail("fp16_fma_per_cycle", "is set but features does not list 'fp16' (no FP16 arithmetic)")
        if fp16_rate > d["decode_width"]:
            raise fail("fp16_fma_per_cycle", f"{fp16_rate:g} exceeds decode_width {d['decode_width']}")
    # The int8 dot-product rates exist only with the extension that has the instruction, and
    # like an FMA each is one instruction per decode slot.
    for field, feature in (("sdot_per_cycle", "dotprod"), ("smmla_per_cycle", "i8mm")):
        if d.get(field) is not None:
            if feature not in features:
                raise fail(field, f"given, but features do not list '{feature}' (the extension with the instruction)")
            if d[field] > d["decode_width"]:
                raise fail(field, f"{d[field]:g} exceeds decode_width {d['decode_width']}")
    for level in ("l1d", "l2"):
        c = d[level]
        problem = cache_geometry_problem(c["size_kib"], c["line_bytes"], c["ways"])
        if problem:
            raise fail(f"{level}.size_kib", problem)
    # Each level holds at least what the level above it does.
    if d["l2"]["size_kib"] < d["l1d"]["size_kib"]:
        raise fail("l2.size_kib", f"{_kib(d['l2']['size_kib'])} is smaller than l1d.size_kib "
                                  f"{_kib(d['l1d']['size_kib'])}")


def check_gpu(d: dict, fail: Fail) -> None:
    family, warp = d["family"], d["warp_width"]
    # Mali is Arm's design and Adreno Qualcomm's; neither licenses its GPU to the other.
    expected_family = {"arm": "mali", "qualcomm": "adreno"}[d["vendor"]]
    if family != expected_family:
        raise fail("family", f"'{family}' does not match vendor '{d['vendor']}' (which makes {expected_family})")
    # The half wave is, by definition, half the full wave.
    if d["half_warp_width"] is not None and d["half_warp_width"] * 2 != warp:
        raise fail("half_warp_width", f"{d['half_warp_width']} is not half of warp_width {warp}")
    # A device runs at least one full warp per work-group, and prefers a size it can run.
    if warp > d["max_work_group_size"]:
        raise fail("max_work_group_size", f"{d['max_work_group_size']} is smaller than one warp ({warp})")
    if d["preferred_work_group_size"] > d["max_work_group_size"]:
        raise fail("preferred_work_group_size",
                   f"{d['preferred_work_group_size']} exceeds max_work_group_size {d['max_work_group_size']}")
    # fp16 runs on the same lanes at one or two values per lane on every Mali and Adreno.
    fp16, fp32 = d["fp16_flop_per_clock_per_cu"], d["fp32_flop_per_clock_per_cu"]
    if fp16 is not None and fp16 < fp32:
        raise fail("fp16_flop_per_clock_per_cu", f"{fp16:g} is below fp32_flop_per_clock_per_cu {fp32:g}")
    # Threads that share a cache line are issued together, i.e. within one warp.
    if d["coalescing_threads"] > warp:
        raise fail("coalescing_threads", f"{d['coalescing_threads']} exceeds warp_width {warp}")
    if d["l1_kib_per_cu"] > d["l2_kib"]:
        raise fail("l1_kib_per_cu", f"{_kib(d['l1_kib_per_cu'])} exceeds l2_kib {_kib(d['l2_kib'])}")
    # Full occupancy means max_waves_per_cu waves with that many 32-bit registers per thread
    # are resident at once, so they must fit in the register file.
    regs, waves, rf = d["registers_per_thread_full_occupancy"], d["max_waves_per_cu"], d["register_file_bytes_per_cu"]
    if waves is not None and rf is not None and regs * 4 * warp * waves > rf:
        raise fail("registers_per_thread_full_occupancy",
                   f"{regs} registers x 4 bytes x {warp} threads x {waves} waves = {regs * 4 * warp * waves} "
                   f"bytes exceeds register_file_bytes_per_cu {rf}")
    # Mali has no dedicated local memory (__local is cached system memory); Adreno has SRAM.
    on_chip = d["local_memory"]["on_chip"]
    if on_chip != (family == "adreno"):
        raise fail("local_memory.on_chip", f"{str(on_chip).lower()} is wrong for {family} "
                                           f"({'on-chip SRAM' if family == 'adreno' else 'no on-chip local memory'})")


def check_soc(d: dict, fail: Fail) -> None:
    """Rules inside one SoC file (references not yet resolved)."""
    clusters = d["clusters"]
    roles: dict[str, int] = {}
    seen: dict[int, str] = {}
    for i, cluster in enumerate(clusters):
        if cluster["role"] in roles:
            raise fail(f"clusters[{i}].role", f"'{cluster['role']}' appears more than once "
                                              f"(also clusters[{roles[cluster['role']]}].role)")
        roles[cluster["role"]] = i
        if len(cluster["cpu_ids"]) != cluster["count"]:
            raise fail(f"clusters[{i}].cpu_ids",
                       f"lists {len(cluster['cpu_ids'])} CPUs but count is {cluster['count']}")
        # A CPU belongs to exactly one cluster.
        for j, cpu in enumerate(cluster["cpu_ids"]):
            here = f"clusters[{i}].cpu_ids[{j}]"
            if cpu in seen:
                raise fail(here, f"CPU {cpu} is also listed at {seen[cpu]}")
            seen[cpu] = here
    # Linux numbers the CPUs of a SoC 0..N-1 with no gaps (/sys/devices/system/cpu/possible).
    total = len(seen)
    gaps = sorted(set(range(total)) - set(seen))
    if gaps:
        extra = sorted(cpu for cpu in seen if cpu >= total)
        raise fail(seen[extra[0]], f"CPU {extra[0]} leaves CPU {gaps[0]} unused; the {total} CPUs "
                                   f"must be numbered 0 to {total - 1}")


def check_soc_references(d: dict, cores: Sequence[dict], gpu: Optional[dict], fail: Fail) -> None:
    """Rules between a SoC and the core / GPU files it references (cores[i] for clusters[i])."""
    l3 = d["l3_kib"]
    for i, (cluster, core) in enumerate(zip(d["clusters"], cores)):
        at = f"clusters[{i}]"
        # SoC descriptions are AArch64 targets (their kernels are built for aarch64).
        if not core["isa"].startswith("armv"):
            raise fail(f"{at}.core", f"'{core['name']}' is an {core['isa']} core; a SoC's cores are AArch64")
        l2 = cluster["l2_kib"] if cluster["l2_kib"] is not None else core["l2"]["size_kib"]
        if cluster["l2_kib"] is not None:
            problem = cache_geometry_problem(l2, core["l2"]["line_bytes"], core["l2"]["ways"])
            if problem:
                raise fail(f"{at}.l2_kib", f"{problem} (the {core['name']} L2 geometry)")
        if l2 < core["l1d"]["size_kib"]:
            raise fail(f"{at}.l2_kib", f"L2 {_kib(l2)} is smaller than the {core['name']} L1d "
                                       f"{_kib(core['l1d']['size_kib'])}")
        # The DSU L3 is shared by the clusters and larger than any one core's L2.
        if l3 is not None and l2 > l3:
            raise fail("l3_kib", f"{_kib(l3)} is smaller than the {_kib(l2)} L2 of {at} ({core['name']})")
        # An L2 shared by n cores needs n cores of that type in the cluster.
        shared = core["l2"]["shared_by_cores"]
        if shared > cluster["count"]:
            raise fail(f"{at}.count", f"{cluster['count']} is fewer than the {shared} cores that share one "
                                      f"{core['name']} L2 (l2.shared_by_cores)")
        typical = core["typical_max_clock_ghz"]
        ratio = cluster["max_clock_ghz"] / typical
        if not CLOCK_FACTOR_LOW <= ratio <= CLOCK_FACTOR_HIGH:
            raise fail(f"{at}.max_clock_ghz",
                       f"{cluster['max_clock_ghz']:g} GHz is {ratio:.2f}x the {core['name']} typical clock "
                       f"{typical:g} GHz (accepted: {CLOCK_FACTOR_LOW:.2f}x to {CLOCK_FACTOR_HIGH:g}x)")
    if gpu is None:
        return
    # Qualcomm SoCs use Adreno and Adreno is only in Qualcomm SoCs; all others here use Mali.
    qualcomm = str(d["vendor"]).strip().lower() == "qualcomm"
    if qualcomm != (gpu["family"] == "adreno"):
        raise fail("gpu.ref", f"'{gpu['name']}' is a {gpu['family']} GPU, which a {d['vendor']} SoC does not use")
    # An Adreno model number is one fixed configuration; Mali is licensed with a core count.
    if gpu["family"] == "adreno" and d["gpu"]["compute_units"] != gpu["compute_units"]:
        raise fail("gpu.compute_units", f"{d['gpu']['compute_units']} differs from the {gpu['compute_units']} "
                                        f"of {gpu['name']} (an Adreno model has one configuration)")
    ratio = d["gpu"]["clock_mhz"] / gpu["max_clock_mhz"]
    if not CLOCK_FACTOR_LOW <= ratio <= CLOCK_FACTOR_HIGH:
        raise fail("gpu.clock_mhz", f"{d['gpu']['clock_mhz']:g} MHz is {ratio:.2f}x the {gpu['name']} clock "
                                    f"{gpu['max_clock_mhz']:g} MHz (accepted: {CLOCK_FACTOR_LOW:.2f}x to "
                                    f"{CLOCK_FACTOR_HIGH:g}x)")
