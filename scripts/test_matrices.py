#!/usr/bin/env python3
"""Every case of the test suite's exhaustive matrices (`make test-matrices`, not in CI).

Tests marked `@pytest.mark.matrix(every=N)` (random shapes, ISA x tile grids, Winograd and int8
and fp16 grids) run one case in N under `make test`, chosen by the digest of the case's id, so
the suite fits its time budget (tests/conftest.py). This runs all of them, with every compile-only
kernel compiled (XFC_TEST_COMPILE_EVERY=1), and writes a per-test summary with the machine it ran
on to benchmarks/results/test_matrices.json (atomically; exit 1 if a case failed).

    .venv/bin/python scripts/test_matrices.py                      # make test-matrices
    .venv/bin/python scripts/test_matrices.py --jobs 4 --out /tmp/m.json
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from machine import machine_facts  # noqa: E402  (the CPU the results were taken on)
from xfc.outputs import write_json_result  # noqa: E402

DEFAULT_OUT = REPO / "benchmarks" / "results" / "test_matrices.json"


def summarize(junit_xml: Path) -> dict:
    """{test function: {cases, passed, failed, skipped, seconds, failed_ids}} from pytest's JUnit XML."""
    per_test: dict[str, dict] = defaultdict(lambda: {"cases": 0, "passed": 0, "failed": 0, "skipped": 0,
                                                     "seconds": 0.0, "failed_ids": []})
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        name = case.get("name", "")
        # xunit1 names the file; a class, if any, is the classname's last part
        classname = case.get("classname", "")
        last = classname.rsplit(".", 1)[-1]
        owner = f"{last}::" if last[:1].isupper() else ""
        function = f"{case.get('file', classname)}::{owner}{name.split('[')[0]}"
        row = per_test[function]
        row["cases"] += 1
        row["seconds"] = round(row["seconds"] + float(case.get("time", 0.0)), 2)
        if case.find("failure") is not None or case.find("error") is not None:
            row["failed"] += 1
            row["failed_ids"].append(name)
        elif case.find("skipped") is not None:
            row["skipped"] += 1
        else:
            row["passed"] += 1
    return dict(sorted(per_test.items()))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="pytest-xdist workers (default 2)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"results JSON (default {DEFAULT_OUT.relative_to(REPO)})")
    args = parser.parse_args(argv)
    env = dict(os.environ, XFC_TEST_MATRICES="full", XFC_TEST_COMPILE_EVERY="1")
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="xfc-matrices-") as tmp:
        junit = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-n", str(args.jobs), "-m", "matrix", "-p", "no:cacheprovider",
               "-o", "junit_family=xunit1", f"--junitxml={junit}", "tests"]
        proc = subprocess.run(cmd, cwd=REPO, env=env)
        if proc.returncode not in (0, 1) or not junit.exists():   # interrupted, or a usage / collection error
            print(f"test_matrices: pytest exited {proc.returncode}; {args.out} left as it was", file=sys.stderr)
            return 2
        tests = summarize(junit)
    totals = {k: sum(t[k] for t in tests.values()) for k in ("cases", "passed", "failed", "skipped")}
    doc = {
        "what": "every case of the tests marked matrix (make test runs one in N of each); XFC_TEST_MATRICES=full, "
                "XFC_TEST_COMPILE_EVERY=1",
        "command": "make test-matrices",
        "machine": machine_facts(),
        "duration_s": round(time.time() - started, 1),
        "pytest_exit": proc.returncode,
        **totals,
        "tests": tests,
    }
    write_json_result(args.out, doc, kind="test_matrices")
    print(f"test_matrices: {totals['cases']} cases, {totals['passed']} passed, {totals['failed']} failed, "
          f"{totals['skipped']} skipped -> {args.out}")
    return 1 if totals["failed"] or proc.returncode != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
