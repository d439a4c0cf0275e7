"""The token every Ray node and driver that xfc starts must present (Ray's RAY_AUTH_MODE=token).

A node xfc starts listens on 127.0.0.1 only unless --expose (xfc/tiledb/raybind.py), and even an
exposed node has servers that listen on every interface; so each node also requires a token:
Ray's servers refuse requests that do not carry it. `xfc cluster head` writes a fresh random token
to a file (create_token_file: mode 0600, atomically, replacing only a token file xfc wrote); joining
nodes and drivers (`xfc cluster join`, `xfc cluster resources --address`, `xfc tiledb build
--executor ray`) read it from --token-file (default_token_path: $XDG_STATE_HOME/xfc/ray-cluster.token).

The token reaches Ray through the environment only (RAY_AUTH_TOKEN; /proc/PID/environ is private
to the user), never a command line (ps shows those): node_environ() for the `ray start` process a
node runs, driver_token() around ray.init in this process (os.environ is set for Ray's C++
config and restored afterwards: the one place xfc writes os.environ).
"""
from __future__ import annotations

import os
import re
import secrets
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping, Optional

from ..errors import XfcError
from ..settings import state_dir

TOKEN_FILE_NAME = "ray-cluster.token"
TOKEN_PREFIX = "xfc1-"          # marks a token xfc generated: only such a file is ever replaced
_XFC_TOKEN = re.compile(r"xfc1-[0-9a-f]{64}")
AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def default_token_path(environ: Optional[Mapping[str, str]] = None) -> Path:
    """Where `xfc cluster head` writes the token and everyone else looks for it by default."""
    return state_dir(environ) / TOKEN_FILE_NAME


def new_token() -> str:
    """256 random bits, hex, with xfc's prefix."""
    return TOKEN_PREFIX + secrets.token_hex(32)


def is_xfc_token_file(path: Path) -> bool:
    """A regular file (not a link) of this user holding exactly one token xfc generated."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_size > 256:
            return False
        return bool(_XFC_TOKEN.fullmatch(Path(path).read_text(encoding="ascii").strip()))
    except (OSError, UnicodeDecodeError):
        return False


def create_token_file(path: Path) -> str:
    """Write a fresh token to path (mode 0600, atomically) and return it. A file already there is
    replaced only when xfc wrote it (is_xfc_token_file); anything else is refused (XfcError)."""
    path = Path(path)
    if os.path.lexists(path) and not is_xfc_token_file(path):
        raise XfcError(f"--token-file {path}: exists and is not a token file xfc wrote; "
                       "name another file (xfc never replaces a file it did not write)")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise XfcError(f"--token-file {path}: cannot create its directory ({exc.strerror})") from None
    token = new_token()
    fd, tmp = None, None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)   # mode 0600
        os.fchmod(fd, 0o600)
        os.write(fd, token.encode("ascii"))      # no newline: the file is exactly the token
        os.fsync(fd)
        os.close(fd)
        fd = None
        if os.path.lexists(path):
            os.replace(tmp, path)                # xfc's own older token (checked above)
        else:
            os.link(tmp, path)                   # never replaces a file that appeared meanwhile
            os.unlink(tmp)
        tmp = None
    except FileExistsError:
        raise XfcError(f"--token-file {path}: another process created it meanwhile; not replaced") from None
    except OSError as exc:
        raise XfcError(f"--token-file {path}: cannot write it ({exc.strerror})") from None
    finally:
        if fd is not None:
            os.close(fd)
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return token


def read_token(path: Path) -> str:
    """The token in path, or XfcError (exit 2, one line) saying it is missing, unreadable or empty."""
    hint = "copy the token file that 'xfc cluster head' wrote on the head host (mode 0600) and name it with --token-file"
    try:
        text = Path(path).read_text(encoding="ascii")
    except FileNotFoundError:
        raise XfcError(f"--token-file {path}: no such file; {hint}") from None
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not an ASCII token"
        raise XfcError(f"--token-file {path}: cannot read it ({why}); {hint}") from None
    token = text.strip()
    if not token or any(c.isspace() for c in token):
        raise XfcError(f"--token-file {path}: not a token (empty or several words); {hint}")
    return token


def node_environ(environ: Mapping[str, str], token: str) -> dict[str, str]:
    """environ plus Ray's token mode with this token (the value, not the file: a later head that
    replaces the file must not lock out the workers this node starts afterwards)."""
    out = {k: v for k, v in environ.items() if k not in AUTH_VARS}
    out["RAY_AUTH_MODE"] = "token"
    out["RAY_AUTH_TOKEN"] = token
    return out


def _refresh_ray_auth() -> None:
    """Ray caches its config and the token in C++: re-read both from os.environ (config first)."""
    from ray._raylet import AuthenticationTokenLoader, Config
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


@contextmanager
def driver_token(token: str) -> Iterator[None]:
    """ray.init / ray.shutdown inside this block present token; os.environ is restored after."""
    saved = {k: os.environ.get(k) for k in AUTH_VARS}
    for key in AUTH_VARS:
        os.environ.pop(key, None)
    os.environ.update(node_environ({}, token))
    _refresh_ray_auth()
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        _refresh_ray_auth()


def listen_note(path: Path, node_ip: str = "127.0.0.1") -> str:
    """The line printed whenever xfc starts a Ray node."""
    refused = f"requests without this cluster's token ({path}) are refused"
    if node_ip == "127.0.0.1":
        return (f"xfc: note: this Ray node listens on 127.0.0.1 only (other hosts need --expose --node-ip ADDR); "
                f"{refused}")
    return f"xfc: note: this Ray node advertises {node_ip} to the other nodes; {refused}"
