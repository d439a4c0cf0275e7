#!/usr/bin/env python3
"""Do this machine's CPUs run side by side right now? (not run in CI)

    .venv/bin/python benchmarks/cpu_share.py [--rounds 5] [--pause-s 2]

Multi-thread timings on the project's VMs swing between two states: in one, two threads run twice
as fast as one; in the other, both xfc and onnxruntime run at 2 threads no faster than at 1. This
tool says which state the machine is in and what kind of sharing it is, from three probes compiled
here (one C program, pinned with sched_setaffinity):

- `fma`: a throughput-bound loop (12 independent 4-lane FMA chains). Two copies at once, one per CPU,
  each keep their speed if the CPUs are separate cores; each halve if they share a core's FMA units
  (SMT siblings) or take turns on one core (time-slicing).
- `chain`: a latency-bound loop (one dependent chain of adds). SMT siblings leave each other's
  latency-bound work at full speed; time-slicing halves it. With `fma`, this tells the two apart.
- `pingpong`: two threads of one process, one per CPU, hand a flag back and forth by spinning, as
  a runtime's barrier does. Between two cores of one core complex a round trip is ~0.05 us; between
  cores that do not share a last-level cache, ~0.3 us; when the two vCPUs take turns, each hand-off
  waits for the other to be scheduled (tens of us to ms).
- `handoff`: 512 KiB written on CPU 0 and then read on CPU 1 (a step boundary in a multi-threaded
  network: one thread's output is the next step's input on the other), against written and read on
  CPU 0. The ratio is ~3.5x while the two vCPUs share a last-level cache and ~13x while they do not:
  then every line one thread wrote and the other reads, or overwrites, crosses the chip's fabric.
  ~1.0x says the two vCPUs are one core's hyperthreads (they share its L1 and L2).

Each round runs: fma alone, fma x2 at once, chain alone, chain x2 at once, pingpong, handoff. The
ratios "x2 / alone" are per-copy speed (1.0: independent cores). The rounds are short (about a
second); then a sustained probe (--sustain-s, default 5 s) runs the FMA loop alone and two at once
and reports its 100 ms windows against the best: on a VM whose host runs other tenants on the same
physical cores, windows drop while the neighbour computes, which the short rounds can miss.

What the project's Zen 4 VMs do (benchmarks/results/cpu_share_caches.json): every few tens of
seconds the two vCPUs stop sharing a last-level cache, and later share one again (the host runs
them on different core complexes). Then the FMA and chain probes keep full speed, while the
pingpong goes from 0.05 to 0.34 us and the handoff from 3.5x to 13x; in
benchmarks/results/net_states_mobilenet_v2.json (benchmarks/net_states.py) MobileNetV2's 2-thread
benchmark program took 7.9 ms in those rounds against 4.7 ms with a shared cache (1 thread: 7.8 ms),
and onnxruntime's 2-thread session 7.8 against 4.9 ms. Rarer: the two vCPUs on one physical core's
hyperthreads (one round of benchmarks/results/cpu_share.json, where two FMA copies ran at half speed
while two latency-bound copies kept theirs; a handoff ratio of 1.0). Writes
benchmarks/results/cpu_share.json (machine named; --out-name for another name) and a table.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import machine_facts, warn_if_loaded

from xfc.outputs import write_json_result

REPO = Path(__file__).resolve().parent.parent
SOURCE = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { FMA_CHAINS = 12, FMA_ITERS = 100000000, CHAIN_ITERS = 200000000, PINGPONG_TRIPS = 200000 };

static double now_s(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

static void pin(int cpu) { cpu_set_t set; CPU_ZERO(&set); CPU_SET(cpu, &set); sched_setaffinity(0, sizeof set, &set); }

/* Independent vector chains: the FMA pipes are the limit. FMA_SETUP declares them, FMA_STEPS
 * advances each once (the asm keeps them in registers and the loop from being folded). */
typedef double vec4 __attribute__((vector_size(32)));
#define FMA_SETUP                                                                                      \
    vec4 a0 = {0}, a1 = a0 + 1, a2 = a0 + 2, a3 = a0 + 3, a4 = a0 + 4, a5 = a0 + 5, a6 = a0 + 6, a7 = a0 + 7, \
         a8 = a0 + 8, a9 = a0 + 9, a10 = a0 + 10, a11 = a0 + 11;                                      \
    const vec4 mul = a0 + 0.999999, add = a0 + 1e-7
#define STEP(a) a = a * mul + add
#define FMA_STEPS                                                                                      \
    STEP(a0); STEP(a1); STEP(a2); STEP(a3); STEP(a4); STEP(a5); STEP(a6); STEP(a7); STEP(a8); STEP(a9);  \
    STEP(a10); STEP(a11);                                                                              \
    __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6), "+x"(a7), \
                          "+x"(a8), "+x"(a9), "+x"(a10), "+x"(a11))
#define FMA_SINK                                                                                       \
    do { vec4 sum = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;                        \
         if (sum[0] == 12345.0) puts(""); } while (0)

/* GFLOP/s of FMA_ITERS steps. */
static double fma_loop(void)
{
    FMA_SETUP;
    double start = now_s();
    for (long i = 0; i < FMA_ITERS; i++) { FMA_STEPS; }
    double seconds = now_s() - start;
    FMA_SINK;
    return 2.0 * FMA_CHAINS * 4 * FMA_ITERS / seconds * 1e-9;
}

/* One dependent chain: latency is the limit. Prints giga-adds/s. */
static double chain_loop(void)
{
    long x = 1;
    double start = now_s();
    for (long i = 0; i < CHAIN_ITERS; i++) { x += i ^ x; __asm__ volatile("" : "+r"(x)); }
    double seconds = now_s() - start;
    if (x == 42) puts("");
    return CHAIN_ITERS / seconds * 1e-9;
}

static _Atomic int flag;
static void *ponger(void *arg)
{
    pin(1);
    for (int i = 0; i < PINGPONG_TRIPS; i++) {
        while (atomic_load_explicit(&flag, memory_order_acquire) != 1) { }
        atomic_store_explicit(&flag, 0, memory_order_release);
    }
    return arg;
}

/* Median round trip in microseconds over batches of 1000 trips. */
static double pingpong(void)
{
    pthread_t thread;
    pin(0);
    pthread_create(&thread, NULL, ponger, NULL);
    enum { BATCH = 1000 };
    double batches[PINGPONG_TRIPS / BATCH];
    for (int b = 0; b < PINGPONG_TRIPS / BATCH; b++) {
        double start = now_s();
        for (int i = 0; i < BATCH; i++) {
            atomic_store_explicit(&flag, 1, memory_order_release);
            while (atomic_load_explicit(&flag, memory_order_acquire) != 0) { }
        }
        batches[b] = (now_s() - start) / BATCH * 1e6;
    }
    pthread_join(thread, NULL);
    int n = PINGPONG_TRIPS / BATCH;
    for (int i = 1; i < n; i++)   /* insertion sort: small n */
        for (int j = i; j > 0 && batches[j - 1] > batches[j]; j--) { double t = batches[j]; batches[j] = batches[j - 1]; batches[j - 1] = t; }
    return batches[n / 2];
}

/* Handoff: HANDOFF_BYTES written by CPU 0 and then read by CPU 1 (the other side of a runtime's
 * step boundary: one thread's output is the next step's input on the other), against written and
 * read by CPU 0 alone. Median microseconds per handoff over HANDOFF_ROUNDS; a spinning flag orders
 * them, as a barrier does. */
enum { HANDOFF_BYTES = 512 * 1024, HANDOFF_ROUNDS = 400 };
static float *handoff_data;
static _Atomic int handoff_turn;
static void handoff_write(int round)
{
    for (long i = 0; i < HANDOFF_BYTES / 4; i++) handoff_data[i] = (float)(round + i);
}
static float handoff_read(void)
{
    float sum = 0;
    for (long i = 0; i < HANDOFF_BYTES / 4; i += 16) sum += handoff_data[i];   /* one float per line */
    return sum;
}
static void *handoff_reader(void *arg)
{
    pin(1);
    float sum = 0;
    for (int r = 0; r < HANDOFF_ROUNDS; r++) {
        while (atomic_load_explicit(&handoff_turn, memory_order_acquire) != 1) { }
        sum += handoff_read();
        atomic_store_explicit(&handoff_turn, 0, memory_order_release);
    }
    *(float *)arg = sum;
    return NULL;
}
static int compare_doubles(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }
static void handoff(void)
{
    static double same[HANDOFF_ROUNDS], cross[HANDOFF_ROUNDS];
    handoff_data = (float *)aligned_alloc(64, HANDOFF_BYTES);
    pin(0);
    float sum = 0, other = 0;
    for (int r = 0; r < HANDOFF_ROUNDS; r++) {
        double start = now_s();
        handoff_write(r);
        sum += handoff_read();
        same[r] = (now_s() - start) * 1e6;
    }
    pthread_t thread;
    atomic_store(&handoff_turn, 0);
    pthread_create(&thread, NULL, handoff_reader, &other);
    for (int r = 0; r < HANDOFF_ROUNDS; r++) {
        double start = now_s();
        handoff_write(r);
        atomic_store_explicit(&handoff_turn, 1, memory_order_release);
        while (atomic_load_explicit(&handoff_turn, memory_order_acquire) != 0) { }
        cross[r] = (now_s() - start) * 1e6;
    }
    pthread_join(thread, NULL);
    qsort(same, HANDOFF_ROUNDS, sizeof(double), compare_doubles);
    qsort(cross, HANDOFF_ROUNDS, sizeof(double), compare_doubles);
    printf("%.3f %.3f\n", same[HANDOFF_ROUNDS / 2], cross[HANDOFF_ROUNDS / 2]);
    if (sum + other == 12345.0f) puts("");
    free(handoff_data);
}

/* The FMA loop for `seconds`, one GFLOP/s figure per 100 ms window: how steady the core is. */
static void fma_windows(double seconds)
{
    FMA_SETUP;
    double start = now_s(), window_start = start;
    long iters = 0;
    for (;;) {
        for (int i = 0; i < 10000; i++) { FMA_STEPS; }
        iters += 10000;
        double t = now_s();
        if (t - window_start >= 0.1) {
            printf("%.4f\n", 2.0 * FMA_CHAINS * 4 * iters / (t - window_start) * 1e-9);
            iters = 0;
            window_start = t;
        }
        if (t - start >= seconds) break;
    }
    FMA_SINK;
}

int main(int argc, char **argv)
{
    if (argc < 2) return 2;
    if (!strcmp(argv[1], "pingpong")) { printf("%.4f\n", pingpong()); return 0; }
    if (!strcmp(argv[1], "handoff")) { handoff(); return 0; }
    pin(argc > 2 ? atoi(argv[2]) : 0);
    if (!strcmp(argv[1], "fma_windows")) { fma_windows(argc > 3 ? atof(argv[3]) : 5.0); return 0; }
    printf("%.4f\n", !strcmp(argv[1], "fma") ? fma_loop() : chain_loop());
    return 0;
}
"""


def run_copies(exe: Path, probe: str, cpus: list[int]) -> list[float]:
    """Start one copy of `probe` per CPU at once; their rates, in CPU order."""
    procs = [subprocess.Popen([str(exe), probe, str(cpu)], stdout=subprocess.PIPE, text=True) for cpu in cpus]
    rates = []
    for proc in procs:
        out, _ = proc.communicate()
        if proc.returncode:
            raise SystemExit(f"error: probe {probe} exited {proc.returncode}")
        rates.append(float(out))
    return rates


def sustained(exe: Path, seconds: float) -> dict:
    """The FMA probe for `seconds`, alone on CPU 0 and then one copy per CPU: the spread of its
    100 ms windows. A steady core keeps every window near the best; a core whose time a
    neighbour takes (the host's other hyperthread, another tenant) drops in some windows."""
    def windows(cpus):
        procs = [subprocess.Popen([str(exe), "fma_windows", str(cpu), str(seconds)], stdout=subprocess.PIPE, text=True)
                 for cpu in cpus]
        rates = []
        for proc in procs:
            rates += [float(x) for x in proc.communicate()[0].split()]
        return sorted(rates)

    def spread(rates):
        best = rates[-1]
        return {"best_gflops": best, "p10_of_best": round(rates[len(rates) // 10] / best, 3),
                "median_of_best": round(statistics.median(rates) / best, 3), "min_of_best": round(rates[0] / best, 3),
                "windows": len(rates)}
    return {"seconds": seconds, "alone": spread(windows([0])), "both": spread(windows([0, 1]))}


# A handoff of 512 KiB to the other CPU costs ~3.5-4.5x writing and reading it on one CPU while the
# two vCPUs share a last-level cache, ~13-15x while they do not, and ~1.0x while they are one core's
# two hyperthreads (same L1 and L2) (the project's Zen 4 VMs): the cuts between them are judgement.
HANDOFF_SEPARATE_CACHES_RATIO = 8.0
HANDOFF_ONE_CORE_RATIO = 1.5
CACHE_STATES = ("one core", "shared cache", "separate caches")


def cache_state(handoff_ratio: float) -> str:
    """Where data one vCPU wrote is when the other reads it (CACHE_STATES), from the handoff ratio."""
    if handoff_ratio < HANDOFF_ONE_CORE_RATIO:
        return CACHE_STATES[0]
    return CACHE_STATES[2] if handoff_ratio > HANDOFF_SEPARATE_CACHES_RATIO else CACHE_STATES[1]


def verdict(fma_ratio: float, chain_ratio: float, pingpong_us: float, handoff_ratio: float | None = None) -> str:
    state = cache_state(handoff_ratio) if handoff_ratio is not None else None
    if fma_ratio > 0.85 and chain_ratio > 0.85 and pingpong_us < 5:
        return {"separate caches": "separate cores, separate caches",
                "one core": "SMT siblings (share caches)"}.get(state, "separate cores")
    if chain_ratio > 0.85 and fma_ratio < 0.7:
        return "SMT siblings (share FMA units, not latency)"
    if chain_ratio < 0.7 and fma_ratio < 0.7:
        return "time-sliced (the two vCPUs take turns on one core)"
    return "mixed"


def handoff(exe: Path) -> dict:
    """One handoff probe (about 40 ms): microseconds on one CPU and across, their ratio, the state."""
    out = subprocess.run([str(exe), "handoff"], capture_output=True, text=True, check=True, timeout=600)
    same_us, other_us = (float(x) for x in out.stdout.split())
    return {"handoff_same_cpu_us": same_us, "handoff_other_cpu_us": other_us,
            "handoff_ratio": round(other_us / same_us, 2), "state": cache_state(other_us / same_us)}


def in_state(exe: Path, timed, wanted: str = "shared cache", tries: int = 30, pause_s: float = 2.0, say=None):
    """Run `timed()` between two handoff probes until both saw the `wanted` cache state (at most
    `tries` times, `pause_s` apart: the state changes within tens of seconds). Returns (the last
    result, attempts, whether the last one was in the state): a multi-thread timing taken while
    the two vCPUs shared no cache measures the host, not the code."""
    for attempt in range(1, tries + 1):
        before = handoff(exe)
        result = timed()
        after = handoff(exe)
        if before["state"] == after["state"] == wanted:
            return result, attempt, True
        if say:
            say(f"cpu state {before['state']} -> {after['state']}, not {wanted}: timing again "
                f"({attempt}/{tries})")
        if attempt < tries:
            time.sleep(pause_s)
    return result, tries, False


def build_probe(directory: Path) -> Path:
    """Compile the probes into `directory`; the executable's path."""
    exe = Path(directory) / "cpu_share_probe"
    source = Path(directory) / "cpu_share_probe.c"
    source.write_text(SOURCE)
    subprocess.run(["gcc", "-O2", "-march=native", "-pthread", str(source), "-o", str(exe)], check=True)
    return exe


def measure(exe: Path) -> dict:
    """One round of the three probes (about a second): rates, ratios and the verdict."""
    fma_alone = run_copies(exe, "fma", [0])[0]
    fma_both = run_copies(exe, "fma", [0, 1])
    chain_alone = run_copies(exe, "chain", [0])[0]
    chain_both = run_copies(exe, "chain", [0, 1])
    out = subprocess.run([str(exe), "pingpong"], capture_output=True, text=True, check=True, timeout=600)
    pingpong_us = float(out.stdout)
    probe = handoff(exe)
    fma_ratio = min(fma_both) / fma_alone
    chain_ratio = min(chain_both) / chain_alone
    return {"time_utc": time.strftime("%H:%M:%S", time.gmtime()),
            "fma_alone_gflops": fma_alone, "fma_both_gflops": fma_both, "fma_ratio": round(fma_ratio, 3),
            "chain_alone_gops": chain_alone, "chain_both_gops": chain_both,
            "chain_ratio": round(chain_ratio, 3), "pingpong_roundtrip_us": pingpong_us,
            **{k: v for k, v in probe.items() if k != "state"},
            "verdict": verdict(fma_ratio, chain_ratio, pingpong_us, probe["handoff_ratio"])}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pause-s", type=float, default=2.0, help="seconds between rounds (the state can change)")
    parser.add_argument("--sustain-s", type=float, default=5.0,
                        help="seconds of the sustained FMA probe, alone and two at once (0: skip)")
    parser.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--out-name", default="cpu_share.json", help="file name of the JSON under --results")
    args = parser.parse_args(argv)
    if (os.cpu_count() or 1) < 2:
        print("error: this probe needs two CPUs", file=sys.stderr)
        return 2
    warn_if_loaded()
    rows = []
    with tempfile.TemporaryDirectory(prefix="xfc-cpu-share-") as tmp:
        exe = build_probe(Path(tmp))
        print(f"{'round':>5} {'fma alone':>10} {'fma x2':>14} {'chain alone':>12} {'chain x2':>14} "
              f"{'pingpong us':>12} {'handoff x':>9}  verdict")
        for round_index in range(args.rounds):
            if round_index:
                time.sleep(args.pause_s)
            row = {"round": round_index, **measure(exe)}
            rows.append(row)
            print(f"{round_index:>5} {row['fma_alone_gflops']:>10.1f} {row['fma_both_gflops'][0]:>6.1f} "
                  f"{row['fma_both_gflops'][1]:>6.1f}  {row['chain_alone_gops']:>12.2f} "
                  f"{row['chain_both_gops'][0]:>6.2f} {row['chain_both_gops'][1]:>6.2f}  "
                  f"{row['pingpong_roundtrip_us']:>12.3f} {row['handoff_ratio']:>9.1f}  {row['verdict']}", flush=True)
        steady = sustained(exe, args.sustain_s) if args.sustain_s > 0 else None
        if steady:
            for label in ("alone", "both"):
                w = steady[label]
                print(f"sustained {args.sustain_s:g} s, {label:5s}: best {w['best_gflops']:.1f} GFLOP/s per copy; of the "
                      f"best, 100 ms windows at p10 {w['p10_of_best']:.2f}, median {w['median_of_best']:.2f}, "
                      f"min {w['min_of_best']:.2f}")
    ratios = {"fma_ratio_median": statistics.median(r["fma_ratio"] for r in rows),
              "chain_ratio_median": statistics.median(r["chain_ratio"] for r in rows),
              "pingpong_us_median": statistics.median(r["pingpong_roundtrip_us"] for r in rows),
              "handoff_ratio_median": statistics.median(r["handoff_ratio"] for r in rows),
              "handoff_ratio_max": max(r["handoff_ratio"] for r in rows)}
    print(json.dumps(ratios))
    write_json_result(args.results / args.out_name, {
        "command": "benchmarks/cpu_share.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine_facts(), "rounds": rows, "summary": ratios, "sustained": steady}, kind="cpu-share")
    return 0


if __name__ == "__main__":
    sys.exit(main())
