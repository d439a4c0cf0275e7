"""Recognise a kernel that died of SIGILL and say why in one line.

A binary built for a newer ISA than the CPU it runs on (an armv9 kernel on an armv8.2 core) dies
of signal 4. The raw evidence differs by where it ran: a negative return code (-4) from a local
subprocess, exit status 132 (128 + 4) from a shell, or qemu-user's "uncaught target signal 4
(Illegal instruction)" on stderr. Every runner turns all of them into the same message, so the
user never has to read emulator text to learn what happened.
"""
from __future__ import annotations

SIGILL = 4
_TEXT = ("uncaught target signal 4", "illegal instruction")


def is_illegal_instruction(returncode: int | None, output: str = "") -> bool:
    """True when a process ended by SIGILL (by status or by what it printed)."""
    if returncode in (-SIGILL, 128 + SIGILL):
        return True
    low = (output or "").lower()
    return returncode not in (0, None) and any(t in low for t in _TEXT)


def illegal_instruction_message(march: str = "", cpu_features: str = "") -> str:
    """'illegal instruction: the kernel uses an instruction this CPU lacks (built for ..., ...)'."""
    detail = []
    detail.append(f"built for -march={march}" if march else "built for an unknown -march")
    if cpu_features:
        detail.append(cpu_features)
    return ("illegal instruction: the kernel uses an instruction this CPU lacks ("
            + ", ".join(detail) + ")")
