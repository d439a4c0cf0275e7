#!/usr/bin/env python3
"""The register micro-kernel alone, on L1-resident packed panels: the FMA ceiling our GEMMs and
convolutions can reach on this host (no packing, no C traffic beyond one tile).

    .venv/bin/python benchmarks/ukernel_peak.py                 # 14x32 and 6x64 tiles, avx512
    .venv/bin/python benchmarks/ukernel_peak.py --tiles 14x32 --kc 64,256

The kernel source is the one xfc renders (templates/cpu/gemm.c.j2, hand plan with A packed);
a small C driver includes it and calls its xfc_ukernel repeatedly. Prints GFLOP/s per tile
(best of 20 batches of 20000 calls, one thread).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from xfc.cpu.plans import hand_plan
from xfc.cpu.codegen import render_cpu_kernel
from xfc.ops.spec import make_spec

DRIVER = r"""
#include <stdio.h>
#include <time.h>
#include "kernel.c"
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
int main(void)
{
    const long kc = KC, calls = 20000;
    float *ap = aligned_alloc(64, sizeof(float) * XFC_MR * kc), *bp = aligned_alloc(64, sizeof(float) * XFC_NR * kc);
    float *c = aligned_alloc(64, sizeof(float) * XFC_MR * XFC_NR);
    for (long i = 0; i < XFC_MR * kc; i++) ap[i] = 1e-3f * (float)(i % 7);
    for (long i = 0; i < XFC_NR * kc; i++) bp[i] = 1e-3f * (float)(i % 5);
    double best = 1e30;
    for (int batch = 0; batch < 20; batch++) {
        double t0 = now();
        for (long it = 0; it < calls; it++) {
            xfc_ukernel(kc, ap, NULL, bp, c, XFC_NR, (int)(it & 1), 0, NULL);
            __asm__ volatile("" : : "r"(c) : "memory");
        }
        double t = now() - t0;
        if (t < best) best = t;
    }
    printf("%.1f\n", 2.0 * XFC_MR * XFC_NR * kc * calls / best / 1e9);
    return 0;
}
"""


def measure(isa: str, mr: int, nr: int, kc: int, work: Path) -> float:
    spec = make_spec("matmul", dict(m=4 * mr, n=4 * nr, k=kc))
    plan = hand_plan(spec, isa, 1, mr=mr, nr=nr, kc=kc, a_pack="packed", function_name="xfc_peak",
                     prefetch_next_panel_lines=0)   # the loop alone: the driver calls xfc_ukernel itself
    (work / "kernel.c").write_text(render_cpu_kernel(plan).source)
    (work / "driver.c").write_text(DRIVER)
    exe = work / f"peak_{mr}x{nr}_{kc}"
    march = "native" if isa in ("avx512", "generic") else "x86-64-v3"
    subprocess.run(["gcc", "-O3", f"-march={march}", "-fopenmp", f"-DKC={kc}", "-o", str(exe), str(work / "driver.c")],
                   check=True, capture_output=True, text=True)
    return float(subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--isa", default="avx512", choices=("avx512", "avx2", "generic"))
    ap.add_argument("--tiles", default="14x32,6x64", help="MRxNR tiles, comma-separated")
    ap.add_argument("--kc", default="64,256", help="reduction depths, comma-separated")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="xfc-peak-") as tmp:
        print(f"{'tile':>8} {'kc':>5} {'GFLOP/s':>8}   (isa {args.isa}, one thread, panels in L1)")
        for tile in args.tiles.split(","):
            mr, nr = (int(x) for x in tile.lower().split("x"))
            for kc in (int(k) for k in args.kc.split(",")):
                print(f"{tile:>8} {kc:>5} {measure(args.isa, mr, nr, kc, Path(tmp)):8.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
