"""Error types. Every message is one line that names the file, field or value at fault.

The CLI maps XfcError to exit status 2 (bad input) and ToolchainError / DeviceError to 3,
printing only the message; nothing below the CLI prints or exits.
"""
from __future__ import annotations


class XfcError(Exception):
    """Bad input: a hardware file, an operator request or a shape. Exit status 2."""

    exit_code = 2

    def __init__(self, message: str):
        # One line, always: a user sees exactly this after 'xfc: error: '.
        super().__init__(" ".join(str(message).split()))


class HardwareError(XfcError):
    """A hardware description that cannot be loaded or is impossible."""


class OperatorError(XfcError):
    """An unknown operator, an invalid shape or an impossible request."""


class ToolchainError(XfcError):
    """A compiler, emulator or OpenCL runtime that is missing or failed. Exit status 3."""

    exit_code = 3


class VerificationError(XfcError):
    """A kernel ran but its output differs from the numpy reference. Exit status 4."""

    exit_code = 4


class DeviceError(XfcError):
    """No device, several devices, an unauthorized/offline device, or a run that failed on it."""

    exit_code = 3
