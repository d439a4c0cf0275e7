"""The hardware a command names, as the command line loads it: the host measured by the probe
(xfc.tiledb.hostdesc) with this process's environment, warnings on stderr."""
from __future__ import annotations

import dataclasses
import hashlib
import os
import sys

from ..hardware.model import HardwareDescription
from ..tiledb.hostdesc import load_hardware
from ..tiledb.locations import is_shipped_hardware


def load_for_command_line(name: str, *, remeasure: bool = False) -> HardwareDescription:
    return load_hardware(name, os.environ, remeasure=remeasure,
                         warn=lambda message: print(f"xfc: {message}", file=sys.stderr, flush=True))


def output_folder_name(hw: HardwareDescription) -> str:
    """The hardware's part of a default output folder: its name for a shipped description or the host;
    for a description loaded from the user's own file, the name and a digest of what it describes, so
    a local edit of a shipped SoC (same name, other caches or clocks) never shares, and replaces, the
    shipped one's folder. Same description, same folder."""
    if hw.kind == "host" or not hw.source_path or is_shipped_hardware(hw):
        return hw.name
    described = repr(dataclasses.replace(hw, source_path=""))
    return f"{hw.name}-{hashlib.sha256(described.encode()).hexdigest()[:8]}"
