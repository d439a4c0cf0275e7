"""`xfc bench --device` against the virtual Snapdragon 865 through the real adb server: identity
before building, no --hw, the SIGILL one-liner, and Ctrl-C / SIGTERM during a device run."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from android_runner.virtual_device import Faults, VirtualDevice
from support import qemu_run, signals_as_default
from xfc.errors import DeviceError
from xfc.ops.spec import make_spec as make_op_spec
from xfc.runners import get_runner, make_spec
from xfc.runners.qemu import QemuRunner

XFC = shutil.which("xfc", path=str(Path(sys.executable).parent)) or "xfc"
HAVE_ARM = bool(shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-gcc"))
needs_arm = pytest.mark.skipif(not HAVE_ARM, reason="no qemu-aarch64 / aarch64 gcc")
SMALL = ["conv2d", "--shape", "c=4,h=7,w=9,k=6,r=3,s=3", "--pad", "1", "--bias"]
SIGILL_LINE = "illegal instruction: the kernel uses an instruction this CPU lacks (built for -march="


def xfc(*args, env=None, timeout=300):
    return subprocess.run([XFC, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.fixture
def sd865(server):
    dev = VirtualDevice(soc="snapdragon-865").start()
    server.connect(dev.serial)
    yield dev
    server.disconnect(dev.serial)
    dev.stop()


def run_dirs(dev) -> list[str]:
    """Anything below /data/local/tmp/xfc/ on the device (the run directories)."""
    return [p for p in dev.sandbox_files() if p.startswith("/data/local/tmp/xfc/")]


def emulators_of(dev) -> list[int]:
    """PIDs of host processes (qemu-aarch64 running a pushed harness) inside this device's sandbox."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            except OSError:
                continue
            if str(dev.sandbox) in cmd:
                pids.append(int(entry.name))
    return pids


# --------------------------------------------------------------------------------------------
# identity through the real adb server
# --------------------------------------------------------------------------------------------

@pytest.mark.adb
def test_identity_is_read_over_adb_and_devices_shows_the_match(server, sd865):
    runner = get_runner(sd865.serial, adb_port=server.port)
    ident = runner.read_identity()
    assert (ident.soc_model, ident.board_platform, ident.abi) == ("SM8250", "kona", "arm64-v8a")
    assert [c.cpu for c in ident.cpus] == list(range(8)) and ident.virtual
    assert {(c.implementer, c.part) for c in ident.cpus} == {(0x51, 0x805), (0x51, 0x804)}
    assert "asimddp" in ident.features() and "sve2" not in ident.features()
    proc = xfc("devices", "--json", "--adb-port", str(server.port))
    assert proc.returncode == 0, proc.stderr
    row = next(r for r in json.loads(proc.stdout)["devices"] if r["serial"] == sd865.serial)
    assert (row["description"], row["matched_by"]) == ("snapdragon-865", "ro.soc.model")
    table = xfc("devices", "--adb-port", str(server.port))
    assert "snapdragon-865 (by ro.soc.model)" in table.stdout


@pytest.mark.adb
def test_armv9_hw_on_a_snapdragon_865_exits_2_before_building(server, sd865, tmp_path):
    proc = xfc("bench", *SMALL, "--hw", "snapdragon.yaml", "--device", sd865.serial,
               "--adb-port", str(server.port), env={"TMPDIR": str(tmp_path)})
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("xfc: error: --hw snapdragon-8-gen-2")
    assert "snapdragon-865" in err[0] and "sve2" in err[0] and "Traceback" not in proc.stderr
    # Nothing was built or pushed: no build directory, no command that touched the run area.
    assert list(tmp_path.iterdir()) == []
    assert not [c for c in sd865.system.commands if "/data/local/tmp/xfc" in c]
    assert not sd865.system.taskset_log


@needs_arm
@pytest.mark.adb
def test_no_hw_picks_the_matching_description_and_verifies(server, sd865):
    proc = xfc("bench", *SMALL, "--device", sd865.serial, "--adb-port", str(server.port),
               "--repeat", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["hardware"] == "snapdragon-865" and report["verified"] is True
    assert report["max_abs_error"] < 1e-4
    assert report["device_identity"]["matches"] == "snapdragon-865"
    assert report["device_identity"]["hw_given"] is False
    assert report["cpu_ids"] == [4, 5, 6] and sd865.system.taskset_log[-1][0] == "70"
    text = xfc("bench", *SMALL, "--device", sd865.serial, "--adb-port", str(server.port), "--repeat", "1")
    assert text.returncode == 0, text.stderr
    assert "is a Snapdragon 865 (matched by ro.soc.model 'SM8250'): using hardware description " \
           "snapdragon-865" in text.stderr
    assert run_dirs(sd865) == []


@needs_arm
@pytest.mark.adb
def test_sigill_on_the_device_is_one_explained_line(server, sd865):
    # Past the identity check on purpose: the armv9 kernel really runs on the emulated A77/A55.
    proc = xfc("bench", *SMALL, "--hw", "snapdragon.yaml", "--skip-device-check",
               "--device", sd865.serial, "--adb-port", str(server.port), "--repeat", "1")
    assert proc.returncode == 3, proc.stderr
    err = [ln for ln in proc.stderr.splitlines() if ln.startswith("xfc: error")]
    assert len(err) == 1 and SIGILL_LINE + "armv9-a+i8mm+bf16, device CPU features: fp asimd" in err[0]
    assert "uncaught target signal" not in proc.stderr and "qemu:" not in proc.stderr
    assert run_dirs(sd865) == [] and not sd865.system.processes


# --------------------------------------------------------------------------------------------
# SIGILL under local qemu (the one qemu path: QemuRunner), with a hand-built armv9 binary
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sve_binary(tmp_path_factory):
    if not HAVE_ARM:
        pytest.skip("no qemu-aarch64 / aarch64 gcc")
    d = tmp_path_factory.mktemp("sve")
    (d / "sve.c").write_text('int main(void) { __asm__ volatile("ptrue p0.s"); return 0; }\n')
    subprocess.run(["aarch64-linux-gnu-gcc", "-march=armv9-a", "-static", "-O1", "-o",
                    str(d / "sve"), str(d / "sve.c")], check=True, capture_output=True, timeout=120)
    return d / "sve"


@pytest.mark.emulated
def test_sigill_under_the_qemu_runner(sve_binary):
    a = np.zeros(4, np.float32)
    with pytest.raises(DeviceError) as exc:
        QemuRunner(cpu="cortex-a76").execute(make_spec(sve_binary, a, a, a, march="armv9-a",
                                                       protocol="times-file"))
    assert SIGILL_LINE + "armv9-a, emulated CPU: qemu-aarch64 -cpu cortex-a76)" in str(exc.value)
    assert "uncaught" not in str(exc.value)
    spec = make_op_spec("matmul", {"m": 2, "n": 2, "k": 2})
    a, b, bias = (np.zeros(s, np.float32) for s in spec.operand_shapes)
    with pytest.raises(DeviceError) as exc:   # with the operator's shapes, as the pipeline runs it
        qemu_run(sve_binary, spec, a, b, bias, qemu_cpu="cortex-a76", march="armv9-a")
    assert SIGILL_LINE + "armv9-a, emulated CPU: qemu-aarch64 -cpu cortex-a76)" in str(exc.value)


# --------------------------------------------------------------------------------------------
# interrupts during a device run
# --------------------------------------------------------------------------------------------

@needs_arm
@pytest.mark.adb
@pytest.mark.parametrize("sig,status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)],
                         ids=["SIGINT", "SIGTERM"])
def test_interrupt_during_a_device_run_leaves_nothing(server, sd865, tmp_path, sig, status):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen([XFC, "bench", *SMALL, "--device", sd865.serial, "--adb-port", str(server.port),
                             "--repeat", "100000000", "--timeout", "600"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp)}, preexec_fn=signals_as_default)
    try:
        deadline = time.monotonic() + 240
        # wait until the harness runs on the device, under qemu in the sandbox (the device lists the
        # process a moment before it starts the emulator: wait for both)
        while not (sd865.system.processes and emulators_of(sd865)):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the harness never started under qemu in the sandbox"
            time.sleep(0.05)
        time.sleep(0.3)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == status, err
    assert "Traceback" not in err
    # The device: no run directory, no harness process, no emulator left behind.
    deadline = time.monotonic() + 10
    while (run_dirs(sd865) or sd865.system.processes or emulators_of(sd865)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert run_dirs(sd865) == [] and not sd865.system.processes and emulators_of(sd865) == []
    # The runner looked for a harness still running on the device (and kills it if it is).
    assert any(c.startswith("ps ") for c in sd865.system.commands)
    # The host: no partial build or staging directory.
    assert list(tmp.iterdir()) == []


@needs_arm
@pytest.mark.adb
def test_interrupt_kills_a_harness_that_ignores_the_closed_stream(server, tmp_path):
    # --hang plays a harness that survives its adb stream closing: only the runner's remote
    # `kill` ends it, so this proves the runner kills it on the device before removing files.
    dev = VirtualDevice(soc="snapdragon-865", faults=Faults(hang=True)).start()
    server.connect(dev.serial)
    proc = None
    try:
        proc = subprocess.Popen([XFC, "bench", *SMALL, "--device", dev.serial, "--adb-port", str(server.port),
                                 "--repeat", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "TMPDIR": str(tmp_path)}, preexec_fn=signals_as_default)
        deadline = time.monotonic() + 240
        while not dev.system.processes:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        assert not dev.system.processes and run_dirs(dev) == []
        assert any(c.startswith("kill -9 ") for c in dev.system.commands)
        assert list(tmp_path.iterdir()) == []
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        server.disconnect(dev.serial)
        dev.stop()
