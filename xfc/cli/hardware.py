"""The hardware a command names, as the command line loads it: the host measured by the probe
(xfc.tiledb.hostdesc) with this process's environment, warnings on stderr."""
from __future__ import annotations

import os
import sys

from ..hardware.model import HardwareDescription
from ..tiledb.hostdesc import load_hardware


def load_for_command_line(name: str, *, remeasure: bool = False) -> HardwareDescription:
    return load_hardware(name, os.environ, remeasure=remeasure,
                         warn=lambda message: print(f"xfc: {message}", file=sys.stderr, flush=True))
