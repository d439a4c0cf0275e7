"""Runners end to end: QemuRunner locally, AdbRunner through a private adb server and the
virtual device, including every failure mode the AdbRunner must report as DeviceError."""
from __future__ import annotations

import json

import numpy as np
import pytest

import support
from android_runner.testbed import AdbServer, build_standin, free_port
from android_runner.virtual_device import Faults, VirtualDevice
from xfc.errors import DeviceError, ToolchainError
from xfc.runners import WHERE_VIRTUAL, get_runner, hexmask, make_spec, where_qemu
from xfc.runners.adb import AdbRunner, parse_getprop
from xfc.runners.base import parse_report
from xfc.runners.qemu import QemuRunner
from xfc.hardware.identity import identity_from, match_identity, shipped_socs

from support import HAVE_ARM, needs_adb, needs_arm

RNG = np.random.default_rng(5)
A = RNG.standard_normal(3 * 64).astype(np.float32)
B = RNG.standard_normal(3 * 64).astype(np.float32)
BIAS = RNG.standard_normal(64).astype(np.float32)
EXPECTED = (A + B + np.tile(BIAS, 3)).reshape(3, 64)


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    if not HAVE_ARM:
        pytest.skip("no qemu-aarch64 / aarch64 gcc")
    return build_standin(tmp_path_factory.mktemp("standin"))


def spec(harness, **kw):
    kw.setdefault("output_shape", (3, 64))
    kw.setdefault("repeat", 3)
    return make_spec(harness, A, B, BIAS, **kw)


# --------------------------------------------------------------------------------------------
# pure helpers
# --------------------------------------------------------------------------------------------

@pytest.mark.unit
def test_hexmask():
    assert hexmask([4, 5, 6, 7]) == "f0"
    assert hexmask([7]) == "80"
    assert hexmask([0, 1, 2, 3]) == "f"
    with pytest.raises(DeviceError):
        hexmask([])


@pytest.mark.unit
def test_parse_report_rejects_garbage():
    good = {"kernel": "k", "repeats": 2, "median_s": 1.0, "min_s": 1.0, "max_s": 1.0,
            "samples_s": [1.0, 1.0]}
    assert parse_report("noise\n" + json.dumps(good) + "\n", "x")["kernel"] == "k"
    with pytest.raises(DeviceError, match="0 JSON lines"):
        parse_report("no json here", "x")
    with pytest.raises(DeviceError, match="2 JSON lines"):
        parse_report(json.dumps(good) + "\n" + json.dumps(good), "x")
    with pytest.raises(DeviceError, match="samples_s"):
        parse_report(json.dumps({**good, "samples_s": []}), "x")


@pytest.mark.unit
def test_parse_getprop_and_soc_match():
    props = parse_getprop("[ro.board.platform]: [kona]\n[ro.soc.model]: [SM8250]\n[x]: []\n")
    assert props == {"ro.board.platform": "kona", "ro.soc.model": "SM8250", "x": ""}
    assert match_identity(identity_from("s", props, "")).name == "snapdragon-865"
    assert match_identity(identity_from("s", {"ro.board.platform": "taro"}, "")).name == "snapdragon-8-gen-1"
    assert match_identity(identity_from("s", {"ro.board.platform": "unknownplatform"}, "")).name is None
    for soc in shipped_socs():   # topology sanity: cpu ids 0..n-1 exactly once
        ids = sorted(i for c in soc.clusters for i in c.cpu_ids)
        assert ids == list(range(sum(c.count for c in soc.clusters)))


@pytest.mark.unit
def test_get_runner_kinds():
    assert isinstance(get_runner("qemu"), QemuRunner)
    assert get_runner("qemu:cortex-a76").cpu == "cortex-a76"
    r = get_runner("127.0.0.1:5599", adb_port=5038, cpu_ids=(4, 5))
    assert isinstance(r, AdbRunner) and r.requested_serial == "127.0.0.1:5599"
    assert r.adb_port == 5038 and r.cpu_ids == (4, 5)
    assert get_runner("adb").requested_serial is None


# --------------------------------------------------------------------------------------------
# QemuRunner
# --------------------------------------------------------------------------------------------

@pytest.mark.emulated
@needs_arm
def test_qemu_runner_matches_numpy(harness):
    res = QemuRunner(cpu="cortex-a76").execute(spec(harness, repeat=4, warmup=2))
    np.testing.assert_array_equal(res.output, EXPECTED)
    assert res.where == where_qemu("cortex-a76") and "emulated" in res.where and "cortex-a76" in res.where
    assert res.emulated and res.throttled is None
    assert len(res.samples_s) == 4
    support.assert_samples_positive(res.samples_s)
    assert res.kernel == "standin_add" and res.warmup == 2
    assert any("emulated" in n for n in res.notes)


@pytest.mark.emulated
@needs_arm
def test_qemu_runner_failures(harness, tmp_path):
    with pytest.raises(DeviceError, match="exit 3"):
        QemuRunner().execute(spec(harness, env=(("XFC_STANDIN_FAIL", "1"),)))
    with pytest.raises(ToolchainError, match="not found"):
        QemuRunner().execute(spec(tmp_path / "missing"))
    with pytest.raises(DeviceError, match="expected 10"):
        QemuRunner().execute(spec(harness, output_shape=(10,)))
    with pytest.raises(ToolchainError, match="qemu"):
        QemuRunner(qemu="no-such-qemu-binary").execute(spec(harness))


# --------------------------------------------------------------------------------------------
# AdbRunner with the virtual device
# --------------------------------------------------------------------------------------------

class Device:
    """A connected virtual device; disconnected and stopped on exit."""

    def __init__(self, server, want_state="device", **kw):
        self.server = server
        self.dev = VirtualDevice(**kw).start()
        self.state = server.connect(self.dev.serial, want_state=want_state,
                                    attempt_timeout=1 if want_state == "offline" else 5)

    def runner(self, **kw):
        kw.setdefault("cpu_ids", (4, 5, 6, 7))
        return AdbRunner(serial=self.dev.serial, adb_port=self.server.port, **kw)

    def run_dirs(self):
        return [p for p in self.dev.sandbox_files() if p.startswith("/data/local/tmp/xfc/")]

    def close(self):
        self.server.disconnect(self.dev.serial)
        self.dev.stop()


@pytest.fixture
def device(server):
    made = []

    def make(**kw):
        d = Device(server, **kw)
        made.append(d)
        return d
    yield make
    errors = []
    for d in made:          # every device is closed even if one teardown fails
        try:
            d.close()
        except Exception as exc:  # noqa: BLE001 - reported after the others are closed
            errors.append(exc)
    if errors:
        raise errors[0]


@pytest.mark.adb
@needs_adb
@needs_arm
def test_adb_runner_end_to_end(device, harness):
    d = device(soc="snapdragon-865")
    res = d.runner().execute(spec(harness, repeat=5))
    np.testing.assert_array_equal(res.output, EXPECTED)
    assert res.where == WHERE_VIRTUAL and res.emulated
    assert res.device["model"] == "xfc virtual device (snapdragon-865)"
    assert res.device["hardware"] == "snapdragon-865" and res.device["virtual"]
    assert len(res.samples_s) == 5
    assert res.freq_before == {4: 2420000, 5: 2420000, 6: 2420000, 7: 2840000}
    assert res.freq_after == res.freq_before
    assert len(res.temps_before) == 5 and res.throttled is False
    mask, argv = d.dev.system.taskset_log[-1]
    assert mask == "f0" and argv[0].endswith("/harness") and argv[-4:] == ["--repeat", "5",
                                                                            "--warmup", "1"]
    assert d.run_dirs() == []                      # the run directory was removed
    support.assert_samples_positive(res.samples_s)
    data = json.loads(json.dumps(res.to_dict()))   # serialisable, and what it says survives the round trip
    assert data["samples_s"] == list(res.samples_s) and data["where"] == WHERE_VIRTUAL
    assert data["freq_before_khz"] == {"4": 2420000, "5": 2420000, "6": 2420000, "7": 2840000}
    assert data["output_shape"] == [3, 64] and data["device"]["hardware"] == "snapdragon-865"


@pytest.mark.adb
@needs_adb
@needs_arm
def test_adb_runner_flags_throttling(device, harness):
    d = device(faults=Faults(throttle=True))
    res = d.runner().execute(spec(harness))
    assert res.throttled is True
    assert res.freq_after[4] < 0.9 * res.freq_before[4]
    assert any("clock dropped" in n for n in res.notes)
    assert any("rose" in n for n in res.notes)


@needs_adb
@needs_arm
@pytest.mark.parametrize("faults,match", [
    (Faults(drop_on_run=True), "lost the connection to device .* while trying to run the harness"),
    (Faults(drop_after_bytes=30_000), "lost the connection to device .* push"),
    (Faults(storage_full=True), "storage is full"),
    (Faults(hang=True), "did not finish within 2 s .*killed it on the device"),
], ids=["drop-on-run", "drop-during-push", "storage-full", "hang"])
@pytest.mark.adb
def test_adb_runner_faults_leave_nothing_behind(device, harness, faults, match):
    d = device(faults=faults)
    # Only the hang relies on the timeout; the other faults get a generous one, so a slow machine
    # cannot turn them into a timeout.
    with pytest.raises(DeviceError, match=match) as info:
        d.runner().execute(spec(harness, timeout_s=2 if faults.hang else 120))
    assert "\n" not in str(info.value)
    assert d.run_dirs() == [], "run directory left on the device"
    assert d.dev.system.processes == {}, "harness process left running"


@pytest.mark.adb
@needs_adb
@needs_arm
def test_adb_runner_harness_failure_is_reported(device, harness):
    d = device()
    with pytest.raises(DeviceError, match=r"harness failed on virtual-device .*exit 3.*failing"):
        d.runner().execute(spec(harness, env=(("XFC_STANDIN_FAIL", "1"),)))
    assert d.run_dirs() == []
    assert d.dev.system.commands[-2].startswith("env XFC_STANDIN_FAIL=1 taskset f0 ")


@pytest.mark.adb
@needs_adb
def test_wrong_abi(device, harness):
    d = device(faults=Faults(abi="armeabi-v7a"))
    with pytest.raises(DeviceError, match="ABI 'armeabi-v7a'.*arm64-v8a"):
        d.runner().execute(spec(harness))
    assert d.dev.sandbox_files() == []


@pytest.mark.adb
@needs_adb
def test_unauthorized_and_offline(device, harness):
    d = device(faults=Faults(unauthorized=True), want_state="unauthorized")
    with pytest.raises(DeviceError, match="unauthorized.*Allow USB debugging"):
        d.runner().execute(spec(harness))
    d2 = device(faults=Faults(offline=True), want_state="offline")
    assert d2.state == "offline"
    with pytest.raises(DeviceError, match="is offline"):
        d2.runner().connect()


@pytest.mark.adb
@needs_adb
def test_device_selection_errors(server, device):
    with AdbServer() as empty:     # its own server: devices other tests left on `server` cannot matter
        with pytest.raises(DeviceError, match="no Android device found.*virtual_device"):
            AdbRunner(adb_port=empty.port).connect()
    with pytest.raises(DeviceError, match="'1.2.3.4:5' not found.*adb connect 1.2.3.4:5"):
        AdbRunner(serial="1.2.3.4:5", adb_port=server.port).connect()
    _, d2 = device(), device(soc="snapdragon-888")  # two devices connected
    with pytest.raises(DeviceError, match="several devices are connected"):
        AdbRunner(adb_port=server.port).connect()
    r = AdbRunner(serial=d2.dev.serial, adb_port=server.port).connect()
    assert r.describe()["hardware"] == "snapdragon-888"


@pytest.mark.adb
def test_no_server_and_cannot_start(monkeypatch):
    port = free_port()
    with pytest.raises(DeviceError, match=f"no adb server reachable at 127.0.0.1:{port}"):
        AdbRunner(adb_port=port, start_server=False).connect()
    monkeypatch.setenv("XFC_ADB", "/nonexistent/adb")
    with pytest.raises(DeviceError, match="starting one with /nonexistent/adb failed"):
        AdbRunner(adb_port=port).connect()


@pytest.mark.adb
@needs_adb
def test_vendor_opencl_path(device):
    d = device()
    r = d.runner()
    assert r.vendor_opencl_path() is None
    with pytest.raises(DeviceError, match="no libOpenCL.so in /vendor/lib64 or "
                                          "/system/vendor/lib64"):
        r.vendor_opencl_path(required=True)
    d2 = device(with_opencl=True)
    assert d2.runner().vendor_opencl_path() == "/vendor/lib64/libOpenCL.so"


@pytest.mark.adb
@needs_adb
@needs_arm
def test_vendor_libs_sets_ld_library_path(device, harness):
    d = device()
    d.runner(vendor_libs=True).execute(spec(harness))
    run_cmd = [c for c in d.dev.system.commands if "/harness " in c][-1]
    assert run_cmd.startswith("env LD_LIBRARY_PATH=/vendor/lib64 taskset f0 ")


# --------------------------------------------------------------------------------------------
# xfc devices
# --------------------------------------------------------------------------------------------

@pytest.mark.adb
@needs_adb
def test_cli_devices_table_and_json(server, device, capsys):
    from xfc.cli import main
    d = device(soc="snapdragon-865")
    assert main(["devices", "--adb-port", str(server.port)]) == 0
    out = capsys.readouterr().out
    line = [ln for ln in out.splitlines() if d.dev.serial in ln][0]
    assert "xfc virtual device (snapdragon-865)" in line and "arm64-v8a" in line
    assert "SM8250" in line and "snapdragon-865" in line
    assert main(["devices", "--adb-port", str(server.port), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    row = [r for r in data["devices"] if r["serial"] == d.dev.serial][0]
    assert row["hardware"] == "snapdragon-865" and row["virtual"] is True


@pytest.mark.unit
def test_cli_devices_without_server(capsys):
    from xfc.cli import main
    assert main(["devices", "--adb-port", str(free_port()), "--no-start-server"]) == 0
    cap = capsys.readouterr()
    assert "serial" in cap.out and "adb connect 127.0.0.1:5599" in cap.out
    assert "Traceback" not in cap.out + cap.err
    assert "no adb server reachable" in cap.err


# --------------------------------------------------------------------------------------------
# the "times-file" harness form (templates/cpu/harness.c.j2)
# --------------------------------------------------------------------------------------------

@pytest.mark.unit
def test_report_from_times():
    from xfc.runners.base import Measurement, report_from_times
    rep = report_from_times("3e-3\n1e-3\n2e-3\n4e-3\n", "x", "k")
    assert rep["samples_s"] == [3e-3, 1e-3, 2e-3, 4e-3] and rep["repeats"] == 4 and rep["kernel"] == "k"
    m = Measurement.from_samples(rep["samples_s"], where="x", emulated=True)
    assert m.median_s == pytest.approx(2.5e-3) and m.min_s == 1e-3 and m.max_s == 4e-3 and m.repeats == 4
    with pytest.raises(DeviceError, match="not numbers"):
        report_from_times("abc", "x")
    with pytest.raises(DeviceError, match="no valid"):
        report_from_times("", "x")


@pytest.mark.emulated
@needs_arm
def test_qemu_runner_times_file_protocol(harness):
    res = QemuRunner().execute(spec(harness, protocol="times-file", repeat=4, label="add"))
    np.testing.assert_array_equal(res.output, EXPECTED)
    assert len(res.samples_s) == 4 and res.kernel == "add"


@pytest.mark.adb
@needs_adb
@needs_arm
def test_adb_runner_times_file_protocol(device, harness):
    d = device()
    res = d.runner().execute(spec(harness, protocol="times-file", repeat=3, warmup=0))
    np.testing.assert_array_equal(res.output, EXPECTED)
    assert len(res.samples_s) == 3 and res.where == WHERE_VIRTUAL
    _mask, argv = d.dev.system.taskset_log[-1]
    assert argv[-3:] == [argv[-3], "0", "3"] and argv[-3].endswith("/times.txt")
    assert d.run_dirs() == []
