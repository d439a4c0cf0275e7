"""The `xfc` command line: the composition root. It parses arguments, reads settings, calls the
library (xfc.pipeline, xfc.hardware, xfc.tiledb, xfc.testing.fuzz, xfc.model) and formats its reports;
the library never imports it.

  main.py     the parser, shared helpers (tables), `xfc hw`, signals and exit statuses; main()
  synth.py    `xfc synth` (CPU and GPU)          bench.py    `xfc bench` (ADB device or QEMU)
  devices.py  `xfc devices`                      fuzz.py     `xfc fuzz`
  tiledb.py   `xfc tiledb ...`                   model.py    `xfc model`
"""
from .main import build_parser, hardware_summary, main

__all__ = ["build_parser", "hardware_summary", "main"]
