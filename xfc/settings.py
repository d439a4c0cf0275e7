"""The settings xfc takes from the environment: the one library module that reads os.environ.

The command line (xfc/cli/) reads them here once and passes the values down explicitly. Library
functions that take one of these settings as a parameter fall back to the function below when
the caller passes FROM_ENVIRONMENT (their default), so the Python API behaves as the command
line does. Every function takes an optional `environ` mapping (default os.environ) for tests.

  XFC_HOST_ISA                       host_isa_cap(): the widest x86-64 ISA plain 'host' may claim
  XFC_CACHE_DIR, XDG_CACHE_HOME, HOME  cache_dir(): the per-user cache (OpenCL harness, tile db)
  XDG_STATE_HOME, HOME               state_dir(): per-user state that is not a cache (the Ray cluster token)
  ANDROID_ADB_SERVER_HOST / _PORT    adb_server(): where the adb server listens
  XFC_ADB                            adb_binary(): the adb executable used to start a server
  XFC_TEST_MUTANT                    test_mutant(): TEST-ONLY deliberately wrong kernel (xfc.testing.mutants)
  XFC_DEBUG                          debug(): show tracebacks of internal errors
  XFC_PCH                            precompiled_headers(): 'off' compiles kernels without the
                                     precompiled ISA header (xfc.toolchain.pch)
Other environment reads, each documented where it happens (docs/ARCHITECTURE.md lists them):
child processes inherit the environment (xfc/toolchain/procs.py adds to it); `xfc tiledb` and
`make tiledb` read SOURCE_DATE_EPOCH through xfc.tiledb.store.timestamps(environ).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Optional


class _FromEnvironment:
    def __repr__(self) -> str:
        return "FROM_ENVIRONMENT"


FROM_ENVIRONMENT = _FromEnvironment()   # parameter default: "use the setting from the environment"

HOST_ISA_ENV = "XFC_HOST_ISA"
TEST_MUTANT_ENV = "XFC_TEST_MUTANT"
DEFAULT_ADB_HOST = "127.0.0.1"
DEFAULT_ADB_PORT = 5037
SWITCH_ON = ("", "on", "1", "yes", "true")
SWITCH_OFF = ("off", "0", "no", "false")


def switch(environ: Mapping[str, str], name: str) -> bool:
    """An on/off variable (unset or empty: on). Any other value is one clear error, not silently
    'on': XFC_HOST_PROBE=maybe measured the host as if it said so."""
    value = environ.get(name, "").strip().lower()
    if value in SWITCH_OFF:
        return False
    if value not in SWITCH_ON:
        from .errors import XfcError
        raise XfcError(f"environment variable {name}={environ[name]!r}: expected on or off "
                       f"(also {', '.join(v for v in SWITCH_ON[2:] + SWITCH_OFF[1:])})")
    return True


def _env(environ: Optional[Mapping[str, str]]) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def environment() -> Mapping[str, str]:
    """The whole environment, for the Python API (xfc.api), which hands it down as the command line
    does (the host probe's XFC_HOST_PROBE, the tile database's locations)."""
    return os.environ


def host_isa_cap(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """XFC_HOST_ISA, lower-cased (None when unset or empty). Checked by xfc.hardware.host."""
    value = _env(environ).get(HOST_ISA_ENV, "").strip().lower()
    return value or None


def cache_dir(environ: Optional[Mapping[str, str]] = None) -> Path:
    """$XFC_CACHE_DIR, else $XDG_CACHE_HOME/xfc, else ~/.cache/xfc."""
    env = _env(environ)
    if env.get("XFC_CACHE_DIR"):
        return Path(env["XFC_CACHE_DIR"])
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]) / "xfc"
    home = env.get("HOME")
    return (Path(home) if home else Path.home()) / ".cache" / "xfc"


def precompiled_headers(environ: Optional[Mapping[str, str]] = None) -> bool:
    """False when XFC_PCH is off / 0 / no / false (xfc.toolchain.pch: a compile-time cache only)."""
    return switch(_env(environ), "XFC_PCH")


def state_dir(environ: Optional[Mapping[str, str]] = None) -> Path:
    """$XDG_STATE_HOME/xfc, else ~/.local/state/xfc (the Ray cluster token lives here)."""
    env = _env(environ)
    if env.get("XDG_STATE_HOME"):
        return Path(env["XDG_STATE_HOME"]) / "xfc"
    home = env.get("HOME")
    return (Path(home) if home else Path.home()) / ".local" / "state" / "xfc"


def adb_server(environ: Optional[Mapping[str, str]] = None) -> tuple[str, int]:
    """(host, port) of the adb server: ANDROID_ADB_SERVER_HOST / _PORT, else 127.0.0.1:5037."""
    env = _env(environ)
    try:
        port = int(env.get("ANDROID_ADB_SERVER_PORT", str(DEFAULT_ADB_PORT)))
    except ValueError:
        port = DEFAULT_ADB_PORT
    return env.get("ANDROID_ADB_SERVER_HOST", DEFAULT_ADB_HOST), port


def adb_binary(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """$XFC_ADB: the adb executable to start a server with (None: look for one)."""
    return _env(environ).get("XFC_ADB") or None


def test_mutant(environ: Optional[Mapping[str, str]] = None) -> str:
    """TEST-ONLY: the name of a mutant from xfc.testing.mutants to apply to rendered kernels ('' = none)."""
    return _env(environ).get(TEST_MUTANT_ENV, "").strip()


def debug(environ: Optional[Mapping[str, str]] = None) -> bool:
    """XFC_DEBUG set (non-empty): internal errors show their traceback."""
    return bool(_env(environ).get("XFC_DEBUG"))
