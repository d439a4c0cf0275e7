"""Child processes that never outlive xfc.

`run` is subprocess.run with a timeout that always applies, and one difference that matters on
Ctrl-C, SIGTERM or a timeout: the child starts in its own process group and the whole group is
stopped, not only the direct child. gcc forks cc1, as and ld, and a harness may fork too;
killing only the driver would leave those running (and gcc's temporary files behind).
The group first gets SIGTERM (gcc then deletes its temporary files), then SIGKILL after a short
grace period. Only processes xfc started are ever signalled.

`stop_session` does the same for a child started in its own session (start_new_session=True)
whose descendants may leave its process group (Ray's daemons make groups of their own): every
process of that session is found in /proc by its session id, which no process outside the
child's descendants can carry, and stopped.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Mapping, Optional, Sequence

GRACE_S = 2.0


def _leader_exited(pid: int) -> bool:
    """True once the group leader has exited; it is not reaped, so its pid (the group id) stays ours."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def stop_group(proc: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    """SIGTERM the child's process group, wait up to grace_s for the child, then SIGKILL the group."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    deadline = time.monotonic() + grace_s
    while not _leader_exited(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    try:  # the leader is not reaped yet, so the group id cannot have been reused
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def run(argv: Sequence[str], *, timeout: float, cwd=None, env_extra: Optional[Mapping[str, str]] = None,
        text: bool = True) -> subprocess.CompletedProcess:
    """Run argv (a list, never a shell string) with stdout/stderr captured and stdin closed.
    The child inherits xfc's environment, plus env_extra (the one place xfc reads os.environ
    outside its settings: to hand it on).

    Raises subprocess.TimeoutExpired after stopping the process group on timeout; on any other
    exception (KeyboardInterrupt from Ctrl-C or xfc's SIGTERM handler) stops the group and re-raises.
    """
    proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=cwd, env={**os.environ, **env_extra} if env_extra else None, text=text,
                            start_new_session=True)
    try:
        with proc:
            try:
                out, err = proc.communicate(timeout=timeout)
            except BaseException:
                stop_group(proc)
                raise
    finally:
        if proc.returncode is None:   # never leave a zombie or a running child
            stop_group(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def session_pids(sid: int) -> list[int]:
    """Live (not zombie) processes whose session id is sid, read from /proc."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:      # state, ppid, pgrp, session
            out.append(int(entry.name))
    return out


def _signal_all(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def stop_session(proc: subprocess.Popen, grace_s: float, kill_grace_s: float = GRACE_S) -> None:
    """Stop a child started with start_new_session=True and every process of its session.

    The child (the session leader) gets SIGTERM and up to grace_s to stop its own processes; then
    whatever is left of the session gets SIGTERM, and SIGKILL after kill_grace_s. The leader is
    reaped only at the end: until then its pid, the session id, cannot be reused."""
    if not _leader_exited(proc.pid):
        try:
            os.kill(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + grace_s
        while not _leader_exited(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    for sig, wait_s in ((signal.SIGTERM, kill_grace_s), (signal.SIGKILL, 10.0)):
        left = session_pids(proc.pid)
        if not left:
            break
        _signal_all(left, sig)
        deadline = time.monotonic() + wait_s
        while session_pids(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    proc.wait()
