"""`xfc bench` end to end: synthesized kernels through the real adb server to the virtual device
(which runs them under qemu-aarch64), and through the local QEMU runner. Output is verified."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from android_runner.virtual_device import VirtualDevice

XFC = shutil.which("xfc", path=str(Path(sys.executable).parent)) or "xfc"
CONV = ["conv2d", "--hw", "snapdragon-865", "--shape", "c=8,h=17,w=19,k=12,r=3,s=3", "--pad", "1",
        "--bias", "--activation", "relu"]
MATMUL = ["matmul", "--hw", "snapdragon-888", "--shape", "m=33,n=29,k=41"]


def xfc(*args, env=None):
    return subprocess.run([XFC, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


@pytest.fixture
def virtual(server):
    dev = VirtualDevice(soc="snapdragon-865").start()
    server.connect(dev.serial)
    yield dev
    server.disconnect(dev.serial)
    dev.stop()


@pytest.mark.parametrize("argv", [CONV, MATMUL], ids=["conv2d", "matmul"])
def test_bench_on_virtual_device_through_real_adb_server(server, virtual, argv):
    proc = xfc("bench", *argv, "--device", virtual.serial, "--adb-port", str(server.port), "--repeat", "3", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["verified"] is True
    m = report["measurement"]
    assert "virtual" in m["where"] and m["emulated"] is True and m["repeats"] == 3
    # Pinned to the big cluster of the SoC description, and nothing left on the device.
    assert report["cpu_ids"] and not [p for p in virtual.sandbox_files() if p.startswith("/data/local/tmp/xfc/")
                                      and p.count("/") > 4]


@pytest.mark.parametrize("argv", [CONV, MATMUL], ids=["conv2d", "matmul"])
def test_bench_under_qemu(argv):
    proc = xfc("bench", *argv, "--device", "qemu", "--repeat", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["verified"] is True and "emulated" in report["measurement"]["where"]


def test_bench_without_device_is_one_line_error(server):
    proc = xfc("bench", *MATMUL, "--device", "adb", "--adb-port", str(server.port))
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("xfc: error") == 1


def test_bench_refuses_host_description():
    proc = xfc("bench", "matmul", "--hw", "host", "--shape", "m=4,n=4,k=4", "--device", "qemu")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
