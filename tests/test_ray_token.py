"""The Ray cluster token (xfc/tiledb/raytoken.py): written 0600 and atomically, never over a file
xfc did not write; a missing or unreadable token is one line, exit 2, before anything starts or
connects; the token reaches Ray through the environment, and this process's environment is
restored after a driver connects. (Refusal of a wrong token by a real cluster: test_ray_cluster.py.)"""
from __future__ import annotations

import importlib.util
import os
import stat

import pytest

from xfc.cli import main
from xfc.errors import XfcError
from xfc.tiledb.raytoken import (AUTH_VARS, TOKEN_PREFIX, create_token_file, default_token_path,
                                 is_xfc_token_file, node_environ, read_token)

pytestmark = pytest.mark.unit

# Found, not imported: importing Ray costs a second at collection, and a broken install should fail
# the tests that use it, not skip them.
HAVE_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(not HAVE_RAY, reason="ray is not installed (xfc[ray])")


def test_default_location_is_xfcs_state_dir(tmp_path):
    assert default_token_path({"XDG_STATE_HOME": "/s"}) == default_token_path({"XDG_STATE_HOME": "/s", "HOME": "/h"})
    assert str(default_token_path({"XDG_STATE_HOME": "/s"})) == "/s/xfc/ray-cluster.token"
    assert str(default_token_path({"HOME": "/h"})) == "/h/.local/state/xfc/ray-cluster.token"


def test_a_fresh_token_is_written_0600_atomically_and_replaces_only_xfcs_own(tmp_path):
    path = tmp_path / "state" / "xfc" / "ray.token"
    first = create_token_file(path)
    assert first.startswith(TOKEN_PREFIX) and len(first) == len(TOKEN_PREFIX) + 64
    assert path.read_text() == first                                    # exactly the token, no newline
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert is_xfc_token_file(path)
    second = create_token_file(path)                                    # xfc's own: replaced by a new one
    assert second != first and path.read_text() == second and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["ray.token"]     # no temporary file left
    # anything else is kept as it was: a foreign file, Ray's own token format, a link to xfc's token
    foreign = tmp_path / "notes.txt"
    foreign.write_text("my notes\n")
    ray_style = tmp_path / "auth_token"
    ray_style.write_text("ab" * 32)
    link = tmp_path / "link.token"
    link.symlink_to(path)
    for other in (foreign, ray_style, link):
        before = other.read_text()
        with pytest.raises(XfcError, match="is not a token file xfc wrote"):
            create_token_file(other)
        assert other.read_text() == before
    assert path.read_text() == second and link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["auth_token", "link.token", "notes.txt", "state"]


def test_a_file_appearing_during_the_write_is_not_replaced(tmp_path, monkeypatch):
    path = tmp_path / "ray.token"
    real_link = os.link

    def racing_link(src, dst):
        path.write_text("someone else's")
        return real_link(src, dst)

    monkeypatch.setattr(os, "link", racing_link)
    with pytest.raises(XfcError, match="created it meanwhile"):
        create_token_file(path)
    assert path.read_text() == "someone else's" and [p.name for p in tmp_path.iterdir()] == ["ray.token"]


def test_reading_a_missing_empty_or_unreadable_token_is_one_line(tmp_path):
    for bad, why in ((tmp_path / "none", "no such file"), (tmp_path, "cannot read it"),
                     (tmp_path / "empty", "not a token")):
        if bad.name == "empty":
            bad.write_text("\n")
        with pytest.raises(XfcError) as raised:
            read_token(bad)
        assert str(raised.value).startswith(f"--token-file {bad}: {why}") and "\n" not in str(raised.value)
    good = tmp_path / "copied"
    good.write_text("ab" * 32 + "\n")                # any token a user copied, trailing newline ignored
    assert read_token(good) == "ab" * 32


def test_the_token_goes_in_the_environment_and_overrides_stray_settings():
    environ = {"PATH": "/bin", "RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN_PATH": "/elsewhere"}
    out = node_environ(environ, "xfc1-secret")
    assert out == {"PATH": "/bin", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "xfc1-secret"}
    assert environ["RAY_AUTH_MODE"] == "disabled"                       # the input is not changed


@needs_ray
def test_a_driver_connection_restores_this_processs_environment(monkeypatch):
    from xfc.tiledb.raytoken import driver_token
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", "/somewhere")
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    with driver_token("xfc1-inside"):
        assert os.environ["RAY_AUTH_MODE"] == "token" and os.environ["RAY_AUTH_TOKEN"] == "xfc1-inside"
        assert "RAY_AUTH_TOKEN_PATH" not in os.environ
    assert {k: os.environ.get(k) for k in AUTH_VARS} == {
        "RAY_AUTH_MODE": None, "RAY_AUTH_TOKEN": None, "RAY_AUTH_TOKEN_PATH": "/somewhere"}


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("xfc: error: --token-file "), err
    return err[0]


@needs_ray
def test_without_the_token_nothing_starts_or_connects(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))      # the default location: empty
    db = tmp_path / "t.sqlite"
    missing = tmp_path / "missing.token"
    assert main(["tiledb", "build", "--hw", "snapdragon-865", "--evaluators", "static", "--executor", "ray",
                 "--address", "127.0.0.1:1", "--db", str(db)]) == 2
    assert str(default_token_path()) in _one_line(capsys) and not db.exists()
    assert main(["tiledb", "build", "--hw", "snapdragon-865", "--evaluators", "static", "--executor", "ray",
                 "--address", "127.0.0.1:1", "--token-file", str(missing), "--db", str(db)]) == 2
    assert "no such file" in _one_line(capsys) and not db.exists()
    assert main(["cluster", "join", "--address", "127.0.0.1:1", "--no-adb", "--token-file", str(missing)]) == 2
    assert "no such file" in _one_line(capsys)
    assert main(["cluster", "resources", "--address", "127.0.0.1:1", "--token-file", str(tmp_path)]) == 2
    assert "cannot read it" in _one_line(capsys)
    foreign = tmp_path / "foreign"
    foreign.write_text("keep me")
    assert main(["cluster", "head", "--no-adb", "--token-file", str(foreign)]) == 2
    assert "is not a token file xfc wrote" in _one_line(capsys) and foreign.read_text() == "keep me"
    assert main(["tiledb", "build", "--hw", "snapdragon-865", "--evaluators", "static", "--token-file",
                 str(foreign), "--db", str(db)]) == 2
    assert "--token-file is for --executor ray" in capsys.readouterr().err and not db.exists()


def test_an_address_where_nothing_listens_is_one_line_not_a_hang():
    """ray.init would wait without end; the reachability check answers at once: a head that is not
    there is exit 3 (like a missing adb server), an impossible address exit 2."""
    import socket as _socket

    from xfc.errors import DeviceError
    from xfc.tiledb.ray_executor import check_reachable
    with _socket.socket() as s:                 # a free loopback port with nothing listening on it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(DeviceError, match=f"127.0.0.1:{port}: no Ray cluster answers there") as absent:
        check_reachable(f"127.0.0.1:{port}", timeout_s=2.0)
    assert absent.value.exit_code == 3
    for address in ("127.0.0.1:99999", "127.0.0.1:0"):
        with pytest.raises(XfcError, match="the port must be a TCP port 1-65535") as wrong:
            check_reachable(address)
        assert wrong.value.exit_code == 2
    with pytest.raises(XfcError, match="not HOST:PORT") as wrong:
        check_reachable("auto", host_port=True)   # a node joining needs the head's HOST:PORT
    assert wrong.value.exit_code == 2
    check_reachable("auto")                     # not host:port: left to Ray
