"""`xfc tiledb build --executor ray` on a real local Ray cluster: a head node on 127.0.0.1 (no
phones) and a second node (`xfc cluster join`) whose adb server sees the virtual Snapdragon 865.
Device tasks run only on that node; a Ray worker killed mid-task is retried and the build
completes (or, with no retries left, reports the task not measured and writes no row for it);
a static build through Ray exports exactly what the local executor's does. Ray's processes are
found by a marker in their environment and killed at the end, whatever the outcome. Without Ray,
--executor ray is one line, exit 2. No speed is asserted."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from android_runner.testbed import free_port
from xfc.tiledb.cluster import EXPOSE_WARNING, start_args
from xfc.errors import XfcError
from xfc.tiledb.ray_executor import missing_resources, phone_resources, wrong_phones

REPO = Path(__file__).resolve().parent.parent
HW = "snapdragon-865"
CLUSTER = "prime"
TILES = "4x8,8x8,6x8"      # three device tiles: long enough to kill a worker in the middle
SOCKET_TAIL = "/session_2026-11-23_22-40-10_751857_1271/sockets/plasma_store.1"   # what Ray appends
HAVE_ARM = bool(shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-gcc"))
try:
    import ray  # noqa: F401
    HAVE_RAY = True
except ImportError:
    HAVE_RAY = False



def tile_count() -> int:
    """Micro-tile tasks of TILES on the prime cluster (some shapes have several A-load variants)."""
    from xfc.cpu.isa import isa_for
    from xfc.cpu.tiles import enumerate_micro_tiles
    from xfc.hardware.load import load
    core = load(HW).cluster(CLUSTER).core
    shapes = {tuple(int(v) for v in t.split("x")) for t in TILES.split(",")}
    return sum((t.mr, t.nr) in shapes for t in enumerate_micro_tiles(core, isa_for(core)))


def env(marker: str = "") -> dict:
    out = {k: v for k, v in os.environ.items() if k != "XFC_DEBUG"}
    out["PYTHONPATH"] = str(REPO)
    out["SOURCE_DATE_EPOCH"] = "1700000000"
    out["RAY_USAGE_STATS_ENABLED"] = "0"
    if marker:
        out["XFC_TEST_RAY_MARK"] = marker
    return out


def xfc(*args, marker: str = "", timeout: float = 240):
    return subprocess.run([sys.executable, "-m", "xfc", *args], capture_output=True, text=True, timeout=timeout,
                          env=env(marker))


def one_line_error(proc, code: int) -> str:
    assert proc.returncode == code, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xfc: error: ") and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


# ---- pure pieces ---------------------------------------------------------------------------------

@pytest.mark.unit
def test_resources_of_phones_and_what_no_node_offers():
    rows = [{"serial": "a1", "state": "device", "hardware": HW}, {"serial": "b2", "state": "unauthorized"},
            {"serial": "c3", "state": "device", "hardware": None}, {"serial": "d4", "state": "device", "error": "x"}]
    assert phone_resources(rows) == {"xfc-phone:a1": 1.0, f"xfc-soc:{HW}": 1.0, "xfc-phone:c3": 1.0}
    have = {"CPU": 2.0, "xfc-phone:a1": 1.0, f"xfc-soc:{HW}": 1.0}
    assert missing_resources({"xfc-phone:a1": 1.0}, have, HW) is None
    assert "holds phone zz" in missing_resources({"xfc-phone:zz": 1.0}, have, HW)
    assert "no node of the Ray cluster holds a dimensity-9000 phone" in missing_resources(
        {"xfc-phone:zz": 1.0}, have, "dimensity-9000")
    assert "fingerprint 0123456789ab" in missing_resources({"xfc-host:0123456789abcdef": 1.0}, have, None)
    assert wrong_phones({"xfc-phone:a1": 1.0}, [have], HW) is None
    assert f"are {HW}, not dimensity-9000" in wrong_phones({"xfc-phone:a1": 1.0}, [have], "dimensity-9000")


@pytest.mark.unit
def test_nodes_get_127_0_0_1_unless_exposed():
    common = dict(head=True, address=None, port=7000, resources={"xfc-qemu": 1.0}, num_cpus=1,
                  object_store_bytes=None, temp_dir=None, node_ip=None)
    local = start_args(expose=False, **common)
    assert local[local.index("--node-ip-address") + 1] == "127.0.0.1"
    assert local[local.index("--dashboard-host") + 1] == "127.0.0.1" and "--block" in local
    assert json.loads(local[local.index("--resources") + 1]) == {"xfc-qemu": 1.0}
    assert "--node-ip-address" not in start_args(expose=True, **common)
    assert "anyone who can reach" in EXPOSE_WARNING and "run any code" in EXPOSE_WARNING


@pytest.mark.unit
@pytest.mark.skipif(not HAVE_RAY, reason="ray is not installed (xfc[ray])")
def test_an_evaluators_error_stops_the_build_a_dead_worker_is_reported():
    import ray.exceptions as ex
    from xfc.errors import VerificationError
    from xfc.hardware.load import load
    from xfc.tiledb.ray_executor import RayExecutor
    executor = RayExecutor("127.0.0.1:1", load(HW), retries=1)      # not connected: failure() is pure
    cause = VerificationError("tile 4x8: C differs")
    wrapped = ex.RayTaskError("measure_on_node", "traceback", cause).as_instanceof_cause()
    with pytest.raises(VerificationError) as raised:
        executor.failure(wrapped)
    assert type(raised.value) is VerificationError and str(raised.value) == "tile 4x8: C differs"
    why = executor.failure(ex.WorkerCrashedError())
    assert why.startswith("WorkerCrashedError after 1 retry: The worker died") and "\n" not in why
    assert executor.failure(KeyError("x")) is None
    with pytest.raises(XfcError):
        RayExecutor("127.0.0.1:1", load(HW), retries=-1)


@pytest.mark.subprocess
def test_without_ray_the_ray_executor_is_one_line_exit_2(tmp_path):
    hide = ("import sys, importlib.abc\n"
            "class NoRay(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'ray' or name.startswith('ray.'):\n"
            "            raise ImportError('hidden ray')\n"
            "sys.meta_path.insert(0, NoRay())\n"
            "from xfc.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    db = tmp_path / "t.sqlite"
    proc = subprocess.run([sys.executable, "-c", hide, "tiledb", "build", "--hw", HW, "--evaluators", "static",
                           "--executor", "ray", "--address", "127.0.0.1:1", "--db", str(db)],
                          capture_output=True, text=True, timeout=120, env=env())
    line = one_line_error(proc, 2)
    assert "pip install 'xfc[ray]'" in line and not db.exists()
    proc = subprocess.run([sys.executable, "-c", hide, "cluster", "join", "--address", "127.0.0.1:1", "--no-adb"],
                          capture_output=True, text=True, timeout=120, env=env())
    assert "pip install 'xfc[ray]'" in one_line_error(proc, 2)


# ---- a real cluster ------------------------------------------------------------------------------

def marked_pids(marker: str) -> list[int]:
    """Processes of this user whose environment carries the marker (Ray renames its workers)."""
    out = []
    needle = f"XFC_TEST_RAY_MARK={marker}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                out.append(int(entry.name))
        except OSError:
            continue
    return out


def stop_groups(procs: list[subprocess.Popen], grace_s: float = 4.0) -> None:
    """SIGTERM every node's process group, SIGKILL what is left after grace_s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in procs:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
        end = time.monotonic() + grace_s
        while sig == signal.SIGTERM and time.monotonic() < end and any(p.poll() is None for p in procs):
            time.sleep(0.2)
    for proc in procs:
        proc.wait(timeout=10)


def wait_for_nodes(address: str, marker: str, count: int, node: subprocess.Popen, log: Path, token: Path,
                   deadline_s: float = 180.0) -> list[dict]:
    """The cluster's live nodes once there are count of them (a loaded machine starts Ray slowly)."""
    end = time.monotonic() + deadline_s
    while True:
        if node.poll() is not None:
            raise AssertionError(f"the Ray node stopped: {log.read_text()[-600:]}")
        try:
            proc = xfc("cluster", "resources", "--address", address, "--token-file", str(token), marker=marker,
                       timeout=60)
        except subprocess.TimeoutExpired as exc:
            proc = subprocess.CompletedProcess(exc.cmd, -1, "", "timed out")
        if proc.returncode == 0:
            nodes = [n for n in json.loads(proc.stdout) if n["alive"]]
            if len(nodes) >= count:
                return nodes
        if time.monotonic() > end:
            raise AssertionError(f"the Ray cluster at {address} did not get {count} nodes: {proc.stderr[-400:]}")
        time.sleep(2)


@pytest.fixture(scope="module")
def device(server):
    from android_runner.virtual_device import VirtualDevice
    dev = VirtualDevice(soc=HW).start()
    assert server.connect(dev.serial) == "device"
    yield dev
    server.disconnect(dev.serial)
    dev.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, server, device):
    """(address, marker, phone node id, token file): a head without phones, a worker holding the device."""
    if not (HAVE_RAY and HAVE_ARM):
        pytest.skip("needs ray, qemu-aarch64 and aarch64 gcc")
    root = tmp_path_factory.mktemp("ray")
    marker = root.name + str(os.getpid())
    port = free_port()
    address = f"127.0.0.1:{port}"
    # Ray's sockets live under its temp dir and an AF_UNIX path holds 107 bytes: under xdist the
    # test's tmp path can be too long, then a short private directory under /tmp is used (removed below)
    ray_tmp = root if len(str(root)) + len(SOCKET_TAIL) + 8 <= 107 else Path(tempfile.mkdtemp(prefix="xr"))
    token = root / "cluster.token"
    small = ["--num-cpus", "1", "--object-store-mb", "80", "--temp-dir", str(ray_tmp), "--token-file", str(token)]
    procs = []
    try:
        for args, log in ((["cluster", "head", "--port", str(port), "--no-adb", *small], "head.log"),
                          (["cluster", "join", "--address", address, "--adb-port", str(server.port), *small],
                           "join.log")):
            with open(root / log, "w") as out:
                procs.append(subprocess.Popen([sys.executable, "-m", "xfc", *args], stdout=out,
                                              stderr=subprocess.STDOUT, env=env(marker), start_new_session=True))
            wait_for_nodes(address, marker, len(procs), procs[-1], root / log, token)
        nodes = wait_for_nodes(address, marker, 2, procs[-1], root / "join.log", token)
        [phone_node] = [n for n in nodes if f"xfc-phone:{device.serial}" in n["resources"]]
        assert phone_node["resources"][f"xfc-soc:{HW}"] == 1.0
        assert not any(k.startswith("xfc-phone:") for n in nodes if n is not phone_node for k in n["resources"])
        yield address, marker, phone_node["node"], token
    finally:
        stop_groups(procs)
        for pid in marked_pids(marker):        # anything Ray started outside the groups
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if ray_tmp != root:
            shutil.rmtree(ray_tmp, ignore_errors=True)
        assert not marked_pids(marker) or time.sleep(2) or not marked_pids(marker)


def ran(out: str) -> dict[str, dict[str, int]]:
    """'ran SOURCE: N on PLACE, ...' lines -> {source: {node id: tasks}}."""
    places: dict[str, dict[str, int]] = {}
    for line in out.splitlines():
        if line.startswith("ran "):
            source, _, rest = line[4:].partition(": ")
            for item in rest.split(", "):
                n, _, place = item.partition(" on ")
                places.setdefault(source, {})[place.rsplit("/", 1)[1]] = int(n)
    return places


def kill_one_device_task(marker: str, proc: subprocess.Popen, source: str, timeout_s: float = 150) -> int:
    """SIGKILL the Ray worker running a device task (its process title is 'ray::xfc <source>')."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and proc.poll() is None:
        for pid in marked_pids(marker):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmd.startswith(f"ray::xfc {source}".encode()) and b"XFC_CLUSTER_NODE=worker" in environ:
                os.kill(pid, signal.SIGKILL)
                return pid
        time.sleep(0.05)
    raise AssertionError("no device task was seen running: " + (proc.communicate()[1] or "")[-600:])


def tile_rows(db: Path, source: str) -> int:
    import sqlite3
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT COUNT(*) FROM tile WHERE source = ?", (source,)).fetchone()[0]


@pytest.mark.parametrize("retries", [2, 0])
@pytest.mark.adb
def test_device_tasks_run_on_the_phone_node_and_a_killed_worker(cluster, device, tmp_path, retries):
    address, marker, phone_node, token = cluster
    db = tmp_path / "tiles.sqlite"
    args = [sys.executable, "-m", "xfc", "tiledb", "build", "--hw", HW, "--cluster", CLUSTER, "--tiles", TILES,
            "--evaluators", f"static,adb:{device.serial}", "--executor", "ray", "--address", address,
            "--token-file", str(token),
            "--retries", str(retries), "--db", str(db), "--quiet"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(marker))
    try:
        kill_one_device_task(marker, proc, f"adb:{device.serial}")
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    source = f"adb:{device.serial}"
    n = tile_count()
    places = ran(out)
    assert set(places[source]) == {phone_node}, out          # every device task on the phone's node
    if retries:
        assert proc.returncode == 0, out + err
        assert places[source][phone_node] == n and tile_rows(db, source) == n and "not measured" not in out
    else:
        # no retry left: one task reported with why, no row for it, the others written; exit 3
        assert proc.returncode == 3, out + err
        [why] = [line for line in out.splitlines() if line.startswith("not measured: ")]
        assert "WorkerCrashedError" in why or "died" in why.lower(), why
        assert "could not be measured" in err and len(err.strip().splitlines()) == 1, err
        assert places[source][phone_node] == n - 1 and tile_rows(db, source) == n - 1
        # a re-run measures just that one
        again = xfc("tiledb", "build", "--hw", HW, "--cluster", CLUSTER, "--tiles", TILES, "--evaluators",
                    f"static,adb:{device.serial}", "--executor", "ray", "--address", address,
                    "--token-file", str(token), "--db", str(db),
                    "--quiet", marker=marker, timeout=300)
        assert again.returncode == 0 and sum(ran(again.stdout)[source].values()) == 1, again.stdout + again.stderr
        assert tile_rows(db, source) == n
    assert tile_rows(db, "static") == n
    assert xfc("tiledb", "verify", "--db", str(db)).returncode == 0


@pytest.mark.adb
def test_a_static_build_through_ray_exports_what_the_local_one_does(cluster, tmp_path):
    address, marker, _, token = cluster
    exports = []
    for executor in (["--jobs", "2"], ["--executor", "ray", "--address", address, "--token-file", str(token)]):
        db = tmp_path / f"{executor[1]}.sqlite"
        proc = xfc("tiledb", "build", "--hw", HW, "--evaluators", "static", "--ops", "gemm", "--db", str(db),
                   "--quiet", *executor, marker=marker)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        out = xfc("tiledb", "export", "--db", str(db))
        assert out.returncode == 0, out.stderr
        exports.append(out.stdout)
    assert exports[0] == exports[1] and exports[0].count('"kind":"tile"') > 50
    # the other path: two hosts build a cluster each and merge; the same records again
    parts = [tmp_path / "prime.sqlite", tmp_path / "rest.sqlite"]
    for db, clusters in zip(parts, (["prime"], ["big", "little"])):
        for role in clusters:
            proc = xfc("tiledb", "build", "--hw", HW, "--cluster", role, "--evaluators", "static", "--db", str(db),
                       "--quiet")
            assert proc.returncode == 0, proc.stderr
    assert xfc("tiledb", "merge", str(parts[1]), "--db", str(parts[0])).returncode == 0
    assert xfc("tiledb", "export", "--db", str(parts[0])).stdout == exports[1]


@pytest.mark.adb
def test_no_node_for_the_phone_or_soc_fails_fast(cluster, device, tmp_path):
    address, marker, _, token = cluster
    db = tmp_path / "t.sqlite"
    line = one_line_error(xfc("tiledb", "build", "--hw", HW, "--evaluators", "adb:no-such-phone", "--executor", "ray",
                              "--address", address, "--token-file", str(token), "--db", str(db), marker=marker), 3)
    assert "holds phone no-such-phone" in line
    line = one_line_error(xfc("tiledb", "build", "--hw", "dimensity-9000", "--evaluators", f"adb:{device.serial}",
                              "--executor", "ray", "--address", address, "--token-file", str(token), "--db", str(db),
                              marker=marker), 3)
    assert "dimensity-9000" in line
    import sqlite3
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM tile").fetchone()[0] == 0


NO_TOKEN_PROBE = ("import sys, ray\n"
                  "try:\n"
                  "    ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False)\n"
                  "except Exception as exc:\n"
                  "    print('refused:', type(exc).__name__, ' '.join(str(exc).split())[:300])\n"
                  "    sys.exit(7)\n"
                  "print('connected', len(ray.nodes()))\n")


@pytest.mark.adb
def test_a_client_without_the_clusters_token_is_refused(cluster, tmp_path):
    """Ray's servers listen on every interface: the token is what keeps strangers out."""
    address, marker, _, token = cluster
    wrong = tmp_path / "wrong.token"
    wrong.write_text("xfc1-" + "0" * 64)
    line = one_line_error(xfc("tiledb", "build", "--hw", HW, "--evaluators", "static", "--executor", "ray",
                              "--address", address, "--token-file", str(wrong), "--db", str(tmp_path / "t.sqlite"),
                              marker=marker, timeout=120), 2)
    assert "refused this token" in line, line
    # Ray's own client, no token and no token mode (a stranger's plain `ray.init(address=...)`)
    bare = {k: v for k, v in env(marker).items() if not k.startswith("RAY_AUTH")}
    bare["HOME"] = str(tmp_path)                        # no ~/.ray/auth_token to fall back on
    proc = subprocess.run([sys.executable, "-c", NO_TOKEN_PROBE, address], capture_output=True, text=True,
                          timeout=120, env=bare)
    assert proc.returncode == 7 and "refused:" in proc.stdout, proc.stdout + proc.stderr[-600:]
    # the right token still works (the builds above use it too)
    assert xfc("cluster", "resources", "--address", address, "--token-file", str(token), marker=marker,
               timeout=120).returncode == 0
