"""`xfc tiledb build --executor ray` on a real local Ray cluster: a head node on 127.0.0.1 (no
phones) and a second node (`xfc cluster join`) whose adb server sees the virtual Snapdragon 865.
Device tasks run only on that node; a Ray worker killed mid-task is retried and the build
completes (or, with no retries left, reports the task not measured and writes no row for it);
a static build through Ray exports exactly what the local executor's does. Where the nodes listen:
with the defaults every listening socket of a head, a join and a build's driver is on loopback;
with --expose --node-ip 127.0.0.2 on that address or loopback, except the servers Ray cannot bind
there, which the warning lines name with their ports. SIGINT / SIGTERM to a node (and the death of
its `ray start`) leave no process and no listening port. Ray's processes are found in /proc (process
trees, sessions, a marker in their environment) and killed at the end, whatever the outcome.
Without Ray, --executor ray is one line, exit 2. No speed is asserted."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from android_runner.testbed import free_port
from support import (is_loopback, listeners_by_tree, listening_inodes, listening_ports, listening_sockets,
                     process_identity, process_tree, session_members, session_of, signals_as_default, still_running,
                     stop_node_processes, tree_listeners)
from xfc.tiledb.cluster import EXPOSE_WARNING, start_args
from xfc.tiledb.raybind import (LAUNCHER, ExposedPorts, exposure_warnings, is_loopback_host, keep_loopback,
                                loopback_kept)
from xfc.errors import XfcError
from xfc.tiledb.ray_executor import missing_resources, phone_resources, wrong_phones

REPO = Path(__file__).resolve().parent.parent
HW = "snapdragon-865"
CLUSTER = "prime"
TILES = "4x8,8x8,6x8"      # three device tiles: long enough to kill a worker in the middle
SOCKET_TAIL = "/session_2026-11-23_22-40-10_751857_1271/sockets/plasma_store.1"   # what Ray appends
HAVE_ARM = bool(shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-gcc"))
# Found, not imported: importing Ray costs a second at collection, and a broken install should fail
# the tests that use it, not skip them.
HAVE_RAY = importlib.util.find_spec("ray") is not None



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
                  object_store_bytes=None, temp_dir=None)
    local = start_args(**common)
    assert local[local.index("--node-ip-address") + 1] == "127.0.0.1"
    assert local[local.index("--dashboard-host") + 1] == "127.0.0.1" and "--block" in local
    assert json.loads(local[local.index("--resources") + 1]) == {"xfc-qemu": 1.0}
    assert "--node-manager-port" not in local and "--min-worker-port" not in local
    ports = ExposedPorts(node_manager=41001, object_manager=41002, dashboard_agent_grpc=41003, metrics_export=41004)
    exposed = start_args(node_ip="192.0.2.7", exposed=ports, **common)
    assert exposed[exposed.index("--node-ip-address") + 1] == "192.0.2.7"
    assert exposed[exposed.index("--dashboard-host") + 1] == "127.0.0.1"       # the dashboard stays local
    for option, value in (("--node-manager-port", 41001), ("--object-manager-port", 41002),
                          ("--dashboard-agent-grpc-port", 41003), ("--metrics-export-port", 41004),
                          ("--min-worker-port", 10002), ("--max-worker-port", 19999)):
        assert exposed[exposed.index(option) + 1] == str(value)
    assert "anyone who can reach" in EXPOSE_WARNING and "run any code" in EXPOSE_WARNING
    # the warning lines name every process that listens on every interface, with the ports passed above
    head = exposure_warnings("192.0.2.7", 7000, ports, dashboard_agent=True)
    assert [line.split(": ", 1)[1].split(",")[0] for line in head] == [
        "gcs_server (GCS)", "raylet", "core workers (every task worker and driver on this node)", "dashboard agent"]
    assert "port 7000" in head[0] and "41001 (node manager) and 41002 (object manager)" in head[1]
    assert "10002-19999" in head[2] and "41003 (gRPC) and 41004 (metrics)" in head[3]
    assert all("192.0.2.7" in line and "every interface" in line for line in head)
    assert [line.split(": ", 1)[1].split(",")[0] for line in exposure_warnings("192.0.2.7", None, ports, False)] == [
        "raylet", "core workers (every task worker and driver on this node)"]
    assert exposure_warnings("127.0.0.1", 7000, ports, True) == []


@pytest.mark.unit
def test_a_loopback_address_stays_loopback_for_ray():
    """Ray's resolve_ip_for_localhost turns 127.0.0.1 into the host's network address; xfc's
    replacement (in-process and in the `ray start` launcher) keeps it."""
    network = lambda host: "192.0.2.9"              # noqa: E731 - what Ray's own function returns here
    kept = keep_loopback(network)
    assert kept("127.0.0.1") == "127.0.0.1" and kept("localhost") == "127.0.0.1"
    assert kept("10.1.2.3") == "192.0.2.9" and kept("::1") == "192.0.2.9"
    launcher = LAUNCHER.replace("import ray._private.services as services\n", "").replace(
        "from ray.scripts.scripts import main\n", "").replace("sys.exit(main())\n", "")
    services = type("services", (), {"resolve_ip_for_localhost": staticmethod(network)})
    exec(launcher, {"services": services, "sys": type("sys", (), {"argv": ["-c"]})})   # the launcher's patch alone
    assert services.resolve_ip_for_localhost("127.0.0.1") == "127.0.0.1"
    assert services.resolve_ip_for_localhost("10.1.2.3") == "192.0.2.9"
    assert is_loopback_host("127.0.0.2") and is_loopback_host("[::1]") and not is_loopback_host("10.0.0.1")


@pytest.mark.unit
@pytest.mark.skipif(not HAVE_RAY, reason="ray is not installed (xfc[ray])")
def test_the_ray_function_xfc_replaces_is_there_and_is_restored():
    import ray._private.services as services
    original = services.resolve_ip_for_localhost
    with loopback_kept():
        assert services.resolve_ip_for_localhost("127.0.0.1") == "127.0.0.1"
    assert services.resolve_ip_for_localhost is original


@pytest.mark.unit
@pytest.mark.skipif(not HAVE_RAY, reason="ray is not installed (xfc[ray])")
def test_node_ip_needs_expose_and_expose_needs_an_address_of_this_host(tmp_path, capsys):
    from xfc.cli import main
    token = tmp_path / "t.token"
    for args, words in ((["head", "--node-ip", "127.0.0.2"], "only with --expose"),
                        (["head", "--expose"], "--expose needs --node-ip ADDR"),
                        (["head", "--expose", "--node-ip", "0.0.0.0"], "not the address of one interface"),
                        (["head", "--expose", "--node-ip", "::1"], "IPv4"),
                        (["head", "--expose", "--node-ip", "no-such-address"], "not an IPv4 address"),
                        (["head", "--expose", "--node-ip", "192.0.2.254"], "not an address of this host"),
                        (["join", "--address", "192.0.2.1:6379"], "cannot reach a node that listens on 127.0.0.1")):
        assert main(["cluster", *args, "--no-adb", "--token-file", str(token)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("xfc: error: ") and len(err.strip().splitlines()) == 1 and words in err, err
    assert not token.exists()                   # refused before a token is written


@pytest.mark.unit
@pytest.mark.parametrize("argv, words", [
    (["head", "--port", "99999"], "argument --port: must be a TCP port 1-65535, got '99999'"),
    (["head", "--port", "0"], "argument --port: must be a TCP port 1-65535, got '0'"),
    (["head", "--num-cpus", "-1"], "argument --num-cpus: must be an integer >= 0, got '-1'"),
    (["join", "--address", "127.0.0.1:6379", "--num-cpus", "-1"], "argument --num-cpus: must be an integer >= 0"),
    (["head", "--object-store-mb", "0"], "argument --object-store-mb: must be an integer >= 1, got '0'"),
    (["head", "--adb-port", "70000"], "argument --adb-port: must be a TCP port 1-65535, got '70000'"),
    (["join", "--address", "127.0.0.1:6379", "--adb-port", "0"], "argument --adb-port: must be a TCP port"),
    (["resources", "--adb-port", "65536"], "argument --adb-port: must be a TCP port 1-65535, got '65536'"),
])
def test_a_number_out_of_range_is_refused_while_parsing(argv, words, tmp_path, capsys):
    from xfc.cli import main
    token = tmp_path / "t.token"
    with pytest.raises(SystemExit) as exited:
        main(["cluster", *argv, "--no-adb", "--token-file", str(token)])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"xfc: error: xfc cluster {argv[0]}: {words}"), err
    assert not token.exists()


@pytest.mark.unit
@pytest.mark.skipif(not HAVE_RAY, reason="ray is not installed (xfc[ray])")
def test_what_ray_would_refuse_is_one_line_before_anything_starts(tmp_path, capsys):
    from xfc.cli import main
    from xfc.tiledb.raytoken import create_token_file
    fresh, copy = tmp_path / "head.token", tmp_path / "copy.token"
    create_token_file(copy)
    for args, words in ((["head", "--token-file", str(fresh), "--object-store-mb", "10"],
                         "--object-store-mb 10: Ray needs at least 75 MiB"),
                        (["join", "--token-file", str(copy), "--address", "127.0.0.1:99999"],
                         "--address 127.0.0.1:99999: the port must be a TCP port 1-65535, got 99999"),
                        (["join", "--token-file", str(copy), "--address", "127.0.0.1"],
                         "--address 127.0.0.1: not HOST:PORT")):
        assert main(["cluster", *args, "--no-adb"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"xfc: error: {words}") and len(err.strip().splitlines()) == 1, err
    assert not fresh.exists()                   # the head refused before it wrote a token


@pytest.mark.subprocess
def test_head_on_an_impossible_port_is_one_line_exit_2():
    proc = xfc("cluster", "head", "--port", "99999", "--no-adb", timeout=60)
    assert "--port: must be a TCP port 1-65535, got '99999'" in one_line_error(proc, 2)
    assert "ray start" not in proc.stdout + proc.stderr


def assert_join_gives_up_in_one_line(tmp_path, address: str, words: str) -> None:
    """`xfc cluster join --address address` is one line naming it (words after the address), exit 3,
    well within 20 s (its checks: 5 s each at most), and leaves no `ray start` behind."""
    from xfc.tiledb.raytoken import create_token_file
    token = tmp_path / "t.token"
    create_token_file(token)
    marker = f"join{os.getpid()}{tmp_path.name}"
    started = time.monotonic()
    try:
        proc = xfc("cluster", "join", "--address", address, "--token-file", str(token), "--no-adb",
                   marker=marker, timeout=90)
        took = time.monotonic() - started
        line = one_line_error(proc, 3)
        assert line.startswith(f"xfc: error: --address {address}: {words}"), line
        assert took < 20, f"join took {took:.1f} s to give up"
        assert marked_pids(marker) == []                          # no `ray start` was left behind
    finally:
        for pid in marked_pids(marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.subprocess
@pytest.mark.skipif(not HAVE_RAY, reason="ray is not installed (xfc[ray])")
def test_join_where_no_head_listens_is_one_line_exit_3_at_once(tmp_path):
    """`ray start --address` retries for many minutes where nothing listens: join asks first."""
    address = f"127.0.0.1:{free_port()}"        # bound and closed: nothing listens there
    assert_join_gives_up_in_one_line(tmp_path, address, "no Ray cluster answers there")


@pytest.mark.subprocess
@pytest.mark.skipif(not HAVE_RAY, reason="ray is not installed (xfc[ray])")
@pytest.mark.parametrize("answer", [None, b"HTTP/1.1 400 Bad Request\r\n\r\n"], ids=["silent", "http1"])
def test_join_where_another_service_listens_is_one_line_exit_3(tmp_path, answer):
    """A listener that is not a Ray head (another service on the port): `ray start --address` retried
    for minutes. join asks for a gRPC answer first, which a Ray head gives at once."""
    import socket
    import threading
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    held = []

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)             # silent: keep it open, say nothing
            if answer is not None:
                conn.recv(64)
                conn.sendall(answer)
    threading.Thread(target=serve, daemon=True).start()
    try:
        assert_join_gives_up_in_one_line(tmp_path, f"127.0.0.1:{server.getsockname()[1]}",
                                         "something listens there, but not a Ray cluster's head")
    finally:
        server.close()
        for conn in held:
            conn.close()


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

def ray_temp_dir(root: Path) -> Path:
    """Ray's sockets live under its temp dir and an AF_UNIX path holds 107 bytes: under xdist the
    test's tmp path can be too long, then a short private directory under /tmp (the caller removes it)."""
    return root if len(str(root)) + len(SOCKET_TAIL) + 8 <= 107 else Path(tempfile.mkdtemp(prefix="xr"))


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
    ray_tmp = ray_temp_dir(root)
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
        stop_node_processes(procs)
        for pid in marked_pids(marker):        # anything of this run left (none expected)
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


# Ray's own client without a token. Plain ray.init would turn 127.0.0.1 into the host's network address,
# where an xfc node does not listen; a user of this host can keep 127.0.0.1 as xfc does, and reaches the GCS.
NO_TOKEN_PROBE = ("import sys, ray\n"
                  "import ray._private.services as services\n"
                  "resolve = services.resolve_ip_for_localhost\n"
                  "services.resolve_ip_for_localhost = lambda host: host if host == '127.0.0.1' else resolve(host)\n"
                  "try:\n"
                  "    ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False)\n"
                  "except Exception as exc:\n"
                  "    print('refused:', type(exc).__name__, ' '.join(str(exc).split())[:300])\n"
                  "    sys.exit(7)\n"
                  "print('connected', len(ray.nodes()))\n")


@pytest.mark.adb
def test_a_client_without_the_clusters_token_is_refused(cluster, tmp_path):
    """The node listens on 127.0.0.1: what keeps the other users of this host out is the token."""
    address, marker, _, token = cluster
    wrong = tmp_path / "wrong.token"
    wrong.write_text("xfc1-" + "0" * 64)
    line = one_line_error(xfc("tiledb", "build", "--hw", HW, "--evaluators", "static", "--executor", "ray",
                              "--address", address, "--token-file", str(wrong), "--db", str(tmp_path / "t.sqlite"),
                              marker=marker, timeout=120), 2)
    assert "refused this token" in line, line
    # Ray's own client, no token and no token mode (another user of this host: NO_TOKEN_PROBE)
    bare = {k: v for k, v in env(marker).items() if not k.startswith("RAY_AUTH")}
    bare["HOME"] = str(tmp_path)                        # no ~/.ray/auth_token to fall back on
    # Ray's client asks the GCS again once a second, 20 times by default, before it gives up: the
    # refusal is the same on the first answer, so 2 attempts (18 s less of a 25 s test)
    bare["RAY_NUM_REDIS_GET_RETRIES"] = "2"
    proc = subprocess.run([sys.executable, "-c", NO_TOKEN_PROBE, address], capture_output=True, text=True,
                          timeout=120, env=bare)
    assert proc.returncode == 7 and "refused:" in proc.stdout, proc.stdout + proc.stderr[-600:]
    # the right token still works (the builds above use it too)
    assert xfc("cluster", "resources", "--address", address, "--token-file", str(token), marker=marker,
               timeout=120).returncode == 0


# ---- where the nodes listen, and what a signal leaves behind ------------------------------------
# Every listening socket of every process of a node's tree (xfc, `ray start`, gcs_server, raylet,
# agents, task workers) and of a build's (the driver), sampled while a build runs through the
# cluster. Processes and sockets are read from /proc (tests/support), not asked of Ray.

# how each process shows itself: Ray 2.60 renames its agents, Ray 2.52 runs them under their script names
AGENTS = {"runtime-env agent": ("ray::RuntimeEnvAgent", "/runtime_env/agent/main.py"),
          "dashboard agent": ("ray::DashboardAgent", "/dashboard/agent.py")}
# Ray 2.60 cannot bind these to the address of an exposed node (xfc/tiledb/raybind.py): they listen
# on every interface, on the ports `xfc cluster head|join --expose` names in its warning lines.
# Anything else listening anywhere but the node's address or loopback fails the test.
EVERY_INTERFACE_WHEN_EXPOSED = ("gcs_server", "raylet", "core worker", "dashboard agent")
WILDCARDS = ("0.0.0.0", "::")


# A process that exits between the reading of its sockets and of its command line shows none
# (seen once: a listener of the head's tree on '::' with an empty command, its kind unknowable).
EXITED = "(exited while sampled)"


def kind(command: str, pid: int, drivers: set[int]) -> str:
    """gcs_server, raylet, an agent, or a core worker (a task worker or a driver); EXITED when the
    command line is gone; else the command."""
    if not command:
        return EXITED
    program = os.path.basename(command.split(" ", 1)[0])
    if program in ("gcs_server", "raylet"):
        return program
    for name, marks in AGENTS.items():
        if command.startswith(marks[0]) or marks[1] in command:
            return name
    if command.startswith("ray::") or "/workers/default_worker.py" in command or pid in drivers:
        return "core worker"
    return command[:80]


def start_node(args: list[str], log: Path, marker: str) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "xfc", *args], stdout=out, stderr=subprocess.STDOUT,
                                env=env(marker), start_new_session=True, preexec_fn=signals_as_default)


def build_and_sample(address: str, token: Path, db: Path, nodes: dict[str, subprocess.Popen], marker: str,
                     extra: tuple = ()) -> dict[str, set[tuple[str, str, int]]]:
    """Run a static build through the cluster; meanwhile collect, every 0.02 s, (kind, address, port) of
    every listener of each node's tree and of the build's own ("build": the driver). The driver listens
    only while it is connected, a fraction of a second: sampled every 0.1 s under a loaded make test,
    no sample caught it once."""
    build = subprocess.Popen([sys.executable, "-m", "xfc", "tiledb", "build", "--hw", HW, "--evaluators", "static",
                              "--cluster", CLUSTER, "--tiles", TILES, "--executor", "ray", "--address", address,
                              "--token-file", str(token),
                              "--db", str(db), "--quiet", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env(marker))
    seen: dict[str, set] = {label: set() for label in (*nodes, "build")}
    try:
        roots = {**{label: proc.pid for label, proc in nodes.items()}, "build": build.pid}
        while build.poll() is None:
            for label, found in listeners_by_tree(roots).items():
                seen[label] |= {(kind(command, pid, {build.pid}), addr, port) for pid, command, addr, port in found}
            time.sleep(0.02)
        out, err = build.communicate(timeout=60)
    finally:
        if build.poll() is None:
            build.kill()
            build.communicate()
    assert build.returncode == 0, out + err
    return seen


def stop_and_check(proc: subprocess.Popen, sig: int, status: int, log: Path, marker: str,
                   last_line: str, ray_start: bool = False) -> None:
    """Send sig to a running `xfc cluster head|join` (ray_start: to its `ray start` child instead): it
    exits with status, its last line is last_line, and no process of its tree, of the sessions in it or
    carrying its marker is left, and none of its ports listens."""
    assert proc.poll() is None, log.read_text()[-600:]
    tree = [i for i in map(process_identity, process_tree(proc.pid)) if i]
    sessions = {session_of(pid) for pid, _ in tree} - {None, os.getsid(0)}
    ports = {port for _, _, _, port in tree_listeners(proc.pid)}
    assert len(tree) >= 5 and len(sessions) >= 2 and ports, (tree, sessions, ports)   # xfc, ray start, gcs/raylet...
    [leader] = [pid for pid, _ in tree if session_of(pid) == pid and pid != proc.pid]   # `ray start`, in its session
    inodes = listening_inodes(proc.pid)
    os.kill(leader if ray_start else proc.pid, sig)
    proc.wait(timeout=120)
    tail = log.read_text()[-800:]
    assert proc.returncode == status, tail
    assert tail.strip().splitlines()[-1].startswith(last_line), tail
    assert still_running(tree) == [], tail
    assert [pid for sid in sessions for pid in session_members(sid)] == []
    assert marked_pids(marker) == []
    # none of the node's listening sockets is left (by identity: once they are closed the kernel may give
    # a port number to another process's new socket, as it did once while the other test worker ran)
    left = {inode: listening_sockets()[inode] for inode in inodes & set(listening_sockets())}
    assert inodes and left == {}, (left, ports & listening_ports())


def declared_every_interface(log_text: str, node_ip: str) -> dict[str, set[int]]:
    """Kind -> ports, from the warning lines naming what listens on every interface."""
    prefix = f"xfc: warning: Ray cannot bind these servers to {node_ip}; they listen on every interface of this host: "
    kinds = {"gcs_server": "gcs_server", "raylet": "raylet", "core workers": "core worker",
             "dashboard agent": "dashboard agent"}
    out: dict[str, set[int]] = {}
    for line in log_text.splitlines():
        if line.startswith(prefix):
            what, _, ports = line[len(prefix):].partition(", port")
            [name] = [k for k in kinds if what.startswith(k)]
            ranges = [tuple(map(int, r.split("-"))) for r in re.findall(r"\d+-\d+", ports)]
            singles = {int(v) for v in re.findall(r"(?<![\d-])\d+(?![\d-])", ports)}
            out[kinds[name]] = singles | {p for lo, hi in ranges for p in range(lo, hi + 1)}
    return out


@pytest.mark.subprocess
@pytest.mark.skipif(not HAVE_RAY, reason="ray is not installed (xfc[ray])")
def test_without_expose_every_ray_listener_is_on_loopback_and_a_signal_leaves_nothing(tmp_path):
    """head, join and a build's driver (defaults): every listening socket on 127.0.0.1 / ::ffff:127.0.0.1;
    then SIGINT to the join (exit 130) and SIGTERM to the head (exit 143) leave no process, no port."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    ray_tmp, token = ray_temp_dir(tmp_path), tmp_path / "cluster.token"
    small = ["--num-cpus", "1", "--object-store-mb", "80", "--temp-dir", str(ray_tmp), "--token-file", str(token),
             "--no-adb"]
    marker = f"lo{os.getpid()}{tmp_path.name}"
    nodes: dict[str, subprocess.Popen] = {}
    try:
        nodes["head"] = start_node(["cluster", "head", "--port", str(port), *small], tmp_path / "head.log", marker + "h")
        wait_for_nodes(address, marker, 1, nodes["head"], tmp_path / "head.log", token)
        nodes["join"] = start_node(["cluster", "join", "--address", address, *small], tmp_path / "join.log",
                                   marker + "j")
        wait_for_nodes(address, marker, 2, nodes["join"], tmp_path / "join.log", token)
        head_log = (tmp_path / "head.log").read_text()
        assert "this Ray node listens on 127.0.0.1 only" in head_log and "xfc: warning" not in head_log, head_log[-600:]
        seen = build_and_sample(address, token, tmp_path / "t.sqlite", nodes, marker)
        outside = {label: sorted(s for s in found if not is_loopback(s[1])) for label, found in seen.items()}
        assert outside == {"head": [], "join": [], "build": []}, outside
        # what was seen: each server of each node, task workers and the driver (else nothing was checked)
        assert ("gcs_server", port) in {(k, p) for k, _, p in seen["head"]}, seen["head"]
        for label in ("head", "join"):
            kinds = [k for k, _, _ in seen[label]]
            assert kinds.count("raylet") >= 2 and "runtime-env agent" in kinds, seen[label]
        assert "core worker" in {k for label in ("head", "join") for k, _, _ in seen[label]}, seen
        assert {k for k, _, _ in seen["build"]} - {EXITED} == {"core worker"}, seen["build"]
        stop_and_check(nodes["join"], signal.SIGINT, 130, tmp_path / "join.log", marker + "j", "xfc: interrupted")
        stop_and_check(nodes["head"], signal.SIGTERM, 143, tmp_path / "head.log", marker + "h", "xfc: terminated")
    finally:
        stop_node_processes(list(nodes.values()))
        if ray_tmp != tmp_path:
            shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.mark.subprocess
@pytest.mark.skipif(not HAVE_RAY, reason="ray is not installed (xfc[ray])")
def test_an_exposed_node_listens_on_its_address_and_names_what_ray_cannot_bind(tmp_path):
    """head and join with --expose --node-ip 127.0.0.2 (a loopback alias: no network needed), and a
    build's driver: every listener is on 127.0.0.2 or loopback, except those of the processes Ray
    cannot bind (EVERY_INTERFACE_WHEN_EXPOSED), which are on every interface on ports the warning
    lines name; then SIGKILL to the join's `ray start` (exit 3, one line) and SIGINT to the head (130)
    leave nothing."""
    alias = "127.0.0.2"
    import socket as _socket
    with _socket.socket() as probe:
        try:
            probe.bind((alias, 0))
        except OSError as exc:
            pytest.skip(f"this host cannot bind the loopback alias {alias} ({exc.strerror})")
    port = free_port()
    address = f"{alias}:{port}"
    ray_tmp, token = ray_temp_dir(tmp_path), tmp_path / "cluster.token"
    small = ["--num-cpus", "1", "--object-store-mb", "80", "--temp-dir", str(ray_tmp), "--token-file", str(token),
             "--no-adb", "--expose", "--node-ip", alias]
    marker = f"ex{os.getpid()}{tmp_path.name}"
    nodes: dict[str, subprocess.Popen] = {}
    try:
        nodes["head"] = start_node(["cluster", "head", "--port", str(port), *small], tmp_path / "head.log", marker + "h")
        wait_for_nodes(address, marker, 1, nodes["head"], tmp_path / "head.log", token)
        nodes["join"] = start_node(["cluster", "join", "--address", address, *small], tmp_path / "join.log",
                                   marker + "j")
        wait_for_nodes(address, marker, 2, nodes["join"], tmp_path / "join.log", token)
        logs = {label: (tmp_path / f"{label}.log").read_text() for label in nodes}
        declared = {label: declared_every_interface(text, alias) for label, text in logs.items()}
        for label, text in logs.items():
            assert EXPOSE_WARNING in text and f"advertises {alias}" in text, text[-800:]
            assert {"raylet", "core worker"} <= set(declared[label]), text[-800:]
        assert declared["head"]["gcs_server"] == {port} and "gcs_server" not in declared["join"]
        seen = build_and_sample(address, token, tmp_path / "t.sqlite", nodes, marker)
        assert {k for k, _, _ in seen["build"]} - {EXITED} == {"core worker"}, seen["build"]
        seen["head"] |= seen.pop("build")          # the driver joins the head's node: its ports are the head's
        wrong = {}
        for label, found in seen.items():
            for what, addr, p in sorted(found):
                if addr == alias or is_loopback(addr):
                    continue
                if addr in WILDCARDS and what in EVERY_INTERFACE_WHEN_EXPOSED and p in declared[label].get(what, ()):
                    continue
                # its kind is unknowable, so only a port some warning line names passes
                if addr in WILDCARDS and what == EXITED and any(p in ports for ports in declared[label].values()):
                    continue
                wrong.setdefault(label, []).append((what, addr, p))
        assert wrong == {}, wrong
        for label in ("head", "join"):
            assert ("runtime-env agent", alias) in {(k, a) for k, a, _ in seen[label]}, seen[label]
            assert [k for k, _, _ in seen[label]].count("raylet") >= 2, seen[label]
        assert ("gcs_server", port) in {(k, p) for k, _, p in seen["head"]}, seen["head"]
        # a node whose `ray start` dies: one line, exit 3, and still nothing of it is left
        stop_and_check(nodes["join"], signal.SIGKILL, 3, tmp_path / "join.log", marker + "j",
                       "xfc: error: the Ray node stopped by itself: 'ray start' was killed by signal 9", ray_start=True)
        stop_and_check(nodes["head"], signal.SIGINT, 130, tmp_path / "head.log", marker + "h", "xfc: interrupted")
    finally:
        stop_node_processes(list(nodes.values()))
        if ray_tmp != tmp_path:
            shutil.rmtree(ray_tmp, ignore_errors=True)
