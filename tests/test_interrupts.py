"""Ctrl-C (SIGINT) and SIGTERM while `xfc synth --verify` or `xfc bench --device qemu` has a child
process running.

Each case starts the real console script in its own session, waits until a named child process
(the compiler, qemu-aarch64, the OpenCL harness) is running under it, sends the signal, and then
checks: exit status 130 / 143 with one line and no traceback; no output directory (and none of
the default xfc-out/ parents); nothing left in the working directory, in the run's private
TMPDIR (gcc's and xfc's temporary files land there) or in the OpenCL harness cache; and no
process left that xfc started (every descendant seen while it ran, and anything still in a
process group or session they led).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

XFC = shutil.which("xfc", path=str(Path(sys.executable).parent)) or "xfc"


def _stat(pid: int):
    """(ppid, pgid, sid, comm, starttime, state) of a process, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    comm = raw[raw.index("(") + 1:raw.rindex(")")]
    rest = raw[raw.rindex(")") + 2:].split()
    return int(rest[1]), int(rest[2]), int(rest[3]), comm, int(rest[19]), rest[0]


def _all_processes() -> dict:
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                table[int(entry)] = st
    return table


def _descendants(root: int, table: dict) -> dict:
    found, frontier = {}, {root}
    while frontier:
        frontier = {pid for pid, st in table.items() if st[0] in frontier and pid not in found}
        found.update({pid: table[pid] for pid in frontier})
    return found


def _survivors(xfc_pid: int, seen: dict) -> list:
    """Live processes that are a descendant we saw, or sit in a group/session xfc or one of them led."""
    leaders = {xfc_pid, *seen}
    out = []
    for pid, (ppid, pgid, sid, comm, start, state) in _all_processes().items():
        if state in ("Z", "X"):
            continue
        if (pid in seen and seen[pid][4] == start) or pgid in leaders or sid in leaders:
            out.append((pid, comm))
    return out


def _signal_defaults():
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_DFL)   # a test runner may ignore SIGINT; xfc must see it
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def interrupt_run(argv, *, cwd: Path, env: dict, sig: int, wait_for: set[str], timeout_s: float = 240.0):
    """Run xfc, send `sig` once a child whose name is in wait_for runs; returns (proc, stderr, seen)."""
    proc = subprocess.Popen([XFC, *argv], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_signal_defaults)
    seen, deadline, hit = {}, time.monotonic() + timeout_s, None
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            desc = _descendants(proc.pid, _all_processes())
            seen.update(desc)
            # a running child: one already exited (a zombie not yet reaped) can mean xfc is past its
            # last step, and a signal then may land after its work is done (seen once: exit 0)
            hit = next((st[3] for st in desc.values() if st[3] in wait_for and st[5] not in ("Z", "X")), None)
            if hit:
                break
            time.sleep(0.005)
        assert hit, f"xfc finished (or timed out) before any of {sorted(wait_for)} ran: {proc.poll()}"
        os.kill(proc.pid, sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc, err, seen


CASES = {
    # name: (argv, output dir (None: the default xfc-out/..., or none for bench), children to wait for)
    "host": (["synth", "matmul", "--hw", "host", "--shape", "m=33,n=47,k=29", "--bias", "--verify"], None,
             {"cc1", "as", "ld", "collect2"}),
    "qemu": (["synth", "matmul", "--hw", "cortex-a76", "--shape", "m=256,n=256,k=256", "--verify", "-o", "out"],
             "out", {"qemu-aarch64"}),
    # --repeat 12: the signal, sent once a qemu child runs, must find work left; with 3 runs a loaded
    # fresh-clone run sent it as the last one ended and xfc, done, exited 0
    "bench-qemu": (["bench", "matmul", "--hw", "cortex-a76", "--shape", "m=256,n=256,k=256", "--device", "qemu",
                    "--repeat", "12"], None, {"qemu-aarch64"}),
    "gpu-build": (["synth", "conv2d", "--hw", "mali-g78", "--target", "gpu", "--shape", "c=3,h=9,w=9,k=5,r=3,s=3",
                   "--verify", "-o", "out"], "out", {"cc1", "as", "ld", "collect2"}),
    "gpu-run": (["synth", "matmul", "--hw", "adreno-650", "--target", "gpu", "--shape", "m=37,n=41,k=19",
                 "--verify", "-o", "out"], "out", {"harness"}),
}
MARKS = {"host": pytest.mark.host, "qemu": pytest.mark.emulated, "bench-qemu": pytest.mark.emulated, "gpu-build": pytest.mark.opencl,
         "gpu-run": pytest.mark.opencl}
TOOLS = {"host": ("gcc",), "qemu": ("aarch64-linux-gnu-gcc", "qemu-aarch64"),
         "bench-qemu": ("aarch64-linux-gnu-gcc", "qemu-aarch64"), "gpu-build": ("gcc",),
         "gpu-run": ("gcc",)}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("case", [pytest.param(c, marks=MARKS[c]) for c in CASES])
def test_interrupt_leaves_nothing_behind(case, sig, tmp_path):
    for tool in TOOLS[case]:
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed")
    argv, out_name, wait_for = CASES[case]
    work, tmp, cache, pocl = (tmp_path / n for n in ("work", "tmp", "cache", "pocl"))
    for d in (work, tmp, cache, pocl):
        d.mkdir()
    if case == "gpu-run":   # the harness comes from the cache, so the run is the first child
        prime = subprocess.run([XFC, *argv[:-1], str(tmp_path / "prime")], cwd=work, capture_output=True,
                               text=True, timeout=300,
                               env={**os.environ, "XFC_CACHE_DIR": str(cache), "POCL_CACHE_DIR": str(pocl)})
        if prime.returncode == 3:
            pytest.skip(prime.stderr.strip())
        assert prime.returncode == 0, prime.stderr
        shutil.rmtree(tmp_path / "prime")
    cache_before = sorted(p.relative_to(cache) for p in cache.rglob("*"))
    env = {k: v for k, v in os.environ.items() if k != "XFC_DEBUG"}
    env.update(TMPDIR=str(tmp), XFC_CACHE_DIR=str(cache), POCL_CACHE_DIR=str(pocl / "run"))

    proc, err, seen = interrupt_run(argv, cwd=work, env=env, sig=sig, wait_for=wait_for)

    assert proc.returncode == 128 + sig, (proc.returncode, err)
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == ("xfc: interrupted" if sig == signal.SIGINT else "xfc: terminated")
    # No process xfc started survives (allow a moment for SIGKILLed grandchildren to be reaped).
    deadline = time.monotonic() + 5
    while _survivors(proc.pid, seen) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _survivors(proc.pid, seen)
    # No output, no staging directory, no default xfc-out/ parents, no temporary files.
    assert out_name is None or not (work / out_name).exists()
    assert sorted(os.listdir(work)) == [], os.listdir(work)
    assert sorted(os.listdir(tmp)) == [], os.listdir(tmp)
    assert not [p for p in cache.rglob("*") if p.name.startswith(".")], list(cache.rglob("*"))
    if case == "gpu-run":
        assert sorted(p.relative_to(cache) for p in cache.rglob("*")) == cache_before


@pytest.mark.host
def test_interrupt_keeps_the_previous_output(tmp_path):
    """An interrupted run into an xfc-owned directory leaves the earlier output as it was."""
    out = tmp_path / "out"
    first = subprocess.run([XFC, "synth", "matmul", "--hw", "host", "--shape", "m=5,n=7,k=3", "-o", str(out)],
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc, err, _ = interrupt_run(["synth", "matmul", "--hw", "host", "--shape", "m=9,n=7,k=3", "-o", str(out)],
                                 cwd=tmp_path, env=env, sig=signal.SIGTERM, wait_for={"cc1", "as", "ld", "collect2"})
    assert proc.returncode == 143, err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(os.listdir(tmp_path)) == ["out", "tmp"] and os.listdir(tmp) == []
