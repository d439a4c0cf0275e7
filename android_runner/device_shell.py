"""The virtual device's shell: a POSIX-style tokenizer and `ShellSession`, which runs one
`shell:` command line (`;`, `&&`, `||`, `$?`, the builtins listed in virtual_device.py) against a
FakeSystem and runs pushed aarch64 ELF files under qemu-aarch64 with the SoC's weakest allowed
core as the -cpu model."""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
import threading
from typing import Callable

from android_runner.device_system import (SANDBOX_ROOT, FakeProcess, FakeSystem, PathError, device_norm,
                                          host_path, in_sandbox, list_dir, path_kind, read_file)

_OPERATORS = (";", "&&", "||", "|", ">", "<", "&", ">>")


class _Op(str):
    """An unquoted shell operator token."""


STATUS_MARK = "\x00?\x00"   # stands for `$?` until the command runs


def tokenize(line: str) -> list[str]:
    """Split a POSIX-style command line. Unquoted operators come back as `_Op` tokens;
    `$?` (outside single quotes) comes back as STATUS_MARK, replaced when the command runs."""
    tokens: list[str] = []
    cur: list[str] = []
    have = False
    i, n = 0, len(line)

    def flush() -> None:
        nonlocal cur, have
        if have:
            tokens.append("".join(cur))
        cur, have = [], False

    while i < n:
        ch = line[i]
        if ch in " \t\n":
            flush()
            i += 1
        elif ch == "'":
            j = line.find("'", i + 1)
            if j < 0:
                raise ValueError("unterminated single quote")
            cur.append(line[i + 1:j])
            have = True
            i = j + 1
        elif ch == '"':
            i += 1
            have = True
            while True:
                if i >= n:
                    raise ValueError("unterminated double quote")
                c = line[i]
                if c == '"':
                    i += 1
                    break
                if c == "\\" and i + 1 < n and line[i + 1] in '"\\$`\n':
                    cur.append(line[i + 1])
                    i += 2
                elif c == "$" and line.startswith("$?", i):
                    cur.append(STATUS_MARK)
                    i += 2
                else:
                    cur.append(c)
                    i += 1
        elif ch == "\\":
            if i + 1 < n:
                cur.append(line[i + 1])
                have = True
            i += 2
        elif ch == "$" and line.startswith("$?", i):
            cur.append(STATUS_MARK)
            have = True
            i += 2
        elif ch in ";&|<>":
            flush()
            two = line[i:i + 2]
            op = two if two in ("&&", "||", ">>") else ch
            tokens.append(_Op(op))
            i += len(op)
        elif ch == "#" and not have:
            break
        else:
            cur.append(ch)
            have = True
            i += 1
    flush()
    return tokens


class ShellSession:
    """Runs one `shell:` command line. out/err are callables taking bytes."""

    def __init__(self, system: FakeSystem, out: Callable[[bytes], None],
                 err: Callable[[bytes], None], on_run_start: Callable[[], None]):
        self.system = system
        self.out = out
        self.err = err
        self.on_run_start = on_run_start
        self.status = 0
        self.current: FakeProcess | None = None
        self.cancelled = threading.Event()
        self.affinity: set[int] | None = None     # CPUs allowed by an enclosing taskset

    # -- entry ----------------------------------------------------------------------------------
    def run_line(self, line: str) -> int:
        with self.system.lock:
            self.system.commands.append(line)
        # Split on top-level ; && || first, expanding $? lazily per command.
        try:
            probe = tokenize(line)
        except ValueError as exc:
            self.err(f"/system/bin/sh: syntax error: {exc}\n".encode())
            return 2
        if any(isinstance(t, _Op) and t in ("|", ">", "<", "&", ">>") for t in probe):
            self.err(b"/system/bin/sh: pipes, redirections and background jobs are not supported "
                     b"by the xfc virtual device\n")
            return 2
        segments: list[tuple[str, list[str]]] = []   # (operator before, tokens)
        op_before = ";"
        current: list[str] = []
        for tok in probe:
            if isinstance(tok, _Op):
                segments.append((op_before, current))
                op_before, current = str(tok), []
            else:
                current.append(tok)
        segments.append((op_before, current))
        status = 0
        for op, argv in segments:
            if self.cancelled.is_set():
                return 137
            if op == "&&" and status != 0:
                continue
            if op == "||" and status == 0:
                continue
            if not argv:
                continue
            argv = [a.replace(STATUS_MARK, str(status)).replace("\x00", "") for a in argv]
            status = self.run_argv(argv)
            self.status = status
        return status

    # -- commands -------------------------------------------------------------------------------
    def run_argv(self, argv: list[str], env: dict[str, str] | None = None) -> int:
        name, args = argv[0], argv[1:]
        builtin = getattr(self, "cmd_" + name.replace("-", "_"), None) if "/" not in name else None
        if builtin is not None:
            try:
                return builtin(args, env or {})
            except PathError as exc:
                self.err(f"{name}: {exc}\n".encode())
                return 1
        return self.exec_path(argv, env or {})

    def _write_lines(self, lines: list[str]) -> None:
        if lines:
            self.out(("\n".join(lines) + "\n").encode())

    def cmd_true(self, args, env):
        return 0

    def cmd_false(self, args, env):
        return 1

    def cmd_echo(self, args, env):
        newline = True
        if args and args[0] == "-n":
            newline, args = False, args[1:]
        self.out((" ".join(args) + ("\n" if newline else "")).encode())
        return 0

    def cmd_getprop(self, args, env):
        props = self.system.props
        if not args:
            self._write_lines([f"[{k}]: [{v}]" for k, v in sorted(props.items())])
        else:
            default = args[1] if len(args) > 1 else ""
            self.out((props.get(args[0], default) + "\n").encode())
        return 0

    def cmd_uname(self, args, env):
        self.out(b"aarch64\n" if "-m" in args else b"Linux\n")
        return 0

    def cmd_id(self, args, env):
        self.out(b"uid=2000(shell) gid=2000(shell) groups=2000(shell) context=u:r:shell:s0\n")
        return 0

    def cmd_whoami(self, args, env):
        self.out(b"shell\n")
        return 0

    def cmd_sleep(self, args, env):
        try:
            secs = float(args[0]) if args else 0.0
        except ValueError:
            self.err(b"sleep: invalid number\n")
            return 1
        self.cancelled.wait(secs)
        return 0

    def cmd_mkdir(self, args, env):
        parents = False
        status = 0
        for a in args:
            if a.startswith("-"):
                parents = parents or "p" in a
                continue
            p = device_norm(a)
            if not in_sandbox(p):
                if p in ("/data", "/data/local") and parents:
                    continue
                self.err(f"mkdir: '{a}': Permission denied\n".encode())
                status = 1
                continue
            hp = host_path(self.system, p)
            try:
                if parents:
                    hp.mkdir(parents=True, exist_ok=True)
                else:
                    hp.mkdir()
            except FileExistsError:
                self.err(f"mkdir: '{a}': File exists\n".encode())
                status = 1
            except OSError as exc:
                self.err(f"mkdir: '{a}': {exc.strerror}\n".encode())
                status = 1
        return status

    def cmd_rm(self, args, env):
        recursive = force = False
        status = 0
        for a in args:
            if a.startswith("-") and len(a) > 1:
                recursive = recursive or "r" in a.lower()
                force = force or "f" in a
                continue
            p = device_norm(a)
            if not in_sandbox(p) or p == SANDBOX_ROOT:
                self.err(f"rm: '{a}': Permission denied\n".encode())
                status = 1
                continue
            hp = host_path(self.system, p)
            if not hp.exists() and not hp.is_symlink():
                if not force:
                    self.err(f"rm: '{a}': No such file or directory\n".encode())
                    status = 1
                continue
            if hp.is_dir() and not hp.is_symlink():
                if not recursive:
                    self.err(f"rm: '{a}': Is a directory\n".encode())
                    status = 1
                    continue
                shutil.rmtree(hp, ignore_errors=True)
            else:
                hp.unlink()
        return status

    def cmd_chmod(self, args, env):
        if len(args) < 2:
            self.err(b"chmod: needs MODE FILE...\n")
            return 1
        mode_s, files = args[0], args[1:]
        if mode_s.startswith("-"):
            mode_s, files = files[0], files[1:]
        status = 0
        for a in files:
            hp = host_path(self.system, device_norm(a))
            if not hp.exists():
                self.err(f"chmod: '{a}': No such file or directory\n".encode())
                status = 1
                continue
            mode = hp.stat().st_mode & 0o7777
            try:
                if all(c in "01234567" for c in mode_s):
                    mode = int(mode_s, 8)
                else:
                    for clause in mode_s.split(","):
                        who = clause.rstrip("rwx+-=") or "a"
                        opi = max(clause.find("+"), clause.find("-"), clause.find("="))
                        perms = clause[opi + 1:]
                        bits = 0
                        for w in ("a" if who == "a" else who):
                            shift = {"u": [6], "g": [3], "o": [0], "a": [6, 3, 0]}[w]
                            for s in shift:
                                for p in perms:
                                    bits |= {"r": 4, "w": 2, "x": 1}[p] << s
                        op = clause[opi]
                        mode = mode | bits if op == "+" else (mode & ~bits if op == "-" else bits)
            except (KeyError, IndexError, ValueError):
                self.err(f"chmod: invalid mode '{mode_s}'\n".encode())
                return 1
            os.chmod(hp, mode)
        return status


    def cmd_cat(self, args, env):
        status = 0
        for a in args:
            try:
                self.out(read_file(self.system, device_norm(a)))
            except PathError as exc:
                self.err(f"cat: {a}: {os.strerror(exc.errno)}\n".encode())
                status = 1
        return status


    def cmd_ls(self, args, env):
        paths = [a for a in args if not a.startswith("-")] or ["/"]
        status = 0
        for a in paths:
            p = device_norm(a)
            kind = path_kind(self.system, p)
            if kind is None:
                self.err(f"ls: {a}: No such file or directory\n".encode())
                status = 1
            elif kind == "f":
                self.out((a + "\n").encode())
            else:
                names = list_dir(self.system, p) or []
                if len(paths) > 1:
                    self.out(f"{a}:\n".encode())
                self._write_lines(names)
        return status

    def cmd_test(self, args, env):
        if len(args) == 2 and args[0] in ("-e", "-f", "-d"):
            kind = path_kind(self.system, device_norm(args[1]))
            want = {"-e": ("f", "d"), "-f": ("f",), "-d": ("d",)}[args[0]]
            return 0 if kind in want else 1
        self.err(b"test: only -e/-f/-d PATH are supported\n")
        return 2

    def cmd_df(self, args, env):
        total = 110_000_000
        avail = 0 if self.system.faults.storage_full else 52_000_000
        used = total - avail
        pct = int(round(100 * used / total))
        self.out(b"Filesystem      1K-blocks     Used Available Use% Mounted on\n")
        self.out(f"/dev/block/dm-8 {total:10d} {used:8d} {avail:9d} {pct:3d}% /data\n".encode())
        return 0

    def cmd_env(self, args, env):
        new_env = dict(env)
        while args and "=" in args[0] and not args[0].startswith("="):
            k, v = args[0].split("=", 1)
            new_env[k] = v
            args = args[1:]
        if not args:
            self._write_lines([f"{k}={v}" for k, v in sorted(new_env.items())])
            return 0
        return self.run_argv(args, new_env)

    def cmd_taskset(self, args, env):
        if len(args) < 2 or args[0].startswith("-"):
            self.err(b"taskset: only 'taskset MASK COMMAND...' is supported\n")
            return 1
        mask_s, rest = args[0], args[1:]
        try:
            mask = int(mask_s, 16)
        except ValueError:
            self.err(f"taskset: bad mask '{mask_s}'\n".encode())
            return 1
        cpus = {c for c in self.system.cpu_core if mask >> c & 1}
        if not cpus:
            self.err(b"taskset: sched_setaffinity: Invalid argument\n")
            return 1
        with self.system.lock:
            self.system.taskset_log.append((mask_s, list(rest)))
        outer, self.affinity = self.affinity, cpus
        try:
            return self.run_argv(rest, env)
        finally:
            self.affinity = outer

    def cmd_timeout(self, args, env):
        sig = "TERM"
        while args and args[0].startswith("-"):
            if args[0] == "-s" and len(args) > 1:
                sig, args = args[1], args[2:]
            else:
                args = args[1:]
        if len(args) < 2:
            self.err(b"timeout: needs SECONDS COMMAND...\n")
            return 125
        try:
            secs = float(args[0].rstrip("s"))
        except ValueError:
            self.err(b"timeout: bad duration\n")
            return 125
        timer_fired = threading.Event()

        def fire() -> None:
            timer_fired.set()
            proc = self.current
            if proc is not None:
                proc.kill()
            self.cancelled.set()

        timer = threading.Timer(secs, fire)
        timer.daemon = True
        timer.start()
        try:
            status = self.run_argv(args[1:], env)
        finally:
            timer.cancel()
        if timer_fired.is_set():
            self.cancelled.clear()
            return 124
        return status

    def cmd_ps(self, args, env):
        with self.system.lock:
            procs = sorted(self.system.processes.values(), key=lambda p: p.pid)
        lines = ["  PID ARGS"] + [f"{p.pid:5d} {' '.join(p.argv)}" for p in procs]
        self._write_lines(lines)
        return 0

    def cmd_kill(self, args, env):
        status = 0
        for a in args:
            if a.startswith("-"):
                continue
            try:
                pid = int(a)
            except ValueError:
                self.err(f"kill: bad pid '{a}'\n".encode())
                status = 1
                continue
            with self.system.lock:
                proc = self.system.processes.get(pid)
            if proc is None:
                self.err(f"kill: {pid}: No such process\n".encode())
                status = 1
            else:
                proc.kill()
        return status

    def cmd_sh(self, args, env):
        if len(args) >= 2 and args[0] == "-c":
            return self.run_line(args[1])
        self.err(b"sh: only 'sh -c COMMAND' is supported\n")
        return 2

    # -- executing files ------------------------------------------------------------------------
    def exec_path(self, argv: list[str], env: dict[str, str]) -> int:
        name = argv[0]
        if "/" not in name:
            self.err(f"/system/bin/sh: {name}: inaccessible or not found\n".encode())
            return 127
        p = device_norm(name)
        if not in_sandbox(p):
            self.err(f"/system/bin/sh: {name}: inaccessible or not found\n".encode())
            return 127
        hp = host_path(self.system, p)
        if not hp.is_file():
            self.err(f"/system/bin/sh: {name}: inaccessible or not found\n".encode())
            return 127
        if not os.access(hp, os.X_OK):
            self.err(f"/system/bin/sh: {name}: can't execute: Permission denied\n".encode())
            return 126
        with open(hp, "rb") as f:
            head = f.read(20)
        if head[:4] != b"\x7fELF" or head[4] != 2 or struct.unpack("<H", head[18:20])[0] != 183:
            self.err(f"/system/bin/sh: {name}: not an aarch64 ELF executable "
                     "(the xfc virtual device runs only those)\n".encode())
            return 126
        args = []
        for a in argv[1:]:
            if a.startswith(SANDBOX_ROOT + "/") or a == SANDBOX_ROOT:
                args.append(str(host_path(self.system, device_norm(a))))
            else:
                args.append(a)
        proc = self.system.new_process(argv)
        self.current = proc
        try:
            self.on_run_start()
            if self.system.faults.hang:
                proc.killed.wait()
                self.err(b"Killed\n")
                return 137
            cmd = [self.system.qemu, "-cpu", self.system.qemu_cpu(self.affinity), str(hp), *args]
            child_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env}
            try:
                proc.popen = subprocess.Popen(cmd, cwd=str(hp.parent), env=child_env,
                                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE)
            except OSError as exc:
                self.err(f"xfc virtual device: cannot start {self.system.qemu}: {exc}\n".encode())
                return 127
            if proc.killed.is_set():
                proc.kill()
            stdout, stderr = proc.popen.communicate()
            self.out(stdout)
            self.err(stderr)
            rc = proc.popen.returncode
            return 128 - rc if rc < 0 else rc
        finally:
            self.current = None
            self.system.end_process(proc)
            self.system.after_run()

    def cancel(self, link_lost: bool = False) -> None:
        """The host closed the stream: end the command, as adbd does (SIGHUP). A --hang
        process plays one that ignores SIGHUP: only an explicit kill or a lost link ends it."""
        self.cancelled.set()
        proc = self.current
        if proc is not None and (link_lost or not self.system.faults.hang):
            proc.kill()

