#!/usr/bin/env python3
"""What one OpenMP parallel region costs here under each wait policy (not run in CI).

    .venv/bin/python benchmarks/thread_wake.py [--threads 2] [--regions 2000]

Compiles a C program that opens `--regions` empty `#pragma omp parallel` regions of `--threads`
threads back to back and prints the microseconds per region, then runs it with OMP_WAIT_POLICY
unset (libgomp's default: spin a while, then sleep), =active and =passive (idle threads sleep at
once, so every region wakes them). A network's steps are parallel regions one after another: with
100 regions an inference, a 75 us wake-up is 7.5 ms. `xfc model --bench --thread-wait` chooses the
policy of the benchmark program (docs/deploying.md). Writes benchmarks/results/thread_wake.json.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from machine import machine_facts

REPO = Path(__file__).resolve().parent.parent
SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now_us(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec * 1e-3; }
int main(int argc, char **argv)
{
    int threads = atoi(argv[1]), regions = atoi(argv[2]);
    volatile int sink = 0;
    for (int round = 0; round < 5; round++) {
        double t = now_us();
        for (int i = 0; i < regions; i++) {
#pragma omp parallel num_threads(threads)
            { sink++; }
        }
        printf("%.3f\n", (now_us() - t) / regions);
    }
    return 0;
}
"""
POLICIES = {"default (spin, then sleep)": None, "active": "active", "passive": "passive"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--regions", type=int, default=2000)
    parser.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="xfc-thread-wake-") as tmp:
        exe = Path(tmp) / "wake"
        (Path(tmp) / "wake.c").write_text(SOURCE)
        subprocess.run(["gcc", "-O2", "-fopenmp", str(Path(tmp) / "wake.c"), "-o", str(exe)], check=True)
        for label, policy in POLICIES.items():
            env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
            if policy:
                env["OMP_WAIT_POLICY"] = policy
            out = subprocess.run([str(exe), str(args.threads), str(args.regions)], env=env, check=True,
                                 capture_output=True, text=True).stdout.split()
            rounds = [float(x) for x in out[1:]]          # the first round warms the team up
            rows.append({"policy": label, "us_per_region_median": statistics.median(rounds), "rounds_us": rounds})
            print(f"{label:28s} {statistics.median(rounds):8.2f} us per parallel region ({args.threads} threads)")
    from xfc.outputs import write_json_result
    out = args.results / "thread_wake.json"
    write_json_result(out, {"machine": machine_facts(), "threads": args.threads, "regions": args.regions, "rows": rows,
                            "command": f"benchmarks/thread_wake.py --threads {args.threads} --regions {args.regions}"},
                      kind="thread-wake")
    print(f"-> {out.relative_to(REPO) if out.is_relative_to(REPO) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
