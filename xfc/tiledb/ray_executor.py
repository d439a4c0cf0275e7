"""`xfc tiledb build --executor ray`: the build's task list run on a Ray cluster.

What a node can measure is a set of Ray custom resources (node_resources, advertised by
`xfc cluster join`, xfc/tiledb/cluster.py):
  xfc-phone:<serial>   1 per attached phone: a device task asks for 1, so a phone runs one task at
                       a time, on the node that holds it (the evaluator pins it per cluster there)
  xfc-soc:<hw name>    phones of that shipped description on the node (the fail-fast check)
  xfc-host:<fp>        1 per host cluster fingerprint: host timings run on a matching machine,
                       one at a time
  xfc-qemu, xfc-opencl, xfc-llvm-mca   the tools the node has
Static tasks need nothing but a CPU. A task is shipped without its evaluator: the evaluator's
recipe (evaluator_recipe) is rebuilt once per Ray worker process, a device evaluator attached
there to its phone through the node's adb server (identity check included).

Results (result, place) come back to the driver as futures; run_build writes every row there.
A task whose worker or node dies is retried by Ray (max_retries) on an eligible node; after the
retries it is reported as not measured (failure), with no row. An evaluator's own error
(XfcError: a wrong kernel, a device refusing) stops the build as it does locally.
"""
from __future__ import annotations

import socket
from dataclasses import replace
from typing import Mapping, Optional

from ..errors import DeviceError, XfcError
from ..hardware.model import HardwareDescription

INSTALL_HINT = "--executor ray needs Ray: pip install 'xfc[ray]' (or pip install 'ray>=2.52,<2.61')"
PHONE = "xfc-phone:"
SOC = "xfc-soc:"
HOST = "xfc-host:"
DEFAULT_RETRIES = 2


def require_ray():
    """The ray module, or XfcError (exit 2) saying what to install."""
    try:
        import ray
    except ImportError:
        raise XfcError(INSTALL_HINT) from None
    return ray


# ---- what a node offers ----------------------------------------------------------------------

def host_resources(environ: Mapping[str, str]) -> dict[str, float]:
    """This machine's host fingerprints and tools as resources."""
    import shutil
    from pathlib import Path
    from .fingerprint import fingerprint
    from .hostdesc import load_hardware
    out: dict[str, float] = {}
    try:
        hw = load_hardware("host", environ)
        for cluster in hw.clusters:
            out[HOST + fingerprint(hw, cluster)] = 1.0
    except XfcError:
        pass            # no host description here: the node takes no host timing tasks
    if shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-gcc"):
        out["xfc-qemu"] = 1000.0
    if shutil.which("llvm-mca-16"):
        out["xfc-llvm-mca"] = 1000.0
    if any(Path("/etc/OpenCL/vendors").glob("*.icd")):
        out["xfc-opencl"] = 1000.0
    return out


def phone_resources(rows) -> dict[str, float]:
    """Resources of the phones `xfc devices` lists (xfc.runners.adb.device_rows): ready ones only."""
    out: dict[str, float] = {}
    for row in rows:
        if row.get("state") != "device" or row.get("error"):
            continue
        out[PHONE + row["serial"]] = 1.0
        if row.get("hardware"):
            out[SOC + row["hardware"]] = out.get(SOC + row["hardware"], 0.0) + 1.0
    return out


# ---- what a task needs -----------------------------------------------------------------------

class ClusterDevice:
    """adb:SERIAL on the driver side of a Ray build: names the source, measures nothing here (the
    phone hangs off some node; the worker holding it attaches a DeviceEvaluator)."""

    def __init__(self, serial: str, hw: HardwareDescription):
        if not serial:
            raise XfcError("--evaluators adb:SERIAL: with --executor ray, name the phone's serial "
                           "(see 'xfc cluster resources')")
        self.serial, self.hw = serial, hw

    @property
    def source(self) -> str:
        return f"adb:{self.serial}"

    def measure(self, *args):
        raise XfcError("a cluster device measures on its node only")

    def measure_operator(self, *args):
        raise XfcError("a cluster device measures on its node only")


def evaluator_recipe(evaluator) -> tuple:
    """How a worker rebuilds this evaluator: (kind, args...)."""
    from .evaluators import HostMicroKernelEvaluator, McaMicroKernelEvaluator, StaticDbEvaluator
    from .operators import HostOperatorEvaluator
    if isinstance(evaluator, ClusterDevice):
        return ("adb", evaluator.serial)
    for kind, cls in (("static", StaticDbEvaluator), ("host-tile", HostMicroKernelEvaluator),
                      ("host-operator", HostOperatorEvaluator), ("llvm-mca", McaMicroKernelEvaluator)):
        if type(evaluator) is cls:
            return (kind,)
    raise XfcError(f"--executor ray cannot ship the evaluator {type(evaluator).__name__}")


def task_resources(task, recipe: tuple) -> dict[str, float]:
    """The custom resources a task asks Ray for (see the module docstring)."""
    kind = recipe[0]
    if kind == "adb":
        return {PHONE + recipe[1]: 1.0}
    if kind in ("host-tile", "host-operator"):
        return {HOST + task.fingerprint: 1.0}
    if kind == "llvm-mca":
        return {"xfc-llvm-mca": 1.0}
    return {}


def missing_resources(needs: Mapping[str, float], have: Mapping[str, float], soc: Optional[str]) -> Optional[str]:
    """One line naming what no node of the cluster offers, or None."""
    for name in sorted(needs):
        if have.get(name, 0.0) >= needs[name]:
            continue
        if name.startswith(PHONE):
            serial = name[len(PHONE):]
            socs = sorted(k[len(SOC):] for k in have if k.startswith(SOC))
            if soc and have.get(SOC + soc, 0.0) < 1:
                return (f"no node of the Ray cluster holds a {soc} phone (phones by SoC: "
                        f"{', '.join(socs) or 'none'}); start 'xfc cluster join' on the host it is plugged into")
            return f"no node of the Ray cluster holds phone {serial}; start 'xfc cluster join' on its host"
        if name.startswith(HOST):
            return f"no node of the Ray cluster is a host with fingerprint {name[len(HOST):][:12]}"
        return f"no node of the Ray cluster offers {name}"
    return None


def wrong_phones(needs: Mapping[str, float], nodes, soc: str) -> Optional[str]:
    """A needed phone whose node says it is another SoC: one line, or None."""
    for name in sorted(n for n in needs if n.startswith(PHONE)):
        for have in nodes:
            if have.get(name, 0.0) >= 1 and have.get(SOC + soc, 0.0) < 1:
                socs = sorted(k[len(SOC):] for k in have if k.startswith(SOC))
                return (f"phone {name[len(PHONE):]} is on a node whose phones are {', '.join(socs) or 'unidentified'}, "
                        f"not {soc}")
    return None


# ---- the worker side -------------------------------------------------------------------------

_EVALUATORS: dict = {}      # per Ray worker process: recipe + hw/cluster -> evaluator


def _worker_evaluator(recipe: tuple, task, hw: Optional[HardwareDescription]):
    from .evaluators import HostMicroKernelEvaluator, McaMicroKernelEvaluator, StaticDbEvaluator
    from .operators import HostOperatorEvaluator
    kind = recipe[0]
    key = (recipe, getattr(task, "fingerprint", ""))
    if key in _EVALUATORS:
        return _EVALUATORS[key]
    if kind == "adb":
        from ..runners.adb import AdbRunner
        from .device import DeviceEvaluator
        # the node's adb server: ANDROID_ADB_SERVER_HOST/PORT as `xfc cluster join` set them
        runner = AdbRunner(serial=recipe[1])
        evaluator = DeviceEvaluator(runner).attach(hw, [task.cluster])
    else:
        evaluator = {"static": StaticDbEvaluator, "host-tile": HostMicroKernelEvaluator,
                     "host-operator": HostOperatorEvaluator, "llvm-mca": McaMicroKernelEvaluator}[kind]()
    _EVALUATORS[key] = evaluator
    return evaluator


def measure_on_node(recipe: tuple, task, hw: Optional[HardwareDescription]):
    """Runs on a Ray worker: (result, place)."""
    import ray
    evaluator = _worker_evaluator(recipe, task, hw)
    result = replace(task, evaluator=evaluator).evaluate()
    node = ray.get_runtime_context().get_node_id()[:8]
    return result, f"{socket.gethostname()}/{node}"


# ---- the driver side -------------------------------------------------------------------------

def _refused(address: str, exc) -> XfcError:
    return XfcError(f"--address {address}: the Ray cluster refused this token (--token-file must be a copy "
                    f"of the file the head wrote) ({' '.join(str(exc).split())[:100]})")


def _probe_token(ray, address: str) -> None:
    """One GCS request with this process's token: a refusal is XfcError at once (ray.init would retry
    for ~20 s, printing a C++ warning line a second). Ray's C++ stderr line of this one try is held."""
    import os
    import tempfile
    from ray._raylet import GcsClient
    with tempfile.TemporaryFile() as held:
        saved = os.dup(2)
        os.dup2(held.fileno(), 2)
        try:
            GcsClient(address=address, cluster_id=None)
        except ray.exceptions.AuthenticationError as exc:
            raise _refused(address, exc) from None
        except Exception:       # noqa: BLE001 - unreachable etc.: ray.init below says so
            pass
        finally:
            os.dup2(saved, 2)
            os.close(saved)


REACH_TIMEOUT_S = 5.0


def check_reachable(address: str, timeout_s: float = REACH_TIMEOUT_S, *, host_port: bool = False) -> None:
    """One TCP connection to the head's port first: ray.init and `ray start --address` wait minutes
    (retrying) for an address where nothing listens, and a user must get one line instead of a hung
    command. Nothing listening is DeviceError (exit 3); a port outside 1-65535 is XfcError (exit 2),
    and so with host_port (a node joining) is an address that is not HOST:PORT."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host or "/" in host:
        if host_port:
            raise XfcError(f"--address {address}: not HOST:PORT (the head's address, e.g. 127.0.0.1:6379)")
        return                     # not host:port (Ray resolves other forms itself)
    if not 1 <= int(port) <= 65535:
        raise XfcError(f"--address {address}: the port must be a TCP port 1-65535, got {port}")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        reason = (f"no answer within {timeout_s:g} s" if isinstance(exc, socket.timeout)
                  else (exc.strerror or str(exc)))
        raise DeviceError(f"--address {address}: no Ray cluster answers there ({reason}); start one with "
                          f"'xfc cluster head' or check the address") from None


# A client's HTTP/2 connection preface and an empty SETTINGS frame (RFC 9113, 3.4 and 6.5): a gRPC
# server, as Ray's GCS is, answers with a frame of its own, a SETTINGS frame first.
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
HTTP2_SETTINGS_TYPE = 4
FRAME_HEADER_BYTES = 9


def check_speaks_grpc(address: str, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """After check_reachable, for a node joining: what listens at address answers as a gRPC server
    does. `ray start --address` to a listener that is not a Ray head (another service on the port)
    waits about 40 s per try and tries about 20 times. DeviceError (exit 3) when it does not. Not
    for a cluster under Ray's TLS (RAY_USE_TLS), where the first bytes are TLS's: the caller skips it."""
    host, _, port = address.rpartition(":")
    header = b""
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as conn:
            conn.settimeout(timeout_s)
            conn.sendall(HTTP2_PREFACE)
            while len(header) < FRAME_HEADER_BYTES:
                chunk = conn.recv(FRAME_HEADER_BYTES - len(header))
                if not chunk:
                    break
                header += chunk
    except OSError:      # a timeout or a reset: it did not answer as gRPC does
        pass
    if len(header) < FRAME_HEADER_BYTES or header[3] != HTTP2_SETTINGS_TYPE:
        raise DeviceError(f"--address {address}: something listens there, but not a Ray cluster's head (no gRPC "
                          f"answer within {timeout_s:g} s); check the address and port 'xfc cluster head' printed")


def connect(ray, address: str) -> None:
    """ray.init to a running cluster, or XfcError (one line): unreachable, or the token refused.
    A 127.0.0.1 address stays 127.0.0.1 (raybind.loopback_kept): the driver then joins the local
    node as 127.0.0.1 and its own server listens on loopback only."""
    from .raybind import loopback_kept
    check_reachable(address)
    _probe_token(ray, address)
    try:
        with loopback_kept():
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    except ray.exceptions.AuthenticationError as exc:
        raise _refused(address, exc) from None
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise XfcError(f"--address {address}: cannot connect to a Ray cluster "
                       f"({' '.join(str(exc).split())[:160]})") from None


class RayExecutor:
    """Connects to a running cluster (address, e.g. 127.0.0.1:6379) with its token and runs tasks there."""

    name = "ray"

    def __init__(self, address: str, hw: HardwareDescription, *, token: str = "", retries: int = DEFAULT_RETRIES,
                 capacity: int = 64):
        if retries < 0:
            raise XfcError(f"--retries must be >= 0, got {retries}")
        self.ray = require_ray()
        self.address, self.hw, self.retries, self.capacity = address, hw, retries, capacity
        self.token = token
        self._remote = None
        self._auth = None

    def __enter__(self) -> "RayExecutor":
        from .raytoken import driver_token
        self._auth = driver_token(self.token)
        self._auth.__enter__()
        try:
            connect(self.ray, self.address)
        except BaseException:
            self._auth.__exit__(None, None, None)
            raise
        self._remote = self.ray.remote(measure_on_node)
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.ray.shutdown()
        finally:
            self._auth.__exit__(None, None, None)

    def check(self, tasks) -> None:
        """Fail fast (DeviceError, one line) when no node offers what some task needs."""
        needs: dict[str, float] = {}
        for task in tasks:
            for name, amount in task_resources(task, evaluator_recipe(task.evaluator)).items():
                needs[name] = max(needs.get(name, 0.0), amount)
        nodes = [n["Resources"] for n in self.ray.nodes() if n.get("Alive")]
        problem = missing_resources(needs, self.ray.cluster_resources(), self.hw.name) or wrong_phones(
            needs, nodes, self.hw.name)
        if problem:
            raise DeviceError(problem)

    def submit(self, task):
        recipe = evaluator_recipe(task.evaluator)
        # the evaluator stays here; the worker rebuilds it from the recipe
        shipped = replace(task, evaluator=None)
        # the task's name (its source) shows in Ray's listings and as the worker's process title
        ref = self._remote.options(resources=task_resources(task, recipe), num_cpus=1, name=f"xfc {task.source}",
                                   max_retries=self.retries, retry_exceptions=False,
                                   ).remote(recipe, shipped, self.hw if recipe[0] == "adb" else None)
        return ref.future()

    def failure(self, exc: BaseException) -> Optional[str]:
        """A dead worker or node (after the retries) -> why; an evaluator's own error -> raised."""
        ex = self.ray.exceptions
        if isinstance(exc, ex.RayTaskError):
            cause = getattr(exc, "cause", None)
            if isinstance(cause, XfcError):
                raise cause from None             # the evaluator's one line, as locally
            raise XfcError(f"a task failed on the Ray cluster: {' '.join(str(cause or exc).split())[:200]}")
        if isinstance(exc, XfcError):
            raise exc
        if isinstance(exc, (ex.WorkerCrashedError, ex.NodeDiedError, ex.ObjectLostError,
                            ex.LocalRayletDiedError, ex.TaskUnschedulableError)):
            first = " ".join(str(exc).split())[:160]
            return f"{type(exc).__name__} after {self.retries} retr{'y' if self.retries == 1 else 'ies'}: {first}"
        if isinstance(exc, ex.RayError):
            return f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
        return None
