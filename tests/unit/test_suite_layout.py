"""The test suite's own layout (issue 31 item 8): a test module imports no other test module and
edits no sys.path to reach a helper; what tests share lives in tests/support/ (a package, on the
path pytest gives the test directory) or in tests/conftest.py. An `ast` walk, so an import inside a
function counts too; the child scripts some tests write (string constants) are not code here."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parents[1]
TEST_MODULES = {p.stem for p in TESTS.rglob("test_*.py")}


def _sources() -> dict[str, ast.Module]:
    return {str(p.relative_to(TESTS)): ast.parse(p.read_text(), str(p)) for p in sorted(TESTS.rglob("*.py"))}


def test_no_test_module_imports_another():
    bad = []
    for name, tree in _sources().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                modules = [node.module or ""]
            else:
                continue
            bad += [f"{name}:{node.lineno}: {m}" for m in modules
                    if m.removeprefix("tests.").split(".")[0] in TEST_MODULES]
    assert bad == [], "test modules importing test modules (move the helper to tests/support/):\n" + "\n".join(bad)


def test_no_test_module_edits_sys_path():
    bad = []
    for name, tree in _sources().items():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                    and node.value.id == "sys"):
                bad.append(f"{name}:{node.lineno}")
    assert bad == [], "sys.path used in test code (import helpers from tests/support/):\n" + "\n".join(bad)
