"""The layering rules of docs/ARCHITECTURE.md, checked on the import statements of every module
(an `ast` walk: imports inside functions count too, so a lazy import cannot hide a wrong edge).

Layers, lowest first: leaves (errors, _version, paths, outputs, settings, wording) -> hardware/, ops/ -> the
targets cpu/, gpu/ (pure: plans and source text) -> toolchain/, runners/ -> pipeline/ (and analysis/)
-> tiledb/, testing/, model/, hwprobe/ -> cli/ and api (the composition roots).
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
LEAVES = {"xfc.errors", "xfc._version", "xfc.paths", "xfc.outputs", "xfc.settings", "xfc.wording"}
# Modules that may read os.environ or print, besides cli/ and settings.py (docs/ARCHITECTURE.md, exceptions):
ENVIRON_EXCEPTIONS = {
    "xfc.toolchain.procs": "passes xfc's own environment through to children (plus the variables a run adds)",
    "xfc.tiledb.shipped": "`python -m xfc.tiledb.shipped`, the Makefile's tile-db rebuild: its own small command line",
    "xfc.tiledb.raytoken": "sets Ray's token variables around ray.init and restores them (Ray reads them from "
                           "the environment; never a command line)",
}
PRINT_EXCEPTIONS = {"xfc.tiledb.shipped": ENVIRON_EXCEPTIONS["xfc.tiledb.shipped"]}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


FILES = {_module_name(p): p for top in ("xfc", "android_runner") for p in sorted((ROOT / top).rglob("*.py"))}


@functools.cache
def _trees() -> dict[str, ast.Module]:
    """Every module's syntax tree, parsed on first use, not at collection (a run that selects none of
    these tests, such as `-m host`, or an xdist worker that runs none of them, does not pay for it)."""
    return {name: ast.parse(path.read_text(), str(path)) for name, path in FILES.items()}


def _imports(name: str) -> set[str]:
    """The xfc / android_runner modules `name` imports (a `from pkg import sub` names pkg.sub)."""
    package = name if FILES[name].name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(_trees()[name]):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            subs = {f"{module}.{alias.name}" for alias in node.names} & FILES.keys()
            found |= subs if len(subs) == len(node.names) else subs | {module}
    return {m for m in found if m.split(".")[0] in ("xfc", "android_runner") and m in FILES and m != name}


@functools.cache
def _graph() -> dict[str, set[str]]:
    return {name: _imports(name) for name in FILES}


def _in(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _violations(sources, allowed=None, forbidden=()):
    bad = []
    for name in FILES:
        if not _in(name, *sources):
            continue
        for dep in sorted(_graph()[name]):
            if _in(dep, *sources):
                continue
            if (allowed is not None and not (dep in allowed or _in(dep, *allowed))) or _in(dep, *forbidden):
                bad.append(f"{name} -> {dep}")
    return bad


def test_leaves_import_only_leaves():
    assert _violations(sorted(LEAVES), allowed=LEAVES) == []


def test_inputs_import_only_leaves():
    """hardware/ and ops/: the two inputs. ops may not use hardware, nor hardware ops."""
    assert _violations(["xfc.hardware"], allowed=LEAVES) == []
    assert _violations(["xfc.ops"], allowed=LEAVES) == []


@pytest.mark.parametrize("target,other", [("xfc.cpu", "xfc.gpu"), ("xfc.gpu", "xfc.cpu")])
def test_targets_are_pure(target, other):
    """A target turns (spec, hardware) into a plan and source text: it builds, runs and reports nothing."""
    assert _violations([target], allowed=LEAVES | {"xfc.hardware", "xfc.ops"}) == []


@pytest.mark.parametrize("target", ["xfc.cpu", "xfc.gpu"])
def test_synthesis_and_spelling_are_separate(target):
    assert f"{target}.codegen" not in _graph()[f"{target}.synth"]
    assert not _graph()[f"{target}.codegen"] & {f"{target}.synth", f"{target}.cost_model"}


def test_build_and_runners_stay_below_the_pipeline():
    above = ["xfc.pipeline", "xfc.api", "xfc.cli", "xfc.tiledb", "xfc.testing", "xfc.model", "xfc.analysis",
             "xfc.hwprobe"]
    assert _violations(["xfc.toolchain"], forbidden=above + ["xfc.runners"]) == []
    assert _violations(["xfc.runners"], forbidden=above + ["xfc.cpu", "xfc.gpu"]) == []


def _stdlib_imports(name: str) -> set[str]:
    """Top-level names of every module `name` imports (stdlib included), function-level too."""
    found = set()
    for node in ast.walk(_trees()[name]):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.add((node.module or "").split(".")[0])
    return found


def test_build_returns_paths_and_never_loads_or_runs_them():
    """build/ compiles and returns paths: it never loads a library (ctypes) nor imports a runner;
    loading (runners/host.py) and running (runners/) happen above it. Only the host runner loads
    libraries, every dtype's (runners/hostnet.py: a whole network's runtime, xfc.compile_model); outputs.py
    uses ctypes for renameat2, not for kernels."""
    assert [n for n in FILES if _in(n, "xfc.toolchain") and "ctypes" in _stdlib_imports(n)] == []
    assert [n for n in FILES if _in(n, "xfc") and "ctypes" in _stdlib_imports(n)] == ["xfc.outputs",
                                                                                       "xfc.runners.host",
                                                                                       "xfc.runners.hostnet"]
    assert _violations(["xfc.toolchain"], forbidden=["xfc.runners", "xfc.runners.guards"]) == []


def test_only_the_chain_builds_and_runs_cpu_kernels():
    """One chain (xfc.pipeline.stages): no other module imports both the CPU kernel builds
    (xfc.toolchain.cpu) and a runner that would run what they build; synth, bench, compile, fuzz,
    sanitize, model and the tile database call the chain instead."""
    runners = {"xfc.runners", "xfc.runners.host", "xfc.runners.qemu", "xfc.runners.adb", "xfc.runners.pocl"}
    bad = [n for n, deps in _graph().items() if _in(n, "xfc") and n != "xfc.pipeline.stages"
           and "xfc.toolchain.cpu" in deps and deps & runners]
    assert bad == []
    assert {"xfc.toolchain.cpu", "xfc.runners.host", "xfc.runners.qemu"} <= _graph()["xfc.pipeline.stages"]


def test_runners_are_one_interface():
    """Every class named *Runner in runners/ derives from another runner (base.Runner at the root):
    host, local/qemu, adb and PoCL behind one execute(RunSpec) -> Measurement."""
    bad = []
    for name in FILES:
        if not _in(name, "xfc.runners"):
            continue
        for node in ast.walk(_trees()[name]):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Runner") and node.name != "Runner":
                bases = [getattr(b, "id", getattr(b, "attr", "")) for b in node.bases]
                if not any(b.endswith("Runner") for b in bases):
                    bad.append(f"{name}.{node.name}")
    assert bad == []


def test_nothing_but_cli_imports_cli():
    assert [f"{n} -> {d}" for n, deps in _graph().items() for d in deps
            if _in(d, "xfc.cli") and not _in(n, "xfc.cli", "xfc.__main__")] == []


def test_features_are_reached_from_cli_only():
    """tiledb, testing (fuzz, sanitize, the test mutants), model and hwprobe use the library; the
    library reaches them only through cli/ and the Python API's composition root xfc.api (a tile
    database's evaluator and a test's fault are passed in as objects, never imported)."""
    features = ("xfc.tiledb", "xfc.testing", "xfc.model", "xfc.hwprobe")
    bad = [f"{n} -> {d}" for n, deps in _graph().items() for d in deps
           if _in(d, *features) and not _in(n, "xfc.cli", "xfc.api") and not any(_in(n, f) and _in(d, f)
                                                                                for f in features)]
    assert bad == []


def test_android_runner_boundary():
    assert _violations(["android_runner"], allowed={"xfc.hardware", "xfc.runners", "xfc.errors"}) == []
    assert [f"{n} -> {d}" for n, deps in _graph().items() if _in(n, "xfc") for d in deps
            if _in(d, "android_runner")] == []


# The virtual device's modules, lowest first: each may import only those listed before it.
VIRTUAL_DEVICE_LAYERS = ("android_runner.adb_wire", "android_runner.device_system", "android_runner.device_shell",
                         "android_runner.adb_services", "android_runner.virtual_device")


def test_virtual_device_layers():
    """Wire format and fake system at the bottom, then the shell, the services, the server + CLI."""
    assert set(VIRTUAL_DEVICE_LAYERS) <= FILES.keys()
    bad = [f"{n} -> {d}" for i, n in enumerate(VIRTUAL_DEVICE_LAYERS) for d in sorted(_graph()[n])
           if _in(d, "android_runner") and d not in VIRTUAL_DEVICE_LAYERS[:i]]
    assert bad == []


def test_no_import_cycles():
    """No cycle among modules (function-level imports included)."""
    index, low, stack, on_stack, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):   # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(_graph()[v]):
            if _is_package_of(w, v):
                continue   # a module importing its own package's __init__ is how packages load
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(_graph()):
        if v not in index:
            visit(v)
    assert cycles == []


def _is_package_of(package: str, module: str) -> bool:
    return FILES[package].name == "__init__.py" and module.startswith(package + ".")


def test_no_import_guards_around_xfc_modules():
    """No `try: from . import x / except ImportError` around xfc's own modules."""
    bad = []
    for name, tree in _trees().items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Try):
                continue
            catches = {getattr(h.type, "id", None) for h in node.handlers}
            if not catches & {"ImportError", "ModuleNotFoundError"}:
                continue
            for inner in node.body:
                if isinstance(inner, ast.ImportFrom) and (inner.level or (inner.module or "").startswith("xfc")):
                    bad.append(f"{name}:{inner.lineno}")
    assert bad == []


def _environ_reads(tree) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") \
                and isinstance(node.value, ast.Name) and node.value.id == "os":
            lines.append(node.lineno)
    return lines


def _prints(tree) -> list[int]:
    return [n.lineno for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print"]


def test_only_cli_and_settings_read_the_environment():
    bad = [f"{n}:{line}" for n, tree in _trees().items() if _in(n, "xfc")
           and not _in(n, "xfc.cli", "xfc.settings") and n not in ENVIRON_EXCEPTIONS
           for line in _environ_reads(tree)]
    assert bad == []


def test_only_cli_prints():
    bad = [f"{n}:{line}" for n, tree in _trees().items() if _in(n, "xfc")
           and not _in(n, "xfc.cli") and n not in PRINT_EXCEPTIONS for line in _prints(tree)]
    assert bad == []
