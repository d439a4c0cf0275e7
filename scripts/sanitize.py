"""`make sanitize`: host kernels under AddressSanitizer + UBSan on the edge-case shapes.

Every case of xfc.testing.sanitize.EDGE_CASES, for every host ISA this machine runs (avx512, avx2,
generic) and 1, 2 and 3 threads, both entry points. Prints one line per case, writes the
results to benchmarks/results/sanitize.json (atomically) and exits 1 unless everything is clean.
Not part of CI (it builds ~135 sanitized programs); tests/test_sanitize.py runs a small subset.
"""
import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from xfc.testing.sanitize import EDGE_CASES, THREADS, host_isas, run_all

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "sanitize.json"))
    p.add_argument("--isa", action="append", choices=("avx512", "avx2", "generic"),
                   help="only this ISA (repeatable; default: every ISA the host runs)")
    p.add_argument("--case", action="append", help="only this case (repeatable)")
    args = p.parse_args()
    isas = [i for i in host_isas() if not args.isa or i in args.isa]
    cases = [c for c in EDGE_CASES if not args.case or c.name in args.case]
    if not cases:
        print(f"sanitize: no case named {args.case}", file=sys.stderr)
        return 2
    print(f"sanitize: {len(cases)} cases x {len(isas)} ISAs ({', '.join(isas)}) x threads {THREADS}", flush=True)
    summary = run_all(isas, cases, progress=lambda msg: print(msg, flush=True))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=str(out.parent))
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(summary, indent=2) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, out)
    verdict = "CLEAN" if summary["clean"] else f"NOT CLEAN ({len(summary['not_clean'])} of {summary['runs']} runs)"
    print(f"sanitize: {verdict}; {summary['runs']} runs; results in {out}")
    return 0 if summary["clean"] else 1


if __name__ == "__main__":
    sys.exit(main())
