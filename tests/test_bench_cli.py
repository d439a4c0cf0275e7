"""`xfc bench` end to end: synthesized kernels through the real adb server to the virtual device
(which runs them under qemu-aarch64), and through the local QEMU runner. Output is verified, the
run is pinned to the chosen cluster (checked in the device's taskset log), and errors are one line
that names the problem. Called in-process through xfc.cli.main."""
from __future__ import annotations

import json

import pytest

import support
from android_runner.virtual_device import VirtualDevice
from support import needs_adb, needs_arm
from xfc.cli import main
from xfc.ops.spec import make_spec

CONV_SHAPE = dict(c=8, h=17, w=19, k=12, r=3, s=3)
CONV = ["conv2d", "--hw", "snapdragon-865", "--shape", "c=8,h=17,w=19,k=12,r=3,s=3", "--pad", "1",
        "--bias", "--activation", "relu"]
MATMUL = ["matmul", "--hw", "snapdragon-888", "--shape", "m=33,n=29,k=41", "--bias", "--activation", "relu6"]
SPECS = {"conv2d": make_spec("conv2d", CONV_SHAPE, pad=1, bias=True, activation="relu"),
         "matmul": make_spec("matmul", dict(m=33, n=29, k=41), bias=True, activation="relu6")}


def run(argv, capfd):
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capfd.readouterr()
    return code, out, err


def _mask(cpu_ids):
    return format(sum(1 << i for i in cpu_ids), "x")


@pytest.fixture
def virtual(server):
    dev = VirtualDevice(soc="snapdragon-865").start()
    try:
        server.connect(dev.serial)
        yield dev
    finally:
        server.disconnect(dev.serial)
        dev.stop()


def _check_report(report, argv, cpu_ids, repeats):
    assert report["verified"] is True and report["error_to_bound_ratio"] <= 1.0
    assert report["cpu_ids"] == cpu_ids
    m = report["measurement"]
    assert m["emulated"] is True and m["repeats"] == repeats and len(m["samples_s"]) == repeats
    support.assert_samples_positive(m["samples_s"])
    support.assert_clamps_for_seed(SPECS[argv[0]], 0)
    support.record("neon (qemu)", "ran")


@pytest.mark.adb
@needs_adb
@needs_arm
@pytest.mark.parametrize("argv", [CONV, MATMUL], ids=["conv2d", "matmul"])
def test_bench_on_virtual_device_through_real_adb_server(server, virtual, argv, capfd):
    code, out, err = run(["bench", *argv, "--device", virtual.serial, "--adb-port", str(server.port),
                          "--repeat", "3", "--json"], capfd)
    assert code == 0, err
    report = json.loads(out)
    assert "virtual" in report["measurement"]["where"] and report["cluster"] == "big"
    # Pinned to the big cluster of the SoC description (cpu 4-6 on both SoCs): taskset mask 70.
    _check_report(report, argv, [4, 5, 6], 3)
    mask, harness_argv = virtual.system.taskset_log[-1]
    assert mask == _mask([4, 5, 6]) == "70" and harness_argv[0].endswith("/harness")
    assert not [p for p in virtual.sandbox_files() if p.startswith("/data/local/tmp/xfc/") and p.count("/") > 4]


@pytest.mark.adb
@needs_adb
@needs_arm
def test_bench_cluster_selects_the_cores(server, virtual, capfd):
    code, out, err = run(["bench", *CONV, "--cluster", "little", "--threads", "4", "--device", virtual.serial,
                          "--adb-port", str(server.port), "--repeat", "2", "--json"], capfd)
    assert code == 0, err
    report = json.loads(out)
    assert report["cluster"] == "little" and report["tiles"]["threads"] == 4
    _check_report(report, CONV, [0, 1, 2, 3], 2)
    assert virtual.system.taskset_log[-1][0] == "f"


@pytest.mark.emulated
@needs_arm
@pytest.mark.parametrize("argv", [CONV, MATMUL], ids=["conv2d", "matmul"])
def test_bench_under_qemu(argv, capfd):
    code, out, err = run(["bench", *argv, "--device", "qemu", "--repeat", "2", "--json"], capfd)
    assert code == 0, err
    report = json.loads(out)
    assert "emulated" in report["measurement"]["where"] and "qemu" in report["measurement"]["where"]
    _check_report(report, argv, [4, 5, 6], 2)


@pytest.mark.emulated
@needs_arm
def test_bench_table(capfd):
    code, out, err = run(["bench", *MATMUL, "--device", "qemu", "--repeat", "2"], capfd)
    assert code == 0, err
    rows = {ln.split()[0]: ln for ln in out.splitlines() if ln.strip()}
    for key in ("operator", "hardware", "measured", "verified", "median", "GFLOP/s", "predicted", "throttling",
                "synthesis"):
        assert key in rows, (key, out)
    assert "snapdragon-888, big cluster, CPUs [4, 5, 6]" in rows["hardware"]
    assert rows["verified"].split()[1] == "yes" and "(2 runs;" in rows["median"]
    assert "(emulated: not phone speed)" in rows["GFLOP/s"] and "static cost model" in rows["predicted"]
    assert "[xfc] synthesized in" in err
    support.record("neon (qemu)", "ran")


@pytest.mark.adb
@needs_adb
def test_bench_without_device_is_one_line_error(server, capfd):
    code, out, err = run(["bench", *MATMUL, "--device", "adb", "--adb-port", str(server.port)], capfd)
    assert code == 3, err
    lines = [ln for ln in err.splitlines() if ln.startswith("xfc: error")]
    assert len(lines) == 1 and "no Android device found" in lines[0] and "Traceback" not in err


@pytest.mark.host
def test_bench_refuses_host_description(capfd):
    code, out, err = run(["bench", "matmul", "--hw", "host", "--shape", "m=4,n=4,k=4", "--device", "qemu"], capfd)
    assert code == 2 and "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("xfc: error")]
    assert len(lines) == 1 and "xfc bench runs ARM kernels on a device or QEMU" in lines[0]
    assert "xfc synth ... --hw host --bench" in lines[0]
