"""Input 1: hardware descriptions (hardware_descriptions/*.yaml, or this machine).

One concern per module:
  model.py     the frozen dataclasses (HardwareDescription, CpuCluster, CpuCore, GpuDescription, ...)
  schema.py    one checker per field of each file kind; cleaned fields or a one-line HardwareError
  ranges.py    the plausible range of every numeric field (twin of SCHEMA.md's table)
  rules.py     cross-field rules: values each plausible but impossible together
  load.py      strict YAML, references between files, load / validate_file / shipped_files
  host.py      this x86-64 machine as a description ('--hw host', 'host:<isa>')
  figures.py   derived peaks and the machine balance (the only place they are computed)
  identity.py  an Android device's properties and /proc/cpuinfo -> the shipped SoC description

The names below are the package's face; xfc's own modules import from the submodules.
"""
from .figures import derived_figures
from .load import SHIPPED_ROOT, load, load_path, shipped_files, validate_file
from .model import (AndroidIds, CacheLevel, CpuCluster, CpuCore, GpuDescription, HardwareDescription, LoadRules,
                    MemoryDescription)

__all__ = ["AndroidIds", "CacheLevel", "CpuCluster", "CpuCore", "GpuDescription", "HardwareDescription",
           "LoadRules", "MemoryDescription", "SHIPPED_ROOT", "derived_figures", "load", "load_path",
           "shipped_files", "validate_file"]
