"""Where the servers of a Ray node listen, and how xfc keeps them on loopback.

What decides each address (Ray 2.60's source; docs/tile-db.md "Where a Ray node listens"):

- Ray's C++ gRPC servers take one flag, listen_to_localhost_only (src/ray/rpc/grpc_server.h): on
  127.0.0.1 when it is set, on every interface otherwise. Each sets it from its node IP being
  exactly "127.0.0.1": the GCS (gcs_server.cc: `config.node_ip_address == "127.0.0.1"`), the
  raylet's node manager and object manager, and every core worker (each task worker and each
  driver). No Ray setting names another address for them.
- The runtime-env agent binds the node IP. With Ray's dashboard packages (ray[default]) the
  dashboard agent also listens: gRPC on loopback when the node IP is loopback, else on every
  interface; HTTP on the node IP (and loopback); the metrics exporter on loopback, else on every
  IPv4 interface. The Ray client server (ray[client]) binds the node IP; the dashboard,
  --dashboard-host (xfc: 127.0.0.1).
- But `ray start --node-ip-address 127.0.0.1` and `ray.init(address="127.0.0.1:PORT")` do not
  keep 127.0.0.1: ray._private.services.resolve_ip_for_localhost replaces a loopback address by
  the host's network address first. Given 127.0.0.1, a Ray node therefore listens on every
  interface and runs its runtime-env agent on the network address.

So xfc starts `ray start` through LAUNCHER and calls ray.init inside loopback_kept(): both keep
127.0.0.1 as given, the node IP is 127.0.0.1 everywhere and every server above listens on
loopback only. With --expose --node-ip ADDR the agents bind ADDR, but the C++ servers listen on
every interface: exposed_ports fixes their ports and exposure_warnings names each of them.
The private function patched here is why pyproject.toml bounds Ray's version.
"""
from __future__ import annotations

import ipaddress
import socket
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

from ..errors import XfcError

LOOPBACK = "127.0.0.1"
SUPPORTED = "ray>=2.52,<2.61"
# Ray's own defaults, passed explicitly so that what xfc prints about them stays true
MIN_WORKER_PORT, MAX_WORKER_PORT = 10002, 19999

# `ray start ARGS` as Ray's console script runs it, with resolve_ip_for_localhost keeping 127.0.0.1
# (run as `python -c LAUNCHER start ...`; mirrors keep_loopback below)
LAUNCHER = (
    "import sys\n"
    "import ray._private.services as services\n"
    "resolve = services.resolve_ip_for_localhost\n"
    "services.resolve_ip_for_localhost = (\n"
    "    lambda host: '127.0.0.1' if host in ('127.0.0.1', 'localhost') else resolve(host))\n"
    "from ray.scripts.scripts import main\n"
    "sys.argv[0] = 'ray'\n"
    "sys.exit(main())\n")


def keep_loopback(resolve: Callable[[str], str]) -> Callable[[str], str]:
    """resolve_ip_for_localhost that leaves 127.0.0.1 as it is and makes localhost 127.0.0.1 (any
    other host goes to resolve)."""
    return lambda host: LOOPBACK if host in (LOOPBACK, "localhost") else resolve(host)


def _services():
    try:
        import ray._private.services as services
    except ImportError:
        raise XfcError(f"this Ray cannot be kept on loopback (no ray._private.services); pip install '{SUPPORTED}'") from None
    if not callable(getattr(services, "resolve_ip_for_localhost", None)):
        raise XfcError(f"this Ray cannot be kept on loopback (no resolve_ip_for_localhost); pip install '{SUPPORTED}'")
    return services


@contextmanager
def loopback_kept() -> Iterator[None]:
    """ray.init inside this block keeps a 127.0.0.1 cluster address (and so its node IP) as given."""
    services = _services()
    saved = services.resolve_ip_for_localhost
    services.resolve_ip_for_localhost = keep_loopback(saved)
    try:
        yield
    finally:
        services.resolve_ip_for_localhost = saved


def check_node_ip(value: str) -> str:
    """--node-ip: an IPv4 address of this host (one line naming the value otherwise)."""
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        raise XfcError(f"--node-ip {value!r}: not an IPv4 address") from None
    if ip.version != 4:
        raise XfcError(f"--node-ip {value}: give an IPv4 address (xfc's Ray nodes are tested on IPv4 only)")
    if ip.is_unspecified or ip.is_multicast or ip == ipaddress.ip_address("255.255.255.255"):
        raise XfcError(f"--node-ip {value}: not the address of one interface; name the address other hosts reach")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:      # bound, never listening
        try:
            probe.bind((value, 0))
        except OSError as exc:
            raise XfcError(f"--node-ip {value}: not an address of this host ({exc.strerror})") from None
    return str(ip)


def is_loopback_host(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def free_port() -> int:
    """A TCP port free on every interface right now (bound and closed, never listening)."""
    family = socket.AF_INET6 if socket.has_dualstack_ipv6() else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        if family == socket.AF_INET6:
            probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        probe.bind(("", 0))
        return probe.getsockname()[1]


@dataclass(frozen=True)
class ExposedPorts:
    """The ports of the servers that listen on every interface of an exposed node (fixed by xfc)."""
    node_manager: int
    object_manager: int
    dashboard_agent_grpc: int
    metrics_export: int
    min_worker: int = MIN_WORKER_PORT
    max_worker: int = MAX_WORKER_PORT


def exposed_ports(port: Callable[[], int] = free_port) -> ExposedPorts:
    return ExposedPorts(node_manager=port(), object_manager=port(), dashboard_agent_grpc=port(),
                        metrics_export=port())


def dashboard_packages() -> bool:
    """True when Ray's dashboard agent runs its servers (Ray's dashboard packages, ray[default],
    are installed); when Ray cannot say, True (so the warning is not left out)."""
    try:
        from ray._private.utils import get_dashboard_dependency_error
    except ImportError:
        return True
    return get_dashboard_dependency_error() is None


def exposure_warnings(node_ip: str, gcs_port: Optional[int], ports: ExposedPorts,
                      dashboard_agent: bool) -> list[str]:
    """One line per Ray process that listens on every interface, not only node_ip, with its ports
    (gcs_port: the head's GCS; None on a joining node). Nothing for a 127.0.0.1 node."""
    if node_ip == LOOPBACK:
        return []
    head = f"Ray cannot bind these servers to {node_ip}; they listen on every interface of this host:"
    lines = [f"{head} gcs_server (GCS), port {gcs_port}"] if gcs_port is not None else []
    lines.append(f"{head} raylet, ports {ports.node_manager} (node manager) and {ports.object_manager} "
                 f"(object manager)")
    lines.append(f"{head} core workers (every task worker and driver on this node), ports "
                 f"{ports.min_worker}-{ports.max_worker}")
    if dashboard_agent:
        lines.append(f"{head} dashboard agent, ports {ports.dashboard_agent_grpc} (gRPC) and "
                     f"{ports.metrics_export} (metrics)")
    return lines
