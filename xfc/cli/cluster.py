"""`xfc cluster head|join|resources`: Ray nodes for `xfc tiledb build --executor ray` (xfc/tiledb/cluster.py)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ..errors import XfcError
from .adb_options import add_adb_server_options

DEFAULT_HEAD_PORT = 6379


def _warn(message: str) -> None:
    print(f"xfc: warning: {message}", file=sys.stderr, flush=True)


def _token_path(args):
    from ..tiledb.raytoken import default_token_path
    return Path(args.token_file) if args.token_file else default_token_path(os.environ)


def _node_args(args, head: bool, token_path: Path) -> tuple[list[str], str]:
    """(the `ray start` arguments, the cluster token)."""
    from ..tiledb.cluster import EXPOSE_WARNING, node_resources, start_args
    from ..tiledb.ray_executor import require_ray
    from ..tiledb.raytoken import create_token_file, listen_note, read_token
    require_ray()
    if args.num_cpus is not None and args.num_cpus < 0:
        raise XfcError(f"--num-cpus must be >= 0, got {args.num_cpus}")
    if head:
        token = create_token_file(token_path)
        print(f"xfc: wrote a new cluster token to {token_path} (mode 0600): joining nodes and drivers need "
              f"a copy of it (--token-file)", file=sys.stderr, flush=True)
    else:
        token = read_token(token_path)
    print(listen_note(token_path), file=sys.stderr, flush=True)
    resources = node_resources(os.environ, args.adb_host, args.adb_port, use_adb=not args.no_adb,
                               start_server=not args.no_start_server, warn=_warn)
    if args.expose:
        print(EXPOSE_WARNING, file=sys.stderr, flush=True)
    phones = sorted(k.split(":", 1)[1] for k in resources if k.startswith("xfc-phone:"))
    print(f"xfc: {'head' if head else 'worker'} node offering {', '.join(sorted(resources)) or 'CPU only'}"
          + (f" (phones: {', '.join(phones)})" if phones else ""), file=sys.stderr, flush=True)
    return start_args(head=head, address=getattr(args, "address", None), port=getattr(args, "port", 0),
                      resources=resources, num_cpus=args.num_cpus,
                      object_store_bytes=args.object_store_mb * 1024 * 1024 if args.object_store_mb else None,
                      temp_dir=args.temp_dir, expose=args.expose, node_ip=None), token


def cmd_head(args) -> int:
    from ..tiledb.cluster import exec_node
    ray_args, token = _node_args(args, True, _token_path(args))
    exec_node(ray_args, os.environ, args.adb_host, args.adb_port, "head", token)
    return 0


def cmd_join(args) -> int:
    from ..tiledb.cluster import exec_node
    ray_args, token = _node_args(args, False, _token_path(args))
    exec_node(ray_args, os.environ, args.adb_host, args.adb_port, "worker", token)
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
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs this node offers to tasks (default: all)")
    p.add_argument("--object-store-mb", type=int, default=None, help="Ray object store size in MiB")
    p.add_argument("--temp-dir", default=None, help="Ray's temporary directory (sockets, logs)")
    p.add_argument("--expose", action="store_true",
                   help="give Ray this host's network address instead of 127.0.0.1 (prints a warning: a Ray "
                        "node runs code for anyone who can reach it and holds the token)")
    p.add_argument("--no-adb", action="store_true", help="do not look for phones")
    add_adb_server_options(p)


def register(sub) -> None:
    c = sub.add_parser("cluster", help="Ray nodes for 'xfc tiledb build --executor ray' (needs xfc[ray])")
    csub = c.add_subparsers(dest="cluster_command", metavar="SUBCOMMAND", parser_class=sub._parser_class)
    p = csub.add_parser("head", help="start the cluster's head node here (blocks; Ctrl-C stops it)")
    p.add_argument("--port", type=int, default=DEFAULT_HEAD_PORT, help=f"GCS port (default {DEFAULT_HEAD_PORT})")
    _token_option(p, "write a fresh cluster token here (mode 0600; replaces only a token file xfc wrote)")
    _common(p)
    p.set_defaults(func=cmd_head)
    p = csub.add_parser("join", help="start a worker node here that registers its phones (blocks)")
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
