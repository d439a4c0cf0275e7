#!/usr/bin/env python3
"""Host int8 ceiling per core: a register-only dot-product loop, in int8 ops per cycle.

    .venv/bin/python benchmarks/int8_peak.py          # every int8 dialect this CPU has
    .venv/bin/python benchmarks/int8_peak.py --quick  # one short batch (checks that it runs)

Like benchmarks/host_peak.py for fp32: independent accumulator chains (each feeding only itself,
kept in its own register by an empty asm), one thread, best of BATCHES batches timed by wall clock.
  vnni  vpdpbusd zmm: 16 lanes x 4 u8*s8 products = 64 MACs = 128 ops per instruction;
  avx2  the xfc AVX2 step (templates/cpu/int8_dialect.h.j2): two vpmaddwd + two vpaddd on ymm,
        8 lanes x 4 products = 32 MACs = 64 ops per step (the even/odd split of the loaded
        operands is outside the loop here, as it is per column vector, not per tile element);
        6 chains x 2 distinct products (16 ymm registers: 6 accumulators, 7 operands, 1 temporary).
The clock is the description's, which may sit below the turbo clock the loop runs at: then the
ops/cycle figure overstates the per-cycle rate by that ratio (the GOP/s figure stands).
ops/cycle divides by the clock of the host description (`xfc hw show host`: the probe's
sustained clock when measured, else /proc/cpuinfo). Results: a table and
benchmarks/results/int8_peak.json (atomic, xfc-owned). Run on a quiet machine.
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from xfc.hardware.host import available_isas  # noqa: E402
from xfc.outputs import write_json_result  # noqa: E402
from xfc.hardware.host import read_flags  # noqa: E402
from xfc.tiledb.hostdesc import load_hardware  # noqa: E402

CHAINS = {"vnni": 16, "avx2": 6}
ITERS = 4_000_000
BATCHES = 15
OPS_PER_STEP = {"vnni": 128, "avx2": 64}
TARGET = {"vnni": ("avx512f,avx512bw,avx512vnni", "host:avx512"), "avx2": ("avx2", "host:avx2")}


def loop_source(dialect: str, chains: int, iters: int, batches: int) -> str:
    """The C loop. Operands pass through an empty asm at the top of every iteration, so the
    compiler can neither fold nor hoist the dot products; with AVX2 every chain gets its own
    (x, y) pairs (12 distinct vpmaddwd per iteration), so no product is shared between chains."""
    names = [f"acc{i}" for i in range(chains)]
    if dialect == "vnni":
        vec, zero = "__m512i", "_mm512_set1_epi32({i})"
        operands = ["x0", "y0"]
        setup = "__m512i x0 = _mm512_set1_epi32(0x01020304), y0 = _mm512_set1_epi32(0x01FF02FE);"
        steps = [f"{n} = _mm512_dpbusd_epi32({n}, x0, y0);" for n in names]
        store = "_mm512_storeu_si512((void *)lanes, {n}); sink += lanes[0];"
        lanes = 16
    else:
        vec, zero = "__m256i", "_mm256_set1_epi32({i})"
        xs, ys = [f"x{i}" for i in range(3)], [f"y{i}" for i in range(4)]
        operands = xs + ys
        setup = " ".join(f"__m256i {v} = _mm256_set1_epi32({0x00030001 + 7 * i});" for i, v in enumerate(operands))
        pairs = [(x, y) for x in xs for y in ys]
        steps = [f"{n} = _mm256_add_epi32({n}, _mm256_madd_epi16({pairs[2 * i][0]}, {pairs[2 * i][1]})); "
                 f"{n} = _mm256_add_epi32({n}, _mm256_madd_epi16({pairs[2 * i + 1][0]}, {pairs[2 * i + 1][1]}));"
                 for i, n in enumerate(names)]
        store = "_mm256_storeu_si256((__m256i *)lanes, {n}); sink += lanes[0];"
        lanes = 8
    barrier = '__asm__ volatile("" : ' + ", ".join(f'"+v"({o})' for o in operands) + ");"
    declare = "\n".join(f"    {vec} {n} = {zero.format(i=i)};" for i, n in enumerate(names))
    body = "\n".join(f'            {step} __asm__ volatile("" : "+v"({n}));' for step, n in zip(steps, names))
    sink = "\n".join(f"    {store.format(n=n)}" for n in names)
    return f"""#pragma GCC target("{TARGET[dialect][0]}")
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(void) {{ struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }}
int main(void)
{{
    {setup}
{declare}
    double best = 1e30;
    for (int batch = 0; batch < {batches}; batch++) {{
        double t0 = now();
        for (long it = 0; it < {iters}L; it++) {{
            {barrier}
{body}
        }}
        double dt = now() - t0;
        if (dt < best) best = dt;
    }}
    int lanes[{lanes}]; long sink = 0;
{sink}
    printf("%.9e %ld\\n", best, sink);
    return 0;
}}
"""


def loop_gops(dialect: str, work: Path, iters: int, batches: int) -> float:
    src = work / f"int8_peak_{dialect}.c"
    src.write_text(loop_source(dialect, CHAINS[dialect], iters, batches))
    exe = work / f"int8_peak_{dialect}"
    subprocess.run(["gcc", "-O2", str(src), "-o", str(exe)], check=True, timeout=120)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=600).stdout.split()
    return CHAINS[dialect] * iters * OPS_PER_STEP[dialect] / float(out[0]) / 1e9


def measure(quick: bool = False) -> list[dict]:
    flags = frozenset(read_flags())
    isas = available_isas(cap=None)
    dialects = [d for d, ok in (("vnni", "avx512" in isas and "avx512_vnni" in flags), ("avx2", "avx2" in isas)) if ok]
    iters, batches = (100_000, 1) if quick else (ITERS, BATCHES)
    rows = []
    with tempfile.TemporaryDirectory(prefix="xfc-int8-peak-") as tmp:
        for dialect in dialects:
            hw = load_hardware(TARGET[dialect][1], os.environ, host_isa_cap=None,
                               warn=lambda m: print(f"int8_peak: {m}", file=sys.stderr))
            clock = hw.cluster().clock_ghz
            runs = [loop_gops(dialect, Path(tmp), iters, batches) for _ in range(1 if quick else 3)]
            best = max(runs)
            rows.append({"dialect": dialect, "clock_ghz": clock, "loop_gops": round(best, 2),
                         "loop_runs": [round(r, 2) for r in runs], "ops_per_cycle": round(best / clock, 2),
                         "dot_instructions_per_cycle": round(best / clock / OPS_PER_STEP[dialect]
                                                             * (2 if dialect == "avx2" else 1), 3),
                         "quick": quick, "host_notes": hw.notes})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one short batch: checks the loop builds and runs")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "int8_peak.json"))
    args = ap.parse_args(argv)
    if platform.machine() not in ("x86_64", "AMD64"):
        print("int8_peak: x86-64 only", file=sys.stderr)
        return 2
    rows = measure(args.quick)
    print(f"{'dialect':<8} {'GHz':>5} {'GOP/s':>8} {'ops/cycle':>10}")
    for r in rows:
        print(f"{r['dialect']:<8} {r['clock_ghz']:>5.2f} {r['loop_gops']:>8.1f} {r['ops_per_cycle']:>10.1f}")
    sys.path.insert(0, str(REPO / "benchmarks"))
    from machine import machine_facts
    write_json_result(Path(args.out), {"machine": machine_facts(), "chains": CHAINS, "iters": ITERS,
                                       "batches": BATCHES, "rows": rows,
                                       "command": "benchmarks/int8_peak.py" + (" --quick" if args.quick else "")},
                      kind="int8_peak")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
