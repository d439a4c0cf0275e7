"""Device identity before building (issue 9 part 3): Android properties and /proc/cpuinfo ->
the shipped SoC description, the ISA check that stops an armv9 kernel before it reaches an
armv8.2 phone, the one-line SIGILL message, and the virtual device that plays the SoC."""
from __future__ import annotations

import pytest

from android_runner.device_system import HOME_MARKER, Faults, FakeSystem, soc_names
from android_runner.virtual_device import VirtualDevice
from xfc.errors import HardwareError
from xfc.hardware.load import load
from xfc.hardware.identity import (check_description, core_hwcaps, identity_from, march_hwcaps, match_identity, parse_cpuinfo, pick_description, required_hwcaps, shipped_socs, soc_description)
from xfc.runners.sigill import illegal_instruction_message, is_illegal_instruction

pytestmark = pytest.mark.unit

V82 = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp"
V9 = V82 + " sve sve2 i8mm bf16"


def cpuinfo(cpus: list[tuple[int, int, str]]) -> str:
    """arm64 /proc/cpuinfo text for (implementer, part, features) per CPU 0..n-1."""
    return "\n".join(f"processor\t: {i}\nBogoMIPS\t: 38.40\nFeatures\t: {f}\nCPU implementer\t: {imp:#x}\n"
                     f"CPU architecture: 8\nCPU variant\t: 0x1\nCPU part\t: {part:#x}\nCPU revision\t: 0\n"
                     for i, (imp, part, f) in enumerate(cpus))


def sd865(features: str = V82, little=(0x51, 0x805), big=(0x41, 0xd0d), **props) -> object:
    text = cpuinfo([(*little, features)] * 4 + [(*big, features)] * 4)
    return identity_from("SER", {"ro.product.cpu.abi": "arm64-v8a", **props}, text)


# --------------------------------------------------------------------------------------------
# parsing
# --------------------------------------------------------------------------------------------

def test_parse_cpuinfo_per_cpu_and_old_shared_features_line():
    cpus = parse_cpuinfo(cpuinfo([(0x41, 0xd05, "fp asimd"), (0x48, 0xd40, "fp asimd asimddp")]))
    assert [(c.cpu, c.implementer, c.part, c.features) for c in cpus] == [
        (0, 0x41, 0xd05, ("fp", "asimd")), (1, 0x48, 0xd40, ("fp", "asimd", "asimddp"))]
    # Old kernels: one Features line for all CPUs, before the first 'processor'.
    old = parse_cpuinfo("Processor\t: AArch64\nFeatures\t: fp asimd crc32\nprocessor\t: 0\n"
                        "CPU part\t: 0xd03\nprocessor\t: 1\nCPU part\t: 0xd03\n")
    assert [c.features for c in old] == [("fp", "asimd", "crc32")] * 2
    assert [c.implementer for c in old] == [None, None] and old[1].part == 0xd03
    assert parse_cpuinfo("") == ()


def test_march_hwcaps():
    assert march_hwcaps("armv9-a+i8mm+bf16") >= {"sve", "sve2", "i8mm", "bf16", "atomics", "asimd"}
    v82 = march_hwcaps("armv8.2-a+fp16+dotprod")
    assert v82 == {"fp", "asimd", "atomics", "fphp", "asimdhp", "asimddp"}
    assert "asimddp" not in march_hwcaps("armv8.2-a+fp16+dotprod+nodotprod")
    assert march_hwcaps("armv8-a") == {"fp", "asimd"}
    assert march_hwcaps("x86-64-v4") == frozenset() and march_hwcaps("") == frozenset()


def test_required_hwcaps_follow_the_core_descriptions():
    a77, a715 = load("cortex-a77").clusters[0].core, load("cortex-a715").clusters[0].core
    assert required_hwcaps(a77) == {"fp", "asimd", "atomics", "fphp", "asimdhp", "asimddp"}
    assert {"sve2", "i8mm", "bf16"} <= required_hwcaps(a715)
    # What a core reports covers what a kernel built for it needs (else it could never run).
    for hw in shipped_socs():
        for c in hw.clusters:
            assert required_hwcaps(c.core) <= set(core_hwcaps(c.core)), (hw.name, c.core.name)


# --------------------------------------------------------------------------------------------
# matching
# --------------------------------------------------------------------------------------------

def test_every_shipped_soc_has_android_ids_and_cpuinfo_ids():
    names = [hw.name for hw in shipped_socs()]
    assert "snapdragon-865" in names and "snapdragon-8-gen-3" not in names
    for hw in shipped_socs():
        assert hw.android and hw.android.soc_models and hw.android.board_platforms, hw.name
        assert all(c.cpuinfo_ids for c in hw.clusters), hw.name


@pytest.mark.parametrize("hw", shipped_socs(), ids=lambda h: h.name)
def test_match_by_properties(hw):
    model = hw.android.soc_models[0]
    assert match_identity(sd865(**{"ro.soc.model": model.lower()})).name == hw.name   # any case
    by_platform = match_identity(sd865(**{"ro.board.platform": hw.android.board_platforms[0]}))
    assert (by_platform.name, by_platform.how) == (hw.name, "ro.board.platform")
    by_hardware = match_identity(sd865(**{"ro.hardware": hw.android.board_platforms[0].upper()}))
    assert (by_hardware.name, by_hardware.how) == (hw.name, "ro.hardware")


def test_properties_win_over_cpus_and_model_over_platform():
    ident = sd865(**{"ro.soc.model": "SM8350", "ro.board.platform": "kona"})
    assert (match_identity(ident).name, match_identity(ident).how) == ("snapdragon-888", "ro.soc.model")


def test_match_by_cpuinfo():
    # Snapdragon 8 Gen 2: 3x A510, 2x A710, 2x A715, 1x X3 -- only one description has that.
    gen2 = identity_from("S", {}, cpuinfo([(0x41, 0xd46, V9)] * 3 + [(0x41, 0xd47, V9)] * 2
                                          + [(0x41, 0xd4d, V9)] * 2 + [(0x41, 0xd4e, V9)]))
    m = match_identity(gen2)
    assert (m.name, m.how) == ("snapdragon-8-gen-2", "cpuinfo")
    # Kirin 980: HiSilicon-branded A76 (0x48/0xd40), as a Mate 20 reports.
    kirin = identity_from("S", {}, cpuinfo([(0x41, 0xd05, V82)] * 4 + [(0x48, 0xd40, V82)] * 4))
    assert match_identity(kirin).name == "kirin-980"
    # Kryo 4xx ids: the Snapdragon 855, or a 865 if it reports them too (uncertain): ambiguous.
    kryo = identity_from("S", {}, cpuinfo([(0x51, 0x805, V82)] * 4 + [(0x51, 0x804, V82)] * 4))
    assert set(match_identity(kryo).candidates) == {"snapdragon-855", "snapdragon-865"}
    # X2 + A710 + A510 in 1+3+4 is both the Snapdragon 8 Gen 1 and the Dimensity 9000: ambiguous.
    same = identity_from("S", {}, cpuinfo([(0x41, 0xd46, V9)] * 4 + [(0x41, 0xd47, V9)] * 3
                                          + [(0x41, 0xd48, V9)]))
    m = match_identity(same)
    assert m.name is None and set(m.candidates) == {"snapdragon-8-gen-1", "dimensity-9000"}
    with pytest.raises(HardwareError, match="could be .*pass --hw"):
        pick_description(same)
    # Wrong count or an unknown part: nothing.
    assert match_identity(identity_from("S", {}, cpuinfo([(0x41, 0xd46, V9)] * 3))).candidates == ()
    unknown = identity_from("S", {"ro.board.platform": "mystery"}, cpuinfo([(0x61, 0x22, V82)] * 8))
    assert match_identity(unknown).name is None
    with pytest.raises(HardwareError, match=r"matches no shipped hardware description.*mystery.*0x61/0x022"):
        pick_description(unknown)


# --------------------------------------------------------------------------------------------
# the ISA check before building
# --------------------------------------------------------------------------------------------

def test_armv9_description_on_a_snapdragon_865_is_refused_naming_both():
    ident = sd865(**{"ro.soc.model": "SM8250"})
    hw = load("snapdragon.yaml")                     # alias of snapdragon-8-gen-2 (armv9)
    with pytest.raises(HardwareError) as exc:
        check_description(ident, hw, hw.cluster())
    msg = str(exc.value)
    assert "snapdragon-8-gen-2" in msg and "snapdragon-865" in msg and "--hw snapdragon-865" in msg
    for feature in ("sve2", "i8mm", "bf16"):
        assert feature in msg
    assert exc.value.exit_code == 2 and "\n" not in msg


def test_matching_and_compatible_descriptions_pass():
    ident = sd865(**{"ro.soc.model": "SM8250"})
    hw = soc_description("snapdragon-865")
    for cluster in hw.clusters:
        assert check_description(ident, hw, cluster) == ()
    other = soc_description("snapdragon-888")          # same ISA: runs, with a note
    notes = check_description(ident, other, other.cluster())
    assert len(notes) == 1 and "snapdragon-865" in notes[0] and "tuned for snapdragon-888" in notes[0]


def test_old_kernel_without_new_hwcaps_is_forgiven_only_for_the_described_cores():
    # A Kirin 980 on an old kernel lists neither asimddp nor asimdrdm, yet its A76 cores have them.
    old = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp"
    hw = soc_description("kirin-980")
    ident = identity_from("S", {"ro.board.platform": "kirin980"},
                          cpuinfo([(0x41, 0xd05, old)] * 4 + [(0x48, 0xd40, old)] * 4))
    notes = check_description(ident, hw, hw.cluster("big"))
    assert len(notes) == 1 and "asimddp" in notes[0] and "cortex-a76" in notes[0]
    # The same Features on CPUs that are not the described core: refused.
    a53 = identity_from("S", {}, cpuinfo([(0x41, 0xd03, old)] * 8))
    with pytest.raises(HardwareError, match="lacks: asimddp"):
        check_description(a53, hw, hw.cluster("big"))
    # SVE must be switched on by the kernel: never forgiven, even on the right cores.
    gen2 = soc_description("snapdragon-8-gen-2")
    no_sve = identity_from("S", {}, cpuinfo([(0x41, 0xd46, V82)] * 3 + [(0x41, 0xd47, V82)] * 2
                                            + [(0x41, 0xd4d, V82)] * 2 + [(0x41, 0xd4e, V82)]))
    with pytest.raises(HardwareError, match="sve"):
        check_description(no_sve, gen2, gen2.cluster())


def test_cluster_cpus_missing_on_the_device_are_refused():
    ident = identity_from("S", {}, cpuinfo([(0x41, 0xd05, V82)] * 4))
    hw = soc_description("snapdragon-865")
    with pytest.raises(HardwareError, match=r"pins to CPUs \[4, 5, 6\].*has CPUs \[0, 1, 2, 3\]"):
        check_description(ident, hw, hw.cluster("big"))


# --------------------------------------------------------------------------------------------
# SIGILL
# --------------------------------------------------------------------------------------------

def test_illegal_instruction_recognised_in_every_form():
    assert is_illegal_instruction(-4) and is_illegal_instruction(132)
    assert is_illegal_instruction(1, "qemu: uncaught target signal 4 (Illegal instruction) - core dumped")
    assert is_illegal_instruction(2, "/system/bin/sh: ./harness: Illegal instruction")
    assert not is_illegal_instruction(139, "Segmentation fault") and not is_illegal_instruction(0)
    assert not is_illegal_instruction(None, "illegal instruction")
    msg = illegal_instruction_message("armv9-a+i8mm", "device CPU features: fp asimd")
    assert msg == ("illegal instruction: the kernel uses an instruction this CPU lacks "
                   "(built for -march=armv9-a+i8mm, device CPU features: fp asimd)")


# --------------------------------------------------------------------------------------------
# the virtual device plays the SoC of its description (no network needed)
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", soc_names())
def test_virtual_device_reports_the_identity_of_its_soc(name, tmp_path):
    hw = soc_description(name)
    system = FakeSystem(hw, tmp_path, Faults(), "x")
    ident = identity_from("S", system.props, system.cpuinfo())
    m = match_identity(ident)
    assert (m.name, m.how) == (name, "ro.soc.model")
    assert ident.abi == "arm64-v8a" and len(ident.cpus) == sum(c.count for c in hw.clusters)
    for cluster in hw.clusters:
        for cpu in cluster.cpu_ids:
            c = ident.cpus[cpu]
            assert (c.implementer, c.part) == cluster.cpuinfo_ids[0]
            assert c.features == core_hwcaps(cluster.core)
        assert check_description(ident, hw, cluster) == ()
    # Without properties the CPUs alone still point at it (or at an equal twin).
    bare = identity_from("S", {}, system.cpuinfo())
    mb = match_identity(bare)
    assert mb.name == name or name in mb.candidates
    # qemu -cpu: the weakest core among the CPUs a run may use.
    for cluster in hw.clusters:
        assert system.qemu_cpu(set(cluster.cpu_ids)) == (cluster.core.qemu_cpu or "max")


def test_virtual_865_emulates_an_armv8_2_core():
    system = FakeSystem(soc_description("snapdragon-865"), __import__("pathlib").Path("/nonexistent"),
                        Faults(), "x")
    assert system.qemu_cpu() == "cortex-a76" and system.qemu_cpu({4, 5, 6}) == "cortex-a76"


# --------------------------------------------------------------------------------------------
# the virtual device's own directory (ownership)
# --------------------------------------------------------------------------------------------

def test_virtual_device_writes_only_into_a_directory_it_created(tmp_path):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("user data")
    with pytest.raises(ValueError, match="not created by the xfc virtual device"):
        VirtualDevice(soc="snapdragon-865", sandbox=foreign)
    assert sorted(p.name for p in foreign.iterdir()) == ["keep.txt"]      # untouched
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError):
        VirtualDevice(soc="snapdragon-865", sandbox=tmp_path / "file")
    assert (tmp_path / "file").read_text() == "x"

    home = tmp_path / "vdev"
    dev = VirtualDevice(soc="snapdragon-865", sandbox=home)   # created and marked by the device
    assert (home / HOME_MARKER).is_file() and dev.sandbox.parent == home
    (dev.sandbox / "pushed.bin").write_bytes(b"1")
    dev.stop()
    assert not home.exists()                                  # it created it: it removes it

    home.mkdir()
    (home / HOME_MARKER).write_text("marked earlier\n")
    dev = VirtualDevice(soc="snapdragon-865", sandbox=home)   # marked: reused, not removed
    (dev.sandbox / "kept.bin").write_bytes(b"2")
    dev.stop()
    assert (dev.sandbox / "kept.bin").read_bytes() == b"2"

    default = VirtualDevice(soc="snapdragon-865")
    assert (default.home / HOME_MARKER).is_file()
    default.stop()
    assert not default.home.exists()
