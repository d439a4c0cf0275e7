"""Output ownership (xfc/outputs.py): xfc writes only where it may and never half-writes.

Unit tests drive OutputDir and the single-file writers directly; the host tests run the real
`xfc synth` for the three reported cases (a foreign directory, an existing file, `-o .`) and the
rest of the rule (an xfc-owned directory replaced whole, --force keeping foreign files, a failed
build leaving the earlier output and no staging directory).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from xfc import outputs
from xfc.errors import XfcError
from xfc.outputs import MARKER_NAME, OutputDir, OutputError, claim_file, json_is_ours, read_marker, \
    write_json_result

XFC = shutil.which("xfc", path=str(Path(sys.executable).parent)) or "xfc"
REPO = Path(__file__).resolve().parents[1]


def snapshot(directory: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def stage(dest, files: dict, **kw) -> OutputDir:
    """Write `files` through an OutputDir and commit."""
    with OutputDir(dest, what="test", **kw) as out:
        for name, data in files.items():
            (out.path / name).write_text(data)
        out.commit()
    return out


def hidden(directory: Path) -> list:
    return [p.name for p in directory.iterdir() if p.name.startswith(".") and p.name != MARKER_NAME]


# ---------------------------------------------------------------------------------------------
# OutputDir
# ---------------------------------------------------------------------------------------------

@pytest.mark.unit
def test_new_directory_gets_files_and_marker(tmp_path):
    dest = tmp_path / "a" / "b" / "out"
    out = stage(dest, {"k.c": "kernel", "report.json": "{}"})
    assert out.committed and snapshot(dest).keys() == {MARKER_NAME, "k.c", "report.json"}
    marker = json.loads((dest / MARKER_NAME).read_text())
    assert marker["tool"] == "xfc" and marker["files"] == ["k.c", "report.json"] and marker["what"] == "test"
    assert hidden(dest.parent) == []
    mask = os.umask(0)
    os.umask(mask)
    assert (dest.stat().st_mode & 0o777) == (0o777 & ~mask)   # not mkdtemp's 0700


@pytest.mark.unit
def test_failure_discards_staging_and_created_parents(tmp_path):
    dest = tmp_path / "a" / "b" / "out"
    for exc in (RuntimeError("build failed"), KeyboardInterrupt()):
        with pytest.raises(type(exc)):
            with OutputDir(dest, what="test") as out:
                (out.path / "k.c").write_text("half")
                assert out.path.parent == dest.parent and out.path.name.startswith(".out.xfc-staging-")
                raise exc
        assert os.listdir(tmp_path) == []   # a/ and a/b/ were created by the run: removed too


@pytest.mark.unit
def test_existing_file_is_refused_and_untouched(tmp_path):
    target = tmp_path / "passwd"
    target.write_text("root:x:0:0\n")
    inode = target.stat().st_ino
    for force in (False, True):
        with pytest.raises(OutputError, match=r"-o .*passwd: a file is already there; xfc never replaces") as info:
            OutputDir(target, what="test", force=force)
        assert info.value.exit_code == 2 and "\n" not in str(info.value)
    assert target.read_text() == "root:x:0:0\n" and target.stat().st_ino == inode
    assert os.listdir(tmp_path) == ["passwd"]
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "missing")
    with pytest.raises(OutputError, match="a symbolic link to a missing path"):
        OutputDir(link, what="test")
    assert not (tmp_path / "missing").exists()


@pytest.mark.unit
def test_foreign_directory_is_refused_without_force(tmp_path):
    dest = tmp_path / "mine"
    dest.mkdir()
    for i in range(5):
        (dest / f"photo{i}.jpg").write_text(str(i))
    before = snapshot(dest)
    with pytest.raises(OutputError) as info:
        OutputDir(dest, what="test")
    msg = str(info.value)
    assert "holds 5 entries xfc did not write ('photo0.jpg', 'photo1.jpg', 'photo2.jpg' and 2 more)" in msg
    assert "choose another -o" in msg and "--force" in msg and info.value.exit_code == 2
    assert snapshot(dest) == before and os.listdir(tmp_path) == ["mine"]
    # A marker that is not xfc's JSON does not make the directory xfc's.
    (dest / MARKER_NAME).write_text("not json")
    with pytest.raises(OutputError, match="xfc did not write"):
        OutputDir(dest, what="test")


@pytest.mark.unit
def test_empty_directory_is_used(tmp_path):
    dest = tmp_path / "empty"
    dest.mkdir()
    stage(dest, {"k.c": "x"})
    assert snapshot(dest).keys() == {MARKER_NAME, "k.c"}


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2-exchange", "two-renames"])
@pytest.mark.unit
def test_owned_directory_is_replaced_whole(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(outputs, "_renameat2", lambda src, dst, flags: False)
    dest = tmp_path / "out"
    stage(dest, {"old.so": "old", "report.json": "1"})
    stage(dest, {"new.so": "new", "report.json": "2"})
    assert snapshot(dest) == {MARKER_NAME: (dest / MARKER_NAME).read_bytes(), "new.so": b"new", "report.json": b"2"}
    assert read_marker(dest).files == ("new.so", "report.json")
    assert os.listdir(tmp_path) == ["out"]   # no staging or old directory left


@pytest.mark.unit
def test_owned_directory_with_a_foreign_file(tmp_path):
    dest = tmp_path / "out"
    stage(dest, {"old.so": "old", "report.json": "1"})
    (dest / "notes.txt").write_text("my notes")
    with pytest.raises(OutputError, match=r"holds xfc output and 1 entry xfc did not write \('notes.txt'\)"):
        OutputDir(dest, what="test")
    # --force: xfc's files are replaced, its stale ones removed, the foreign one kept.
    stage(dest, {"new.so": "new", "report.json": "2"}, force=True)
    assert snapshot(dest).keys() == {MARKER_NAME, "new.so", "report.json", "notes.txt"}
    assert (dest / "notes.txt").read_text() == "my notes" and (dest / "report.json").read_text() == "2"
    assert read_marker(dest).files == ("new.so", "report.json") and hidden(dest) == []


@pytest.mark.unit
def test_force_writes_beside_foreign_files_and_never_replaces_one(tmp_path):
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "keep.txt").write_text("keep")
    stage(dest, {"k.c": "x"}, force=True)
    assert (dest / "keep.txt").read_text() == "keep" and (dest / "k.c").read_text() == "x"
    (dest / "report.json").write_text("the user's")
    with pytest.raises(OutputError, match="'report.json' is already there and was not written by xfc"):
        stage(dest, {"k.c": "y", "report.json": "{}"}, force=True)
    assert (dest / "report.json").read_text() == "the user's" and (dest / "k.c").read_text() == "x"
    assert hidden(dest) == [] and os.listdir(tmp_path) == ["mine"]
    # A foreign file named like the marker is not replaced either.
    other = tmp_path / "other"
    other.mkdir()
    (other / MARKER_NAME).write_text("user data")
    with pytest.raises(OutputError, match="is not xfc's marker"):
        stage(other, {"k.c": "x"}, force=True)
    assert (other / MARKER_NAME).read_text() == "user data" and os.listdir(other) == [MARKER_NAME]


@pytest.mark.unit
def test_current_directory_and_parents(tmp_path, monkeypatch):
    cwd = tmp_path / "work"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    stage(Path("."), {"k.c": "1", "old.so": "1"})            # empty cwd: filled in place
    stage(Path("."), {"k.c": "2", "new.so": "2"})            # xfc's own cwd: replaced file by file
    assert Path.cwd() == cwd and snapshot(cwd).keys() == {MARKER_NAME, "k.c", "new.so"}
    assert (cwd / "k.c").read_text() == "2" and hidden(cwd) == []
    for dest in ("..", str(tmp_path), "/"):                   # parents hold foreign entries: refused
        with pytest.raises(OutputError, match="xfc did not write"):
            OutputDir(Path(dest), what="test")
    (cwd / "mine.txt").write_text("m")
    with pytest.raises(OutputError, match="holds xfc output and 1 entry"):
        OutputDir(Path("."), what="test")
    assert sorted(os.listdir(tmp_path)) == ["work"]


@pytest.mark.unit
def test_a_bind_mount_is_a_mount_point_and_filled_in_place(tmp_path, monkeypatch):
    """A directory the kernel's mount table lists (a bind mount of the same file system, which
    os.path.ismount misses) is filled in place: a staged directory renamed onto it failed with
    EBUSY after all the work. Mount points are read as mountinfo escapes them (a space as \\040)."""
    dest = tmp_path / "mounted here"
    dest.mkdir()
    table = tmp_path / "mountinfo"
    escaped = str(dest).replace(" ", "\\040")
    table.write_text(f"22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
                     f"99 22 8:1 {escaped} {escaped} rw,relatime shared:1 - ext4 /dev/vda rw\n")
    assert not os.path.ismount(dest)
    assert outputs.is_mount_point(dest, table) and not outputs.is_mount_point(tmp_path, table)
    monkeypatch.setattr(outputs, "MOUNTINFO", table)
    with OutputDir(dest, what="test") as out:
        assert out.in_place and out.path.parent == dest
        (out.path / "k.c").write_text("1")
        out.commit()
    assert snapshot(dest).keys() == {MARKER_NAME, "k.c"} and hidden(dest) == []


@pytest.mark.subprocess
def test_a_read_only_bind_mount_is_refused_before_any_work(tmp_path):
    """A real read-only bind mount as the destination: refused when the output directory is set up
    (before synthesis and build), naming the file system's refusal. Needs root (mount --bind)."""
    source, dest = tmp_path / "source", tmp_path / "dest"
    source.mkdir()
    dest.mkdir()
    mounted = subprocess.run(["mount", "--bind", str(source), str(dest)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {mounted.stderr.decode().strip()}")
    try:
        remounted = subprocess.run(["mount", "-o", "remount,bind,ro", str(dest)], capture_output=True)
        if remounted.returncode != 0:
            pytest.skip(f"cannot remount read-only here: {remounted.stderr.decode().strip()}")
        with pytest.raises(OutputError, match=r"cannot create a staging directory in .*dest: Read-only file system"):
            OutputDir(dest, what="test")
    finally:
        subprocess.run(["umount", str(dest)], capture_output=True)
    assert os.listdir(source) == []


@pytest.mark.unit
def test_interrupt_inside_staging_keeps_the_previous_output(tmp_path):
    dest = tmp_path / "out"
    stage(dest, {"k.c": "old"})
    before = snapshot(dest)
    with pytest.raises(KeyboardInterrupt):
        with OutputDir(dest, what="test") as out:
            (out.path / "k.c").write_text("new, half written")
            raise KeyboardInterrupt
    assert snapshot(dest) == before and os.listdir(tmp_path) == ["out"]


@pytest.mark.unit
def test_destination_that_appears_meanwhile_is_checked_at_commit(tmp_path):
    dest = tmp_path / "out"
    with pytest.raises(OutputError, match="xfc did not write"):
        with OutputDir(dest, what="test") as out:
            (out.path / "k.c").write_text("x")
            dest.mkdir()
            (dest / "theirs.txt").write_text("t")
            out.commit()
    assert os.listdir(dest) == ["theirs.txt"] and os.listdir(tmp_path) == ["out"]


# ---------------------------------------------------------------------------------------------
# Single files
# ---------------------------------------------------------------------------------------------

@pytest.mark.unit
def test_json_result_files(tmp_path):
    path = tmp_path / "results" / "r.json"
    written = write_json_result(path, {"gflops": 1.5}, kind="test")
    data = json.loads(path.read_text())
    assert data == written and data["xfc_output"]["tool"] == "xfc" and data["gflops"] == 1.5
    write_json_result(path, {"gflops": 2.5}, kind="test")               # xfc's own: replaced
    assert json.loads(path.read_text())["gflops"] == 2.5
    for foreign in ('{"gflops": 9}', "[1, 2]", "not json", ""):
        path.write_text(foreign)
        with pytest.raises(OutputError, match="was not written by xfc"):
            write_json_result(path, {"gflops": 3}, kind="test")
        assert path.read_text() == foreign
    with pytest.raises(OutputError, match="a directory is already there"):
        write_json_result(tmp_path / "results", {}, kind="test")
    assert os.listdir(tmp_path / "results") == ["r.json"]              # no temporary file left


@pytest.mark.unit
def test_legacy_result_file_and_claim(tmp_path):
    legacy = tmp_path / "old.json"
    legacy.write_text(json.dumps({"machine": {}, "workloads": {}, "geomean_ratio_1t_matmul_conv": 1.0}))
    is_ours = json_is_ours(("geomean_ratio_1t_matmul_conv", "workloads", "machine"))
    claim_file(legacy, is_ours)
    with pytest.raises(OutputError):
        claim_file(legacy, json_is_ours())
    # the committed benchmark results are recognised, so the benchmark may refresh them
    assert is_ours(REPO / "benchmarks" / "results" / "cpu_host.json")
    claim_file(tmp_path / "absent.db", lambda p: False)


@pytest.mark.subprocess
def test_bench_cpu_refuses_a_foreign_out_before_measuring(tmp_path):
    target = tmp_path / "mine.json"
    target.write_text('{"mine": true}\n')
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_cpu.py"), "--out", str(target),
                           "--only", "mm_512", "--no-peers", "--rounds", "1"], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 2, proc.stderr
    assert "was not written by xfc" in proc.stderr and "measuring" not in proc.stderr
    assert target.read_text() == '{"mine": true}\n'


# ---------------------------------------------------------------------------------------------
# The real `xfc synth`
# ---------------------------------------------------------------------------------------------

def xfc(*args, cwd=None, env=None):
    base = {k: v for k, v in os.environ.items() if k != "XFC_DEBUG"}
    return subprocess.run([XFC, *args], capture_output=True, text=True, timeout=300, cwd=cwd,
                          env={**base, **(env or {})})


SYNTH = ("synth", "matmul", "--hw", "host", "--shape", "m=4,n=4,k=4")


def one_error_line(proc, code: int) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("xfc: error")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.host
def test_cli_foreign_directory_is_refused(tmp_path):
    dest = tmp_path / "d"
    dest.mkdir()
    (dest / "thesis.tex").write_text("years of work")
    (dest / "data.csv").write_text("1,2,3")
    before = snapshot(dest)
    line = one_error_line(xfc(*SYNTH, "-o", str(dest)), 2)
    assert "holds 2 entries xfc did not write ('data.csv', 'thesis.tex')" in line and "--force" in line
    assert snapshot(dest) == before and os.listdir(tmp_path) == ["d"]


@pytest.mark.host
def test_cli_existing_file_is_refused(tmp_path):
    target = tmp_path / "hosts"
    target.write_text("127.0.0.1 localhost\n")
    inode = target.stat().st_ino
    for extra in ((), ("--force",)):
        line = one_error_line(xfc(*SYNTH, "-o", str(target), *extra), 2)
        assert "a file is already there" in line
    assert target.is_file() and target.read_text() == "127.0.0.1 localhost\n" and target.stat().st_ino == inode
    assert os.listdir(tmp_path) == ["hosts"]


@pytest.mark.host
def test_cli_dot_works_or_is_refused_cleanly(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    proc = xfc(*SYNTH, "--verify", "-o", ".", cwd=work)             # empty cwd: filled in place
    assert proc.returncode == 0, proc.stderr
    names = set(os.listdir(work))
    assert {MARKER_NAME, "report.json", "build.sh"} <= names and not hidden(work)
    assert json.loads((work / "report.json").read_text())["verified"] is True
    proc = xfc(*SYNTH, "-o", ".", cwd=work)                          # xfc's own cwd: again fine
    assert proc.returncode == 0, proc.stderr
    (work / "mine.txt").write_text("m")
    assert "holds xfc output and 1 entry" in one_error_line(xfc(*SYNTH, "-o", ".", cwd=work), 2)
    assert "xfc did not write ('work')" in one_error_line(xfc(*SYNTH, "-o", "..", cwd=work), 2)
    assert (work / "mine.txt").read_text() == "m" and os.listdir(tmp_path) == ["work"]


@pytest.mark.host
def test_cli_owned_directory_replaced_and_force_keeps_foreign_files(tmp_path):
    dest = tmp_path / "out"
    assert xfc(*SYNTH, "-o", str(dest)).returncode == 0
    old_libs = {p.name for p in dest.glob("*.so")}
    proc = xfc("synth", "matmul", "--hw", "host", "--shape", "m=6,n=5,k=3", "--verify", "-o", str(dest))
    assert proc.returncode == 0, proc.stderr
    new_libs = {p.name for p in dest.glob("*.so")}
    assert len(new_libs) == 1 and not new_libs & old_libs              # old output gone, new complete
    assert "N=5" in json.loads((dest / "report.json").read_text())["shape"]
    assert set(read_marker(dest).files) == set(os.listdir(dest)) - {MARKER_NAME}
    (dest / "notes.txt").write_text("mine")
    one_error_line(xfc(*SYNTH, "-o", str(dest)), 2)
    proc = xfc(*SYNTH, "--force", "-o", str(dest))
    assert proc.returncode == 0, proc.stderr
    assert (dest / "notes.txt").read_text() == "mine"
    assert "N=4" in json.loads((dest / "report.json").read_text())["shape"]
    assert os.listdir(tmp_path) == ["out"]


@pytest.mark.host
def test_cli_failed_build_keeps_previous_output_and_no_staging(tmp_path):
    dest = tmp_path / "out"
    assert xfc(*SYNTH, "-o", str(dest)).returncode == 0
    before = snapshot(dest)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    broken = bin_dir / "gcc"                 # a compiler that fails, first on PATH
    broken.write_text("#!/bin/sh\necho 'error: no space left on device' >&2\nexit 1\n")
    broken.chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    line = one_error_line(xfc("synth", "matmul", "--hw", "host", "--shape", "m=8,n=8,k=8", "-o", str(dest),
                              env=env), 3)
    assert "host compile" in line and "no space left" in line
    assert snapshot(dest) == before and sorted(os.listdir(tmp_path)) == ["bin", "out"]
    # the default location: nothing is created at all
    work = tmp_path / "work"
    work.mkdir()
    one_error_line(xfc(*SYNTH, cwd=work, env=env), 3)
    assert os.listdir(work) == []


@pytest.mark.host
def test_synth_help_states_the_rule():
    out = xfc("synth", "--help").stdout
    flat = " ".join(out.split())
    assert "--force" in flat and ".xfc-output" in flat and "never deletes or replaces a file xfc did not write" in flat
    assert "130 interrupted" in flat and "143 terminated" in flat


@pytest.mark.opencl
def test_gpu_outputs_are_staged(tmp_path, monkeypatch):
    """The GPU path stages like the CPU path: a failure leaves the earlier output as it was."""
    from xfc.pipeline import run_gpu_synth
    from xfc.hardware.load import load
    from xfc.ops.spec import make_spec
    from xfc.errors import ToolchainError

    hw = load("mali-g78")
    dest = tmp_path / "g"
    spec = make_spec("matmul", dict(m=9, n=7, k=5))
    try:
        report = run_gpu_synth(spec, hw, dest, verify=True).to_dict()
    except ToolchainError as exc:
        pytest.skip(str(exc))
    assert report["verified"] is True and Path(report["files"]["fp32"]).parent == dest
    assert set(read_marker(dest).files) == set(os.listdir(dest)) - {MARKER_NAME}
    before = snapshot(dest)
    with pytest.raises(XfcError, match="xfc did not write"):
        run_gpu_synth(spec, hw, tmp_path, verify=False)       # tmp_path holds g/: foreign to xfc
    import xfc.toolchain.opencl as gpu_build
    monkeypatch.setenv("XFC_CACHE_DIR", str(tmp_path / "nocache"))
    monkeypatch.setenv("PATH", str(tmp_path / "nobin"))           # no gcc: the harness cannot be built
    monkeypatch.setattr(gpu_build, "_harness_cache", {})
    with pytest.raises(ToolchainError, match="gcc not found"):
        run_gpu_synth(make_spec("matmul", dict(m=3, n=3, k=3)), hw, dest, verify=True)
    assert snapshot(dest) == before and sorted(os.listdir(tmp_path)) == ["g"]


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.unit
@pytest.mark.parametrize("mask, file_mode, exec_mode", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)])
def test_atomic_writer_honours_the_umask(tmp_path, mask, file_mode, exec_mode):
    """Issue 35 item 2: the one atomic writer gives files the mode a new file gets under the umask
    (mkstemp alone made every deliverable 0600, unreadable to another user's build)."""
    old = os.umask(mask)
    try:
        plain = outputs.write_atomic(tmp_path / "a" / "x.h", "int x;\n")
        script = outputs.write_atomic(tmp_path / "build.sh", "#!/bin/sh\n", executable=True)
        owned = outputs.write_json_result(tmp_path / "r.json", {"a": 1}, kind="test")
    finally:
        os.umask(old)
    assert owned["a"] == 1
    assert (plain.stat().st_mode & 0o777, script.stat().st_mode & 0o777) == (file_mode, exec_mode)
    assert (tmp_path / "r.json").stat().st_mode & 0o777 == file_mode
    assert not hidden(tmp_path) and not hidden(tmp_path / "a")


def _modes(directory: Path) -> dict:
    return {str(p.relative_to(directory)): p.stat().st_mode & 0o777 for p in directory.rglob("*") if p.is_file()}


@pytest.mark.host
def test_synth_and_emitted_library_are_readable_by_other_users(tmp_path, capsys, umask_022):
    """Issue 35 item 2: under umask 022 every file xfc synth and xfc model --emit lib write is 0644
    (scripts 0755), so an app's build running as another user can read the header, CMakeLists.txt,
    manifest, weights and sources."""
    import onnx
    from support import nets
    from xfc.cli import main
    synth_dir, lib_dir = tmp_path / "k", tmp_path / "lib"
    assert main(["synth", "matmul", "--hw", "host", "--shape", "m=5,n=6,k=7", "--json", "-o", str(synth_dir)]) == 0
    model = tmp_path / "net.onnx"
    onnx.save(nets.mobilenet_net(blocks=1), str(model))
    assert main(["model", str(model), "--hw", "host", "--emit", "lib", "--json", "-o", str(lib_dir)]) == 0
    capsys.readouterr()
    for directory in (synth_dir, lib_dir):
        modes = _modes(directory)
        assert modes, directory
        wrong = {name: oct(mode) for name, mode in modes.items()   # programs (build.sh, .so) 0755
                 if mode != (0o755 if name.endswith((".sh", ".so")) else 0o644)}
        assert not wrong, wrong
    assert any(name.endswith(".h") for name in _modes(lib_dir)) and "manifest.json" in _modes(lib_dir)
