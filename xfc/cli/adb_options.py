"""The adb server options every device-facing command shares (one spelling, one help text)."""
from __future__ import annotations

from .arg_types import tcp_port


def add_adb_server_options(parser, *, start_server_flag: bool = True) -> None:
    """--adb-host / --adb-port (and --no-start-server) on `parser`."""
    parser.add_argument("--adb-host", default=None,
                        help="adb server host (default: $ANDROID_ADB_SERVER_HOST or 127.0.0.1)")
    parser.add_argument("--adb-port", type=tcp_port, default=None,
                        help="adb server port (default: $ANDROID_ADB_SERVER_PORT or 5037)")
    if start_server_flag:
        parser.add_argument("--no-start-server", action="store_true",
                            help="do not start an adb server when none is running")
