"""argparse `type=` functions for numeric options: a value out of range is refused while parsing.

Each raises argparse.ArgumentTypeError with the value as given, so xfc's parser (xfc/cli/main.py
`_Parser`) prints one line naming the option and the value, exit 2, before anything starts.
"""
from __future__ import annotations

import argparse
import math


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None


def tcp_port(text: str) -> int:
    """A TCP port, 1-65535 (0, "any free port", is not a port a peer can be told)."""
    value = _int(text, "a TCP port 1-65535")
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port 1-65535, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1."""
    value = _int(text, "an integer >= 1")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    value = _int(text, "an integer >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (not nan, not inf)."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value
