#!/usr/bin/env python3
"""How fast one thread, and every CPU together, read a buffer over and over as its size passes the
last-level cache (issue 34; not run in CI).

    .venv/bin/python benchmarks/stream_past_cache.py [--sizes 0.25,0.5,1,1.2,1.5,2,8] [--out FILE]

Why: a Winograd layer's transformed filter U is read once per call by the GEMM stage. A U a little
larger than the L3 is neither an L3 read nor a DRAM stream: part of it stays on chip between calls
(xfc/cpu/winograd.py weights_memory charges the part past half the L3 at the host probe's DRAM
rate). On the project's Zen 4 VMs r18_l4's F(4,3) (U 37.7 MB, L3 32 MB) runs 1.5x faster on two
threads than on one (benchmarks/results/regret_winograd_zen4_2t_s62.json, 0.61 ms against 0.93),
where the model, pricing the stream at one chip-wide rate, predicted 0.99 ms.
This tool measures the rate that question needs, on this machine, with no model: a buffer of
SIZE x the L3, summed N times with 128-bit loads (four independent sums) after an untimed pass; on
several threads each sums its static share (the buffer first touched by every CPU's static
share, as the host probe does), as a split over output channels reads its half of U. Best of --repeats runs. The figures are the host's, side by
side in one run. The host probe measures the same ratio at one size, 1.2x the L3, and takes from it what its DRAM
figure already holds (the description's l3_overflow_read_speedup, which the cost model uses:
cost_model.overflow_stream_speedup); this tool shows how the plain ratio moves with the size.

Writes benchmarks/results/stream_past_cache.json (machine named; --out for another file) and a
table: GB/s for 1 thread and for every CPU, and their ratio.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import machine_facts, warn_if_loaded

from xfc.outputs import write_json_result
from xfc.tiledb import hostcc
from xfc.hardware.host import read_caches

RESULTS = Path(__file__).resolve().parent / "results"
READ_BYTES_PER_RUN = 512 << 20   # each timed run reads at least this much (passes over the buffer)
RUN_TIMEOUT_S = 300

SOURCE = r"""
#include <emmintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Every thread sums its static share of the buffer `passes` times; four independent sums so the
 * adds never limit the loads. Returns the sum so the reads cannot be dropped. */
static float sum_shares(const float *buf, size_t floats, int threads, int passes)
{
    float total = 0.0f;
#pragma omp parallel num_threads(threads) reduction(+:total)
    {
        size_t id = (size_t)omp_get_thread_num(), n = (size_t)omp_get_num_threads();
        size_t lo = floats * id / n / 16 * 16, hi = floats * (id + 1) / n / 16 * 16;
        for (int p = 0; p < passes; p++) {
            __m128 s0 = _mm_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
            for (size_t i = lo; i < hi; i += 16) {
                s0 = _mm_add_ps(s0, _mm_load_ps(buf + i));
                s1 = _mm_add_ps(s1, _mm_load_ps(buf + i + 4));
                s2 = _mm_add_ps(s2, _mm_load_ps(buf + i + 8));
                s3 = _mm_add_ps(s3, _mm_load_ps(buf + i + 12));
            }
            float lanes[4];
            _mm_storeu_ps(lanes, _mm_add_ps(_mm_add_ps(s0, s1), _mm_add_ps(s2, s3)));
            total += lanes[0] + lanes[1] + lanes[2] + lanes[3];
        }
    }
    return total;
}

/* usage: stream BYTES PASSES THREADS REPEATS -> one line: "<bytes read per run> <best seconds>" */
int main(int argc, char **argv)
{
    if (argc != 5) return 2;
    size_t bytes = (size_t)atoll(argv[1]);
    int passes = atoi(argv[2]), threads = atoi(argv[3]), repeats = atoi(argv[4]);
    size_t floats = bytes / sizeof(float) / 16 * 16;
    float *buf = aligned_alloc(64, floats * sizeof(float));
    if (!buf) return 1;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < floats; i++) buf[i] = 1.0f;   /* every CPU's share, whatever the run's threads */
    volatile float sink = sum_shares(buf, floats, threads, 1);   /* untimed warm pass */
    double best = 1e30;
    for (int r = 0; r < repeats; r++) {
        double t0 = now_s();
        sink += sum_shares(buf, floats, threads, passes);
        double t = now_s() - t0;
        if (t < best) best = t;
    }
    (void)sink;
    printf("%zu %.9f\n", floats * sizeof(float) * (size_t)passes, best);
    free(buf);
    return 0;
}
"""


def parse_sizes(text: str) -> list[float]:
    try:
        sizes = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"stream_past_cache: --sizes wants multiples of the L3 like 0.5,1,1.5, got {text!r}")
    if not sizes or min(sizes) <= 0:
        raise SystemExit(f"stream_past_cache: --sizes wants positive multiples of the L3, got {text!r}")
    return sizes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="0.25,0.5,1,1.2,1.5,2,8",
                        help="buffer sizes as multiples of the L3 (default 0.25,0.5,1,1.2,1.5,2,8)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per size and thread count")
    parser.add_argument("--out", default=str(RESULTS / "stream_past_cache.json"))
    args = parser.parse_args(argv)
    sizes = parse_sizes(args.sizes)
    load = warn_if_loaded()
    l3 = read_caches().get("L3")   # sysfs, as the host description reads it (no probe run for this)
    l3_bytes = int(l3["size_kib"] * 1024) if l3 else 0
    if not l3_bytes:
        raise SystemExit("stream_past_cache: this machine reports no L3 (sysfs); nothing to pass")
    try:
        cpus = len(os.sched_getaffinity(0))   # the CPUs OpenMP's team may use, as the probe counts them
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    rows = []
    with tempfile.TemporaryDirectory(prefix="xfc-stream-") as tmp:
        src = Path(tmp) / "stream.c"
        src.write_text(SOURCE)
        exe = hostcc.compile_c(src, Path(tmp) / "stream", ["-O2", "-fopenmp"], "stream probe compile")
        print(f"L3 {l3_bytes / 2**20:.0f} MiB, {cpus} CPUs")
        print(f"{'x L3':>6} {'MiB':>7} {'1 thread GB/s':>14} {f'{cpus} threads GB/s':>16} {'ratio':>6}")
        for size in sizes:
            buf_bytes = int(size * l3_bytes)
            passes = max(1, -(-READ_BYTES_PER_RUN // buf_bytes))
            rates = {}
            for threads in sorted({1, cpus}):
                done = subprocess.run([str(exe), str(buf_bytes), str(passes), str(threads), str(args.repeats)],
                                      capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=True)
                read_bytes, seconds = done.stdout.split()
                rates[threads] = int(read_bytes) / float(seconds) / 1e9
            row = dict(l3_multiple=size, buffer_bytes=buf_bytes, passes=passes,
                       gbps_by_threads={str(t): round(r, 2) for t, r in rates.items()},
                       all_over_one=round(rates[cpus] / rates[1], 3))
            rows.append(row)
            print(f"{size:6.2f} {buf_bytes / 2**20:7.1f} {rates[1]:14.1f} {rates[cpus]:16.1f} {row['all_over_one']:6.2f}",
                  flush=True)
    out = write_json_result(Path(args.out), dict(
        machine=machine_facts(), l3_bytes=l3_bytes, cpus=cpus, repeats=args.repeats,
        load_average_at_start=round(load, 2),
        command=" ".join(["benchmarks/stream_past_cache.py"] + (argv if argv is not None else sys.argv[1:])),
        how="a buffer of l3_multiple x the L3 summed passes times with 128-bit loads after an untimed pass; "
            "on several threads each sums its static share; best of repeats; GB/s of all threads together",
        rows=rows), kind="stream-past-cache")
    print(f"-> {args.out}")
    return 0 if out else 1


if __name__ == "__main__":
    sys.exit(main())
