"""argparse `type=` functions for the numbers the commands take: a value out of range is refused
while the command line is parsed (one line, exit 2, naming the option), not after a build or as
a device error."""
from __future__ import annotations

import argparse
import math


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got '{text}'") from None


def positive_int(text: str) -> int:
    """An integer >= 1 (counts: repetitions, CPUs, jobs)."""
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got '{text}'")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0 (seeds, warm-up runs, retries, limits where 0 means none)."""
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got '{text}'")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (seconds)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got '{text}'") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got '{text}'")
    return value


def tcp_port(text: str) -> int:
    """A TCP port, 1-65535."""
    value = _integer(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port 1-65535, got '{text}'")
    return value
