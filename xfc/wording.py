"""Wording shared by reports and messages."""
from __future__ import annotations


def counted(count: int, singular: str, plural: str | None = None) -> str:
    """'1 kernel', '3 kernels', '0 kernels' ('1 runtime op', not '1 runtime ops')."""
    return f"{count} {singular if count == 1 else (plural or singular + 's')}"
