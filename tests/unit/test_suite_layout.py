"""The test suite's own layout (issue 31 item 8): a test module imports no other test module and
edits no sys.path to reach a helper; what tests share lives in tests/support/ (a package, on the
path pytest gives the test directory) or in tests/conftest.py. An `ast` walk, so an import inside a
function counts too; the child scripts some tests write (string constants) are not code here.
Only the files whose text could hold such an import or sys.path are parsed."""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parents[1]
TEST_MODULES = {p.stem for p in TESTS.rglob("test_*.py")}
# Text without a match holds neither (an import statement names its module after from/import).
SUSPECT = re.compile(r"(?m)^\s*(?:from|import)\s+(?:tests\b|test_)|\bsys\s*\.\s*path\b|\bfrom\s+sys\s+import\b")


@functools.lru_cache(maxsize=None)
def _suspects() -> dict[str, ast.Module]:
    """relative path -> syntax tree of the .py files under tests/ that SUSPECT matches."""
    out = {}
    for path in sorted(TESTS.rglob("*.py")):
        text = path.read_text()
        if SUSPECT.search(text):
            out[str(path.relative_to(TESTS))] = ast.parse(text, str(path))
    return out


def _is_test_module(module: str) -> bool:
    return module.removeprefix("tests.").split(".")[0] in TEST_MODULES


def test_no_test_module_imports_another():
    bad = []
    for name, tree in _suspects().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                modules = [node.module] + ([f"{node.module}.{a.name}" for a in node.names]
                                           if node.module == "tests" else [])
            else:
                continue
            bad += [f"{name}:{node.lineno}: {m}" for m in modules if _is_test_module(m)]
    assert bad == [], "test modules importing test modules (move the helper to tests/support/):\n" + "\n".join(bad)


def test_no_test_module_edits_sys_path():
    bad = []
    for name, tree in _suspects().items():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                    and node.value.id == "sys"):
                bad.append(f"{name}:{node.lineno}")
            elif isinstance(node, ast.ImportFrom) and node.module == "sys" and any(a.name == "path" for a in node.names):
                bad.append(f"{name}:{node.lineno}")
    assert bad == [], "sys.path used in test code (import helpers from tests/support/):\n" + "\n".join(bad)
