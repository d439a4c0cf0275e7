"""`xfc hw probe` through the real adb server and the virtual device (issue 15): probe ->
validate -> synth -> bench for three emulated SoCs, the Snapdragon 865 draft against the shipped
file, an unknown CPU part, missing cacheinfo and older-kernel /proc/cpuinfo, and the one-line
exits for unauthorized / offline / absent devices."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from android_runner.virtual_device import Faults, VirtualDevice
from support import needs_adb, needs_arm
from support.hwprobe import at
from xfc.hardware import SHIPPED_ROOT, validate_file
from xfc.hardware.load import read_yaml

pytestmark = [pytest.mark.adb, needs_adb]

XFC = shutil.which("xfc", path=str(Path(sys.executable).parent)) or "xfc"
SMALL = ["conv2d", "--shape", "c=4,h=6,w=7,k=5,r=3,s=3", "--pad", "1", "--bias"]


def xfc(*args, timeout=300):
    return subprocess.run([XFC, *args], capture_output=True, text=True, timeout=timeout, env=dict(os.environ))


def one_error_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xfc: error: ") and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.fixture
def device(server):
    started = []

    def start(soc: str, **faults) -> VirtualDevice:
        dev = VirtualDevice(soc=soc, faults=Faults(**faults)).start()
        started.append(dev)
        assert server.connect(dev.serial) == "device"
        return dev
    yield start
    for dev in started:
        server.disconnect(dev.serial)
        dev.stop()


def probe(server, dev, *args):
    return xfc("hw", "probe", "--device", dev.serial, "--adb-port", str(server.port), *args)


@needs_arm
@pytest.mark.parametrize("soc,cluster", [("kirin-980", "little"), ("snapdragon-888", "prime"),
                                         ("dimensity-1200", "big")])
def test_probe_validate_synth_bench(server, device, tmp_path, soc, cluster):
    dev = device(soc)
    draft = tmp_path / f"{soc}-phone.yaml"
    proc = probe(server, dev, "-o", str(draft))
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {draft}" in proc.stdout and f"matched shipped description: {soc}" in proc.stdout
    check = xfc("hw", "validate", str(draft))
    assert check.returncode == 0 and check.stdout.startswith("OK"), check.stdout
    synth = xfc("synth", *SMALL, "--hw", str(draft), "--cluster", cluster, "-o", str(tmp_path / "out"), "--json")
    assert synth.returncode == 0, synth.stderr
    assert json.loads(synth.stdout)["hardware"] == f"{soc}-phone"
    bench = xfc("bench", *SMALL, "--hw", str(draft), "--cluster", cluster, "--device", dev.serial,
                "--adb-port", str(server.port), "--repeat", "1", "--warmup", "0", "--json")
    assert bench.returncode == 0, bench.stderr
    report = json.loads(bench.stdout)
    assert report["hardware"] == f"{soc}-phone" and report["verified"] is True and report["max_abs_error"] < 1e-4
    hw = validate_file(draft)
    assert report["cpu_ids"] == list(hw.cluster(cluster).cpu_ids)
    assert dev.system.taskset_log, "the kernel ran pinned to the probed cluster"


def test_probed_snapdragon_865_matches_the_shipped_file(server, device, tmp_path):
    dev = device("snapdragon-865")
    proc = probe(server, dev, "--json", "--compare", "snapdragon-865", "-o", str(tmp_path / "sd.yaml"))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["matched"] == "snapdragon-865" and out["validated"] and out["compare"]["agrees"] is True
    assert len(out["compare"]["checked"]) > 30
    shipped = read_yaml(SHIPPED_ROOT / "soc" / "snapdragon-865.yaml")
    exposed = [p for p, s in out["provenance"].items() if s.startswith(f"device:{dev.serial} ")]
    assert len(exposed) == 28   # 7 per cluster, L3, GPU model and clock, vendor, 3 Android ids
    for path in exposed:
        assert at(out["soc"], path) == at(shipped, path), path
    text = xfc("hw", "probe", "--device", dev.serial, "--adb-port", str(server.port), "--compare", "snapdragon-855")
    assert text.returncode == 0
    # Same CPU ids (Kryo 485) and clocks; the L3, the GPU and the Android ids tell them apart.
    assert "snapdragon-855 disagrees with device" in text.stdout and "on 4 of" in text.stdout
    assert "  l3_kib: shipped 2048 KiB, device 4096 KiB  (device:" in text.stdout
    assert "  gpu.ref: shipped adreno-640, device adreno-650  (device:" in text.stdout


@needs_arm
def test_unknown_cpu_part_is_drafted_as_a_new_core(server, device, tmp_path):
    dev = device("exynos-2100")
    plain = dev.system.cpuinfo
    dev.system.cpuinfo = lambda: plain().replace("CPU part\t: 0xd44", "CPU part\t: 0xd82")   # X1 -> X4
    dev.system.props.pop("ro.soc.model")
    dev.system.props["ro.board.platform"] = "s5e9945"
    dev.system.props["ro.hardware"] = "s5e9945"
    proc = probe(server, dev, "-o", str(tmp_path / "new-phone.yaml"))
    assert proc.returncode == 0, proc.stderr
    assert "cortex-x4.yaml" in proc.stdout and "1 new core file(s)" in proc.stdout
    core = read_yaml(tmp_path / "cortex-x4.yaml")
    assert core["cpuinfo"] == {"implementer": 0x41, "part": 0xD82} and "fma_per_cycle" in core["uncertain"]
    hw = validate_file(tmp_path / "new-phone.yaml")
    assert hw.cluster("prime").core.name == "cortex-x4" and hw.cluster("big").core.name == "cortex-a78"
    synth = xfc("synth", *SMALL, "--hw", str(tmp_path / "new-phone.yaml"), "--cluster", "prime",
                "-o", str(tmp_path / "out"))
    assert synth.returncode == 0, synth.stderr


def test_missing_caches_and_older_kernel_cpuinfo(server, device, tmp_path):
    dev = device("snapdragon-855", drop_cache_levels=(1, 2, 3), cpuinfo_format="older-kernel")
    proc = probe(server, dev, "--json", "-o", str(tmp_path / "old.yaml"))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["device"]["cpuinfo_format"] == "older-kernel"
    assert {"clusters.prime.core", "clusters.little.core", "clusters.prime.l2_kib", "l3_kib"} <= set(out["uncertain"])
    assert all(c["l2_bytes"] is None for c in out["device"]["clusters"])
    assert any("older-kernel format" in n for n in out["notes"])
    assert validate_file(tmp_path / "old.yaml").cluster("little").core.name == "cortex-a55"


def test_unauthorized_offline_and_absent_devices_exit_3(server, tmp_path):
    with VirtualDevice(faults=Faults(unauthorized=True)) as dev:
        assert server.connect(dev.serial, want_state="unauthorized") == "unauthorized"
        proc = xfc("hw", "probe", "--device", dev.serial, "--adb-port", str(server.port), "-o", str(tmp_path / "u.yaml"))
        server.disconnect(dev.serial)
    assert proc.returncode == 3 and "is unauthorized" in one_error_line(proc)
    with VirtualDevice(faults=Faults(offline=True)) as dev:
        assert server.connect(dev.serial, want_state="offline", timeout=8, attempt_timeout=1) == "offline"
        proc = xfc("hw", "probe", "--device", dev.serial, "--adb-port", str(server.port))
        server.disconnect(dev.serial)
    assert proc.returncode == 3 and "is offline" in one_error_line(proc)
    proc = xfc("hw", "probe", "--device", "127.0.0.1:9", "--adb-port", str(server.port))
    assert proc.returncode == 3 and "not found" in one_error_line(proc)
    assert list(tmp_path.iterdir()) == []


def test_bad_input_exits_2_before_touching_the_device(server, device, tmp_path):
    dev = device("snapdragon-865")
    before = len(dev.system.commands)
    proc = probe(server, dev, "--compare", "no-such-soc")
    assert proc.returncode == 2 and "no-such-soc" in one_error_line(proc)
    proc = probe(server, dev, "-o", str(tmp_path / "draft.txt"))
    assert proc.returncode == 2 and ".yaml" in one_error_line(proc)
    assert len(dev.system.commands) == before
    foreign = tmp_path / "mine.yaml"
    foreign.write_text("kind: soc\n")
    proc = probe(server, dev, "-o", str(foreign))
    assert proc.returncode == 2 and "not written by xfc" in one_error_line(proc)
    assert foreign.read_text() == "kind: soc\n"
