"""xfc/settings.py: on/off environment variables read strictly (a typo is one error, never 'on')."""
from __future__ import annotations

import pytest

from xfc import settings
from xfc.errors import XfcError
from xfc.tiledb.hostdesc import probe_enabled

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("value, expected", [(None, True), ("", True), ("on", True), (" YES ", True), ("1", True),
                                             ("off", False), ("0", False), ("False", False), ("no", False)])
def test_switches_read_on_and_off(value, expected):
    environ = {} if value is None else {"XFC_PCH": value, "XFC_HOST_PROBE": value}
    assert settings.precompiled_headers(environ) is expected
    assert probe_enabled(environ) is expected


@pytest.mark.parametrize("name", ["XFC_PCH", "XFC_HOST_PROBE"])
def test_any_other_value_is_one_error_naming_the_variable(name):
    read = settings.precompiled_headers if name == "XFC_PCH" else probe_enabled
    with pytest.raises(XfcError, match=rf"environment variable {name}='maybe': expected on or off"):
        read({name: "maybe"})


def test_the_command_line_checks_the_switches_before_any_work(monkeypatch, capsys):
    """XFC_PCH was read at the first compile (after synthesis, inside a compile worker) and
    XFC_HOST_PROBE only under --hw host: a typo in either is one line before anything runs."""
    from xfc.cli import main
    monkeypatch.setenv("XFC_PCH", "maybe")
    assert main(["hw", "show", "cortex-a76"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.strip() == (
        "xfc: error: environment variable XFC_PCH='maybe': expected on or off (also 1, yes, true, 0, no, false)")
