"""`xfc cluster head|join|resources`: Ray nodes that advertise what they can measure.

A node is `ray start --block` (Ray's own command, replacing this process: its signals and exit
are Ray's) with xfc's custom resources (node_resources): the phones its adb server sees (by
serial and by SoC), its host fingerprints, qemu / llvm-mca / OpenCL. Its Ray workers inherit the
adb server address (ANDROID_ADB_SERVER_HOST/PORT, read through xfc.settings), so device tasks
reach the phone through the node's own server; XFC_CLUSTER_NODE says which kind of node it is.

Binding: xfc gives Ray 127.0.0.1 as the node address unless expose=True, which prints
EXPOSE_WARNING. Ray 2.60's GCS server and raylet listen on all interfaces whatever that address
is, so every node xfc starts requires the cluster's token (xfc/tiledb/raytoken.py, passed in the
node's environment): a client without it is refused; one with it runs any code on the node.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Mapping, Optional, Sequence

from ..errors import XfcError
from .ray_executor import host_resources, phone_resources, require_ray

LOCAL_IP = "127.0.0.1"
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


def ray_command() -> list[str]:
    """`ray` of this interpreter's environment (the console script next to python, else PATH)."""
    beside = Path(sys.executable).parent / "ray"
    found = str(beside) if beside.exists() else shutil.which("ray")
    if not found:
        raise XfcError("the 'ray' command is missing: pip install 'xfc[ray]'")
    return [found]


def start_args(*, head: bool, address: Optional[str], port: int, resources: Mapping[str, float],
               num_cpus: Optional[int], object_store_bytes: Optional[int], temp_dir: Optional[str],
               expose: bool, node_ip: Optional[str]) -> list[str]:
    """The `ray start` argument list (pure)."""
    args = ["start", "--block", "--disable-usage-stats", "--resources", json.dumps(dict(sorted(resources.items())))]
    if head:
        args += ["--head", "--port", str(port), "--include-dashboard", "false", "--dashboard-host", LOCAL_IP]
    else:
        args += ["--address", address]
    ip = node_ip or (None if expose else LOCAL_IP)
    if ip:
        args += ["--node-ip-address", ip]
    if num_cpus is not None:
        args += ["--num-cpus", str(num_cpus)]
    if object_store_bytes is not None:
        args += ["--object-store-memory", str(object_store_bytes)]
    if temp_dir:
        args += ["--temp-dir", temp_dir]
    return args


def exec_node(args: Sequence[str], environ: Mapping[str, str], adb_host: Optional[str],
              adb_port: Optional[int], kind: str, token: str) -> None:
    """Replace this process by `ray start --block ...` that requires token (never returns)."""
    from .raytoken import node_environ
    require_ray()
    env = dict(node_environ(environ, token), XFC_CLUSTER_NODE=kind)
    if adb_port is not None:
        env["ANDROID_ADB_SERVER_PORT"] = str(adb_port)
    if adb_host:
        env["ANDROID_ADB_SERVER_HOST"] = adb_host
    command = ray_command() + list(args)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(command[0], command, env)
