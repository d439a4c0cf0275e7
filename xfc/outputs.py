"""Output ownership: xfc writes only where it may, and never leaves half-written results.

The rule, for every place xfc writes on this machine:

* **Directories.** xfc writes into a directory only if it does not exist yet, is empty, or
  carries xfc's marker file `.xfc-output` (small JSON: tool, version, what was written and the
  list of files xfc wrote there). Work is staged in a temporary sibling directory
  (`.<name>.xfc-staging-*`) and moved into place on commit: a new or empty destination is one
  rename, an xfc-owned one is swapped with one atomic exchange (renameat2 RENAME_EXCHANGE; two
  renames where the file system lacks it), so readers see the old or the new output, never a
  mix. A failure or an interrupt discards the staging directory and any parent directories
  this run created.
* **Refusals** (exit status 2, one line saying what is there and how to proceed): an existing
  file or other non-directory; a non-empty directory without the marker; an xfc-owned
  directory that now also holds files xfc did not write. `force=True` (`--force`) writes into
  such a directory anyway, beside what is there: it adds or replaces only files the marker
  lists as xfc's and refuses, naming it, a same-named file xfc did not write. Nothing xfc did
  not write is ever deleted or replaced.
* **The current directory and its parents** (`-o .`, `-o ..`) and mount points (bind mounts too:
  is_mount_point) are never moved: xfc writes its files into them one by one, each with an atomic rename, under the same
  ownership rule (an empty current directory is fine; a non-empty one needs the marker or
  `--force`).
  Files an earlier xfc run listed but this one did not write are removed; the marker is
  rewritten first with both lists, so a crash mid-way never makes xfc's files look foreign.
* The moves of a commit run with SIGINT/SIGTERM held, so an interrupt lands before or after.
* **Single files** (benchmark results, later the tile database): `write_owned_file` replaces a
  file atomically and only when a caller-given check recognises it as xfc's by its content;
  `write_json_result` adds a top-level `"xfc_output"` key that serves as that check.
  `claim_file` is the check alone, for writers that update a file in place (sqlite).

Output directories are flat (no subdirectories); every writer in xfc produces flat ones.
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import shutil
import signal
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional

from ._version import __version__
from .errors import XfcError

MARKER_NAME = ".xfc-output"
JSON_OWNER_KEY = "xfc_output"
STAGING_TAG = ".xfc-staging-"

_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


class OutputError(XfcError):
    """xfc may not write there (a file or a directory it does not own). Exit status 2."""


# ---------------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------------

def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def _umask_mode(mode: int) -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mode & ~mask


_libc = None


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """renameat2(2) with flags; False when the C library or the file system lacks it."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.renameat2  # noqa: B018 - glibc >= 2.28
        except (OSError, AttributeError):
            _libc = False
    if _libc is False:
        return False
    if _libc.renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(dst))


def _examples(names: Iterable[str], limit: int = 3) -> str:
    names = sorted(names)
    shown = ", ".join(f"'{n}'" for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


# ---------------------------------------------------------------------------------------------
# The marker
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Marker:
    """The contents of `.xfc-output`: which files in the directory xfc wrote."""
    what: str
    files: tuple[str, ...]
    version: str = __version__

    def to_json(self) -> str:
        return json.dumps({"tool": "xfc", "version": self.version, "what": self.what,
                           "files": sorted(self.files)}, indent=2) + "\n"


def read_marker(directory: Path) -> Optional[Marker]:
    """The directory's marker, or None if it has none (or the file there is not xfc's)."""
    path = Path(directory) / MARKER_NAME
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > 1 << 20:
            return None
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or data.get("tool") != "xfc" or not isinstance(data.get("files"), list):
        return None
    files = tuple(f for f in data["files"] if isinstance(f, str) and f and "/" not in f and f not in (".", ".."))
    return Marker(what=str(data.get("what", "")), files=files, version=str(data.get("version", "?")))


# ---------------------------------------------------------------------------------------------
# What is at the destination
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Survey:
    state: str                          # absent | empty | owned | foreign | not_a_directory
    marker: Optional[Marker] = None
    foreign: tuple[str, ...] = ()       # entries xfc did not write
    kind: str = ""                      # for not_a_directory: 'a file', 'a symbolic link', ...


def _describe_non_dir(path: Path) -> str:
    if path.is_symlink():
        return "a symbolic link to a missing path" if not path.exists() else "a symbolic link"
    if path.is_file():
        return "a file"
    return "something that is not a directory (a device, socket or pipe)"


def _survey(real: Path, ignore: frozenset[str] = frozenset()) -> _Survey:
    if not os.path.lexists(real):
        return _Survey("absent")
    if not real.is_dir():
        return _Survey("not_a_directory", kind=_describe_non_dir(real))
    try:
        entries = [e for e in os.listdir(real) if e not in ignore]
    except OSError as exc:
        raise OutputError(f"cannot read {real}: {_reason(exc)}") from None
    if not entries:
        return _Survey("empty")
    marker = read_marker(real)
    if marker is None:
        return _Survey("foreign", foreign=tuple(sorted(entries)))
    listed = set(marker.files)
    foreign = tuple(sorted(e for e in entries if e != MARKER_NAME and e not in listed))
    if foreign:
        return _Survey("foreign", marker=marker, foreign=foreign)
    return _Survey("owned", marker=marker)


def _looks_like_old_xfc_output(real: Path) -> bool:
    try:
        data = json.loads((real / "report.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(data, dict) and ("xfc_report" in data or "xfc_version" in data)


def _is_cwd_or_ancestor(real: Path) -> bool:
    try:
        cwd = Path(os.getcwd()).resolve()
    except OSError:
        return False
    return real == cwd or real in cwd.parents


MOUNTINFO = Path("/proc/self/mountinfo")


def _unescape_mount_path(text: str) -> str:
    """A mount point as mountinfo writes it: space, tab, newline and backslash as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def is_mount_point(real: Path, mountinfo: Optional[Path] = None) -> bool:
    """Whether real is a mount point. os.path.ismount compares devices, so it misses a bind mount
    of a directory of the same file system (docker -v, mount --bind): the kernel's mount table
    (Linux's /proc/self/mountinfo, field 5) names those too. Moving a directory onto a mount point
    fails (EBUSY), and only after all the work."""
    if os.path.ismount(real):
        return True
    try:
        lines = (mountinfo or MOUNTINFO).read_text(errors="replace").splitlines()
    except OSError:
        return False
    target = str(real)
    return any(len(fields) > 4 and _unescape_mount_path(fields[4]) == target
               for fields in (line.split() for line in lines))


# ---------------------------------------------------------------------------------------------
# Staged output directories
# ---------------------------------------------------------------------------------------------

def _refuse(survey: _Survey, dest: Path, real: Path, *, force: bool, option: str,
            force_option: Optional[str]) -> None:
    """Raise OutputError when xfc may not write the surveyed destination."""
    where = f"{option} {dest}"
    if survey.state == "not_a_directory":
        raise OutputError(f"{where}: {survey.kind} is already there; xfc never replaces a file it did not write: "
                          f"choose another {option}, or move it away yourself")
    if survey.state != "foreign" or force:
        return
    force_hint = (f", or pass {force_option} to write xfc's files beside them (nothing there is deleted or "
                  f"replaced)") if force_option else ""
    count = len(survey.foreign)
    entries = f"{count} entr{'y' if count == 1 else 'ies'} xfc did not write ({_examples(survey.foreign)})"
    if survey.marker is not None:
        raise OutputError(f"{where}: the directory holds xfc output and {entries}; choose another {option}, "
                          f"move them away yourself{force_hint}")
    hint = (" (it looks like output of an older xfc, written before the .xfc-output marker)"
            if _looks_like_old_xfc_output(real) else "")
    raise OutputError(f"{where}: the directory holds {entries}{hint}; choose another {option}, "
                      f"empty or remove it yourself{force_hint}")


class _SignalsHeld:
    """Hold SIGINT/SIGTERM while a commit moves files, so an interrupt lands before or after it."""

    _SIGNALS = {signal.SIGINT, signal.SIGTERM}

    def __enter__(self):
        self._old = signal.pthread_sigmask(signal.SIG_BLOCK, self._SIGNALS)
        return self

    def __exit__(self, *exc):
        signal.pthread_sigmask(signal.SIG_SETMASK, self._old)


# OutputDir's names for the Python API (xfc.compile, xfc.compile_model): its messages then say
# "choose another out_dir ... pass force=True", the arguments a Python caller has.
API_OUTPUT_NAMES = {"option": "out_dir", "force_option": "force=True"}


@dataclass
class OutputDir:
    """Stage an output directory and move it into place on commit().

        with OutputDir(dest, what="matmul kernel for host", force=False) as out:
            ... write files into out.path ...
            out.commit()
        # leaving the block without commit() (an exception, Ctrl-C, SIGTERM) discards everything

    Constructing it checks the destination (OutputError if xfc may not write there), creates
    missing parent directories (removed again on discard if still empty) and the staging
    directory `path`.
    """
    dest: Path
    what: str
    force: bool = False
    option: str = "-o"                    # how the user named the destination, for messages
    force_option: Optional[str] = "--force"
    path: Path = field(init=False)        # write here
    real: Path = field(init=False)        # dest with symbolic links resolved
    in_place: bool = field(init=False)    # True: files are moved into dest one by one
    committed: bool = field(init=False, default=False)
    _created_parents: list = field(init=False, default_factory=list)

    def __post_init__(self):
        self.dest = Path(self.dest)
        self.real = Path(os.path.realpath(self.dest))
        if os.path.islink(self.dest) and not os.path.exists(self.dest):   # never create a link's target
            survey = _Survey("not_a_directory", kind="a symbolic link to a missing path")
        else:
            survey = _survey(self.real)
        self._refuse(survey)
        # Never move the current directory, one of its parents or a mount point; and with
        # --force into a foreign directory, only add files beside what is there.
        self.in_place = survey.state == "foreign" or (
            survey.state != "absent" and (_is_cwd_or_ancestor(self.real) or is_mount_point(self.real)))
        staging_parent = self.real if self.in_place else self.real.parent
        prefix = STAGING_TAG if self.in_place else f".{self.real.name}{STAGING_TAG}"
        try:
            self._make_parents(staging_parent)
            self.path = Path(tempfile.mkdtemp(prefix=prefix, dir=staging_parent))
        except OSError as exc:
            self._remove_created_parents()
            raise OutputError(f"{self.option} {self.dest}: cannot create a staging directory in "
                              f"{staging_parent}: {_reason(exc)}") from None

    def _refuse(self, survey: _Survey) -> None:
        _refuse(survey, self.dest, self.real, force=self.force, option=self.option, force_option=self.force_option)

    def _make_parents(self, directory: Path) -> None:
        missing = []
        while not os.path.lexists(directory):
            missing.append(directory)
            directory = directory.parent
        for p in reversed(missing):
            os.mkdir(p)
            self._created_parents.append(p)

    def _remove_created_parents(self) -> None:
        for p in reversed(self._created_parents):
            try:
                os.rmdir(p)
            except OSError:
                break
        self._created_parents.clear()

    def _staged_files(self) -> list[str]:
        names = sorted(os.listdir(self.path))
        for n in names:
            p = self.path / n
            if p.is_dir() and not p.is_symlink():
                raise OutputError(f"internal: output directories are flat, but {n}/ was staged in {self.path}")
        return [n for n in names if n != MARKER_NAME]

    def commit(self) -> Path:
        """Move the staged files into place (see the module docstring); returns dest."""
        if self.committed:
            return self.dest
        with _SignalsHeld():
            files = self._staged_files()
            if self.in_place:
                survey = _survey(self.real, ignore=frozenset({self.path.name}))
                self._refuse(survey)
                self._move_into(files, survey)
            else:
                self._commit_swap(files)
            self.committed = True
            self._created_parents.clear()
        return self.dest

    def _commit_swap(self, files: list[str]) -> None:
        (self.path / MARKER_NAME).write_text(Marker(self.what, tuple(files)).to_json())
        os.chmod(self.path, _umask_mode(0o777))   # mkdtemp made it 0700
        for attempt in range(2):
            survey = _survey(self.real)
            self._refuse(survey)
            if survey.state == "foreign":          # filled by someone else since we started (--force)
                self.in_place = True
                self._move_into(files, survey)
                return
            try:
                if survey.state == "absent":
                    if not _renameat2(self.path, self.real, _RENAME_NOREPLACE):
                        os.rename(self.path, self.real)
                elif survey.state == "empty":
                    os.rename(self.path, self.real)    # rename(2) replaces an empty directory atomically
                elif _renameat2(self.path, self.real, _RENAME_EXCHANGE):   # owned: swap in one step
                    shutil.rmtree(self.path, ignore_errors=True)           # (the old output is here now)
                else:
                    old = Path(tempfile.mkdtemp(prefix=f".{self.real.name}.xfc-old-", dir=self.real.parent))
                    os.rename(self.real, old / "x")
                    os.rename(self.path, self.real)
                    shutil.rmtree(old, ignore_errors=True)
                return
            except OSError as exc:
                # Someone else wrote the destination between the survey and the rename: look again.
                if attempt == 0 and exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    continue
                raise OutputError(f"{self.option} {self.dest}: cannot move the output into place: "
                                  f"{_reason(exc)}") from None

    def _move_into(self, files: list[str], survey: _Survey) -> None:
        """Move staged files into the destination one by one (each rename is atomic)."""
        ours = set(survey.marker.files) if survey.marker else set()
        if survey.marker is None and os.path.lexists(self.real / MARKER_NAME):
            raise OutputError(f"{self.option} {self.dest}: the '{MARKER_NAME}' there is not xfc's marker; xfc never "
                              f"replaces a file it did not write: move it away or choose another {self.option}")
        for name in files:
            target = self.real / name
            if os.path.lexists(target) and (name not in ours or (target.is_dir() and not target.is_symlink())):
                raise OutputError(f"{self.option} {self.dest}: '{name}' is already there and was not written by "
                                  f"xfc; xfc never replaces it: move it away or choose another {self.option}")
        # List old and new files first, so a crash while moving never makes xfc's own files look
        # foreign to the next run; then move; then drop stale files of an earlier run.
        present_ours = {n for n in ours if os.path.lexists(self.real / n)}
        self._write_marker_in_place(Marker(self.what, tuple(sorted(present_ours | set(files)))))
        for name in files:
            os.replace(self.path / name, self.real / name)
        for name in sorted(present_ours - set(files)):
            target = self.real / name
            if target.is_symlink() or target.is_file():
                target.unlink()
        self._write_marker_in_place(Marker(self.what, tuple(files)))
        shutil.rmtree(self.path, ignore_errors=True)

    def _write_marker_in_place(self, marker: Marker) -> None:
        tmp = self.path / MARKER_NAME
        tmp.write_text(marker.to_json())
        os.replace(tmp, self.real / MARKER_NAME)

    def discard(self) -> None:
        """Remove the staging directory and the parents this run created (if still empty)."""
        if self.committed:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        self._remove_created_parents()

    def __enter__(self) -> "OutputDir":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.discard()


# ---------------------------------------------------------------------------------------------
# Single files
# ---------------------------------------------------------------------------------------------

def claim_file(path, is_ours: Callable[[Path], bool], *, option: str = "--out") -> None:
    """Raise OutputError unless `path` is absent or an existing regular file that `is_ours`
    recognises as written by xfc (for writers that update a file in place, e.g. sqlite)."""
    path = Path(path)
    if not os.path.lexists(path):
        return
    if path.is_symlink() or not path.is_file():
        raise OutputError(f"{option} {path}: {_describe_non_dir(path) if not path.is_dir() else 'a directory'} is "
                          f"already there; xfc writes a file of its own only: choose another {option}")
    try:
        ours = bool(is_ours(path))
    except (OSError, ValueError):
        ours = False
    if not ours:
        raise OutputError(f"{option} {path}: the file there was not written by xfc, and xfc never replaces such a "
                          f"file: choose another {option}, or move it away yourself")


def write_atomic(path, data: bytes | str, *, executable: bool = False, durable: bool = False,
                 before_replace: Optional[Callable[[], None]] = None) -> Path:
    """The one atomic file writer: a temporary sibling, renamed over path, so a reader sees the old
    file or the new one, never half of it. The file gets the mode a new file gets under the umask
    (0644 under umask 022; 0755 with executable), because users ship these files and another user's
    build must read them. durable: fsync before the rename (result files); before_replace: a last
    check run just before the rename (it raises to refuse). Missing parents are created.
    Ownership rules (which paths xfc may replace) are the callers' (OutputDir, write_owned_file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".xfc-tmp", dir=str(path.parent))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, _umask_mode(0o777 if executable else 0o666))   # mkstemp made it 0600
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def write_owned_file(path, data: bytes | str, is_ours: Callable[[Path], bool], *, option: str = "--out") -> Path:
    """Write `data` to `path` atomically (write_atomic, durable), refusing to replace a file `is_ours`
    does not recognise. Missing parent directories are created."""
    path = Path(path)
    claim_file(path, is_ours, option=option)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{option} {path}: cannot write there: {_reason(exc)}") from None
    try:
        # the file may have appeared meanwhile: claim it again just before the rename
        return write_atomic(path, data, durable=True, before_replace=lambda: claim_file(path, is_ours, option=option))
    except OSError as exc:
        raise OutputError(f"{option} {path}: cannot write there: {_reason(exc)}") from None


def json_is_ours(legacy_keys: tuple[str, ...] = ()) -> Callable[[Path], bool]:
    """Recogniser for JSON files written by write_json_result: a top-level "xfc_output" object
    naming xfc. `legacy_keys`: also accept files from before the key existed that have all of
    these top-level keys (e.g. the committed benchmark results)."""
    def check(path: Path) -> bool:
        if path.stat().st_size > 256 << 20:
            return False
        try:
            data = json.loads(path.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError):
            return False
        if not isinstance(data, dict):
            return False
        owner = data.get(JSON_OWNER_KEY)
        if isinstance(owner, dict) and owner.get("tool") == "xfc":
            return True
        return bool(legacy_keys) and all(k in data for k in legacy_keys)
    return check


def write_json_result(path, data: dict, *, kind: str, option: str = "--out", legacy_keys: tuple[str, ...] = (),
                      sort_keys: bool = False) -> dict:
    """Write a JSON result file xfc owns: adds {"xfc_output": {tool, version, kind}} and writes
    atomically through write_owned_file. Returns the dict written."""
    payload = {JSON_OWNER_KEY: {"tool": "xfc", "version": __version__, "kind": kind},
               **{k: v for k, v in data.items() if k != JSON_OWNER_KEY}}
    text = json.dumps(payload, indent=2, sort_keys=sort_keys, default=str) + "\n"
    write_owned_file(path, text, json_is_ours(legacy_keys), option=option)
    return payload
