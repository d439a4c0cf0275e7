"""`xfc cluster head|join|resources`: Ray nodes for `xfc tiledb build --executor ray` (xfc/tiledb/cluster.py)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ..errors import XfcError
from .adb_options import add_adb_server_options
from .arg_types import non_negative_int, positive_int, tcp_port

DEFAULT_HEAD_PORT = 6379


def _warn(message: str) -> None:
    print(f"xfc: warning: {message}", file=sys.stderr, flush=True)


def _token_path(args):
    from ..tiledb.raytoken import default_token_path
    return Path(args.token_file) if args.token_file else default_token_path(os.environ)


def _node_ip(args, head: bool) -> str:
    """The node IP: 127.0.0.1, or with --expose the --node-ip the user named (one line otherwise)."""
    from ..tiledb.raybind import LOOPBACK, check_node_ip, is_loopback_host
    if args.node_ip is not None and not args.expose:
        raise XfcError(f"--node-ip {args.node_ip}: only with --expose (without it the node listens on "
                       f"{LOOPBACK} only)")
    if not args.expose:
        host = LOOPBACK if head else (args.address.rpartition(":")[0] or args.address)
        if not is_loopback_host(host):
            raise XfcError(f"--address {args.address}: a head on another host cannot reach a node that "
                           f"listens on {LOOPBACK}; add --expose --node-ip ADDR (this host's address)")
        return LOOPBACK
    if args.node_ip is None:
        raise XfcError("--expose needs --node-ip ADDR: the address of this host that the other nodes reach "
                       "(Ray advertises it; see `ip -brief address`)")
    return check_node_ip(args.node_ip)


def _check_object_store(ray, megabytes) -> None:
    """--object-store-mb below the installed Ray's minimum is one line here, not a traceback of
    `ray start` after the node's other processes started."""
    if megabytes is None:
        return
    try:
        from ray._private.ray_constants import OBJECT_STORE_MINIMUM_MEMORY_BYTES as minimum
    except ImportError:             # a Ray without this constant: `ray start` says so itself
        return
    if megabytes * 1024 * 1024 < minimum:
        raise XfcError(f"--object-store-mb {megabytes}: Ray needs at least {-(-minimum // (1024 * 1024))} MiB")


def _node_args(args, head: bool, token_path: Path) -> tuple[list[str], str]:
    """(the `ray start` arguments, the cluster token)."""
    from ..tiledb.cluster import EXPOSE_WARNING, node_resources, start_args
    from ..tiledb.ray_executor import check_reachable, check_speaks_grpc, require_ray
    from ..tiledb.raybind import LOOPBACK, dashboard_packages, exposed_ports, exposure_warnings
    from ..tiledb.raytoken import create_token_file, listen_note, read_token
    ray = require_ray()
    _check_object_store(ray, args.object_store_mb)
    node_ip = _node_ip(args, head)
    exposed = exposed_ports() if node_ip != LOOPBACK else None
    if head:
        token = create_token_file(token_path)
        print(f"xfc: wrote a new cluster token to {token_path} (mode 0600): joining nodes and drivers need "
              f"a copy of it (--token-file)", file=sys.stderr, flush=True)
    else:
        token = read_token(token_path)
        check_reachable(args.address, host_port=True)   # `ray start` would retry for many minutes
        if os.environ.get("RAY_USE_TLS", "").strip().lower() not in ("1", "true"):   # TLS: its own first bytes
            check_speaks_grpc(args.address)
    print(listen_note(token_path, node_ip), file=sys.stderr, flush=True)
    resources = node_resources(os.environ, args.adb_host, args.adb_port, use_adb=not args.no_adb,
                               start_server=not args.no_start_server, warn=_warn)
    if args.expose:
        print(EXPOSE_WARNING, file=sys.stderr, flush=True)
    if exposed is not None:
        for line in exposure_warnings(node_ip, args.port if head else None, exposed, dashboard_packages()):
            _warn(line)
    phones = sorted(k.split(":", 1)[1] for k in resources if k.startswith("xfc-phone:"))
    if args.num_cpus == 0 and phones:
        raise XfcError(f"--num-cpus 0: this node offers phones ({', '.join(phones)}) whose tasks each need a CPU "
                       f"here; give --num-cpus 1 or more, or --no-adb")
    print(f"xfc: {'head' if head else 'worker'} node offering {', '.join(sorted(resources)) or 'CPU only'}"
          + (f" (phones: {', '.join(phones)})" if phones else ""), file=sys.stderr, flush=True)
    store_mb = args.object_store_mb
    return start_args(head=head, address=getattr(args, "address", None), port=getattr(args, "port", 0),
                      resources=resources, num_cpus=args.num_cpus,
                      object_store_bytes=store_mb * 1024 * 1024 if store_mb is not None else None,
                      temp_dir=args.temp_dir, node_ip=node_ip, exposed=exposed), token


def cmd_head(args) -> int:
    from ..tiledb.cluster import run_node
    ray_args, token = _node_args(args, True, _token_path(args))
    run_node(ray_args, os.environ, args.adb_host, args.adb_port, "head", token)
    return 0


def cmd_join(args) -> int:
    from ..tiledb.cluster import run_node
    ray_args, token = _node_args(args, False, _token_path(args))
    run_node(ray_args, os.environ, args.adb_host, args.adb_port, "worker", token)
    return 0


def cmd_resources(args) -> int:
    from ..tiledb.cluster import node_resources
    if args.address:
        from ..tiledb.ray_executor import connect, require_ray
        from ..tiledb.raytoken import driver_token, read_token
        ray = require_ray()
        with driver_token(read_token(_token_path(args))):
            connect(ray, args.address)
            try:
                nodes = [{"node": n["NodeID"][:8], "host": n.get("NodeManagerHostname", ""), "alive": n["Alive"],
                          "resources": {k: v for k, v in n["Resources"].items()
                                        if k.startswith("xfc-") or k == "CPU"}}
                         for n in ray.nodes()]
            finally:
                ray.shutdown()
        print(json.dumps(nodes, indent=1, sort_keys=True))
    else:
        print(json.dumps(node_resources(os.environ, args.adb_host, args.adb_port, use_adb=not args.no_adb,
                                        start_server=not args.no_start_server, warn=_warn),
                         indent=1, sort_keys=True))
    return 0


def _token_option(p, what: str) -> None:
    p.add_argument("--token-file", metavar="PATH", default=None,
                   help=f"{what} (default: $XDG_STATE_HOME/xfc/ray-cluster.token, i.e. ~/.local/state/xfc/...)")


def _common(p) -> None:
    # 0 as Ray allows (a head that only coordinates), but not on a node that offers phones: every xfc
    # task asks for one CPU (RayExecutor.submit), so its phones' tasks would never run (_node_args).
    p.add_argument("--num-cpus", type=non_negative_int, default=None, metavar="N",
                   help="CPUs this node offers to tasks (default: all; 0: a node that only coordinates, "
                        "with --no-adb)")
    p.add_argument("--object-store-mb", type=positive_int, default=None, metavar="MB",
                   help="Ray object store size in MiB (Ray's minimum: 75)")
    p.add_argument("--temp-dir", default=None, help="Ray's temporary directory (sockets, logs)")
    p.add_argument("--expose", action="store_true",
                   help="let other hosts reach this node at --node-ip instead of listening on 127.0.0.1 only "
                        "(prints a warning: a Ray node runs code for anyone who can reach it and holds the "
                        "token; Ray's GCS, raylet and core workers then listen on every interface, each "
                        "named with its ports)")
    p.add_argument("--node-ip", metavar="ADDR", default=None,
                   help="with --expose (required there): the IPv4 address of this host that the other nodes "
                        "reach; Ray advertises it and binds its agents to it")
    p.add_argument("--no-adb", action="store_true", help="do not look for phones")
    add_adb_server_options(p)


def register(sub) -> None:
    c = sub.add_parser("cluster", help="Ray nodes for 'xfc tiledb build --executor ray' (needs xfc[ray])")
    csub = c.add_subparsers(dest="cluster_command", metavar="SUBCOMMAND", parser_class=sub._parser_class)
    what = "every Ray process of the node listens on 127.0.0.1 only unless --expose --node-ip ADDR"
    stop = "blocks; Ctrl-C or SIGTERM stops every Ray process it started"
    p = csub.add_parser("head", help=f"start the cluster's head node here ({stop})",
                        description=f"Start the cluster's head node here: {what} ({stop}).")
    p.add_argument("--port", type=tcp_port, default=DEFAULT_HEAD_PORT, metavar="PORT",
                   help=f"GCS port, 1-65535 (default {DEFAULT_HEAD_PORT})")
    _token_option(p, "write a fresh cluster token here (mode 0600; replaces only a token file xfc wrote)")
    _common(p)
    p.set_defaults(func=cmd_head)
    p = csub.add_parser("join", help=f"start a worker node here that registers its phones ({stop})",
                        description=f"Start a worker node here that registers its phones: {what} ({stop}).")
    p.add_argument("--address", required=True, metavar="ADDR", help="the head's HOST:PORT")
    _token_option(p, "the cluster token: a copy of the file 'xfc cluster head' wrote")
    _common(p)
    p.set_defaults(func=cmd_join)
    p = csub.add_parser("resources", help="what this host would advertise, or (--address) every node's")
    p.add_argument("--address", metavar="ADDR", help="list the nodes of this running cluster")
    _token_option(p, "--address: the cluster token ('xfc cluster head' wrote it)")
    p.add_argument("--no-adb", action="store_true", help="do not look for phones")
    add_adb_server_options(p)
    p.set_defaults(func=cmd_resources)
    c.set_defaults(func=lambda a: (c.print_help(), 2)[1])
