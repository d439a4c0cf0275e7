"""Run the README's "Using it" commands as printed, and check what they wrote is readable by others.

    python scripts/readme_check.py [--keep DIR]

Every `xfc ...` line of the README section "Using it" runs in a fresh copy of the repository's
working directory layout (a temporary directory holding a `hardware_descriptions` link, so the
relative paths the README uses resolve), with the `xfc` of this interpreter's environment and umask
022. Lines that name a file or device the reader supplies (my-soc.yaml, SERIAL) must fail with one
line and exit 2 or 3, as the README says they would without them; every other line must exit 0. Then
every file under the outputs (xfc-out/) must be 0644 (programs 0755). Prints one line per command;
exit 1 on any surprise. Not part of `make test` (it builds and runs full-size kernels, some under qemu).
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PLACEHOLDERS = ("SERIAL", "my-soc.yaml")      # the reader's own file or phone: refused in one line


def readme_commands(text: str) -> list[str]:
    section = text.split("## Using it", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh", 1)[1].split("```", 1)[0]
    return [re.sub(r"\s+#.*$", "", line).strip() for line in block.splitlines() if line.startswith("xfc ")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", metavar="DIR", help="run in DIR (kept) instead of a temporary directory")
    args = ap.parse_args(argv)
    xfc = Path(sys.executable).parent / "xfc"
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="xfc-readme-"))
    work.mkdir(parents=True, exist_ok=True)
    if not (work / "hardware_descriptions").exists():
        (work / "hardware_descriptions").symlink_to(REPO / "hardware_descriptions")
    os.umask(0o022)
    surprises = 0
    try:
        for line in readme_commands((REPO / "README.md").read_text()):
            argv = shlex.split(line)
            start = time.perf_counter()
            try:
                proc = subprocess.run([str(xfc), *argv[1:]], cwd=work, capture_output=True, text=True, timeout=1800)
            except subprocess.TimeoutExpired:
                surprises += 1
                print(f"FAIL  1800 s  {line}  [timed out]")
                continue
            seconds = time.perf_counter() - start
            placeholder = any(p in line for p in PLACEHOLDERS)
            # one line: an error on stderr, or `hw validate`'s report line for the file on stdout
            errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("xfc: error")] + \
                     [ln for ln in proc.stdout.splitlines() if ln.startswith("ERROR ")]
            ok = (proc.returncode in (2, 3) and len(errors) == 1 and "Traceback" not in proc.stderr) if placeholder \
                else proc.returncode == 0
            surprises += not ok
            what = errors[0] if placeholder and errors else f"exit {proc.returncode}"
            print(f"{'ok  ' if ok else 'FAIL'} {seconds:6.1f} s  {line}  [{what}]")
            if not ok:
                print("     " + (proc.stderr.strip().splitlines() or [""])[-1][:300])
        for path in sorted((work / "xfc-out").rglob("*")):
            if path.is_file():
                mode = path.stat().st_mode & 0o777
                with path.open("rb") as f:      # programs (ELF, scripts) 0755; anything else 0644
                    want = 0o755 if f.read(4).startswith((b"\x7fELF", b"#!")) else 0o644
                if mode not in (0o644, 0o755) or mode != want:
                    surprises += 1
                    print(f"FAIL mode {oct(mode)} {path.relative_to(work)}")
        print(("no surprises" if not surprises else f"{surprises} surprise(s)") + (f"; outputs in {work}" if args.keep else ""))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if surprises else 0


if __name__ == "__main__":
    sys.exit(main())
