"""`xfc cluster head|join|resources`: Ray nodes that advertise what they can measure.

A node is `ray start --block` (Ray's own command, run by run_node as a child of xfc in a session
of its own) with xfc's custom resources (node_resources): the phones its adb server sees (by
serial and by SoC), its host fingerprints, qemu / llvm-mca / OpenCL. Its Ray workers inherit the
adb server address (ANDROID_ADB_SERVER_HOST/PORT, read through xfc.settings), so device tasks
reach the phone through the node's own server; XFC_CLUSTER_NODE says which kind of node it is.
Ctrl-C or SIGTERM stops `ray start` (SIGTERM: Ray's own shutdown), then every process left in
its session (build/procs.stop_session): none of the node's processes outlives xfc.

Binding (xfc/tiledb/raybind.py): the node IP is 127.0.0.1, kept as given (raybind.LAUNCHER), so
every server of the node listens on loopback only. --expose --node-ip ADDR advertises ADDR and
prints EXPOSE_WARNING; Ray then binds its agents to ADDR but its GCS, raylet and core workers to
every interface (their ports are fixed here and named by raybind.exposure_warnings). Every node
also requires the cluster's token (xfc/tiledb/raytoken.py, passed in the node's environment).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Mapping, Optional, Sequence

from ..errors import ToolchainError
from .raybind import LAUNCHER, LOOPBACK, ExposedPorts
from .ray_executor import host_resources, phone_resources, require_ray

# time `ray start` gets to stop its own processes after SIGTERM before xfc stops what is left
STOP_GRACE_S = 20.0
EXPOSE_WARNING = ("xfc: warning: this Ray node advertises a network address: anyone who can reach its ports "
                  "and holds the cluster's token can run any code on this host as this user; "
                  "expose it on a trusted network only and keep the token file private")


def node_resources(environ: Mapping[str, str], adb_host: Optional[str], adb_port: Optional[int],
                   use_adb: bool = True, warn=lambda message: None, start_server: bool = True) -> dict[str, float]:
    """This host's resources; without a reachable adb server the node offers no phones (warn says why)."""
    from ..errors import DeviceError
    out = host_resources(environ)
    if use_adb:
        from ..runners.adb import device_rows
        try:
            out.update(phone_resources(device_rows(adb_host, adb_port, start_server=start_server)))
        except DeviceError as exc:
            warn(f"no phones on this node: {exc}")
    return out


def start_args(*, head: bool, address: Optional[str], port: int, resources: Mapping[str, float],
               num_cpus: Optional[int], object_store_bytes: Optional[int], temp_dir: Optional[str],
               node_ip: str = LOOPBACK, exposed: Optional[ExposedPorts] = None) -> list[str]:
    """The `ray start` argument list (pure). exposed: the fixed ports of the servers that listen on
    every interface when node_ip is not 127.0.0.1 (raybind.exposed_ports)."""
    args = ["start", "--block", "--disable-usage-stats", "--resources", json.dumps(dict(sorted(resources.items())))]
    if head:
        args += ["--head", "--port", str(port), "--include-dashboard", "false", "--dashboard-host", LOOPBACK]
    else:
        args += ["--address", address]
    args += ["--node-ip-address", node_ip]
    if exposed is not None:
        args += ["--node-manager-port", str(exposed.node_manager), "--object-manager-port", str(exposed.object_manager),
                 "--min-worker-port", str(exposed.min_worker), "--max-worker-port", str(exposed.max_worker),
                 "--dashboard-agent-grpc-port", str(exposed.dashboard_agent_grpc),
                 "--metrics-export-port", str(exposed.metrics_export)]
    if num_cpus is not None:
        args += ["--num-cpus", str(num_cpus)]
    if object_store_bytes is not None:
        args += ["--object-store-memory", str(object_store_bytes)]
    if temp_dir:
        args += ["--temp-dir", temp_dir]
    return args


def node_command(args: Sequence[str]) -> list[str]:
    """`ray start ARGS` run by this interpreter through raybind.LAUNCHER (an argument list)."""
    return [sys.executable, "-c", LAUNCHER, *args]


def run_node(args: Sequence[str], environ: Mapping[str, str], adb_host: Optional[str],
             adb_port: Optional[int], kind: str, token: str) -> None:
    """Run `ray start --block ...` (requiring token) until it stops or xfc is interrupted; either
    way no process of the node is left. A node that stops by itself is ToolchainError (exit 3)."""
    from ..toolchain.procs import stop_session
    from .raytoken import node_environ
    require_ray()
    env = dict(node_environ(environ, token), XFC_CLUSTER_NODE=kind)
    if adb_port is not None:
        env["ANDROID_ADB_SERVER_PORT"] = str(adb_port)
    if adb_host:
        env["ANDROID_ADB_SERVER_HOST"] = adb_host
    sys.stdout.flush()
    sys.stderr.flush()
    proc = subprocess.Popen(node_command(args), stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        status = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)   # not reaped: the session id stays ours
    finally:
        stop_session(proc, STOP_GRACE_S)
    how = (f"exited with status {status.si_status}" if status.si_code == os.CLD_EXITED
           else f"was killed by signal {status.si_status}")
    raise ToolchainError(f"the Ray node stopped by itself: 'ray start' {how} (see Ray's messages above and "
                         "the logs of its session directory)")
