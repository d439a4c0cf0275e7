"""Reading the descriptions `xfc hw probe` drafts."""
from __future__ import annotations


def at(data, path: str):
    """The value at a field path as `uncertain` writes it (clusters addressed by role)."""
    node = data
    for seg in path.split("."):
        node = next(c for c in node if c["role"] == seg) if isinstance(node, list) else node[seg]
    return node
