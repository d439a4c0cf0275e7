"""Shared fixtures."""
from __future__ import annotations

import pytest

from android_runner.testbed import AdbServer, find_adb


@pytest.fixture(scope="module")
def server():
    """A private real adb server on a free port, stopped after the module."""
    if find_adb() is None:
        pytest.skip("no adb binary")
    with AdbServer() as srv:
        yield srv
