#!/usr/bin/env python3
"""Whole networks against onnxruntime, round by round, with the machine's state beside every round
(issue 32's thread-count targets on a VM whose CPUs change under it; not run in CI):

    .venv/bin/python benchmarks/net_states.py --net mobilenet_v2 --threads 1,2 --rounds 24
    .venv/bin/python benchmarks/net_states.py --net all --threads 1,2 --rounds 12 --out-name net_states_all.json

Emits the network once per thread count (`xfc model NET.onnx --hw host --threads T --emit lib
--verify`: the library, its benchmark program, and the network checked against onnxruntime) and
then, per round and thread count: benchmarks/cpu_share.py's pingpong and handoff probes, the benchmark program (its own
C loop, --runs runs after 3 warm-ups, the same input file every round), onnxruntime's session.run on
the same input (as `xfc model --bench` runs it: xfc.model.runtime.bench.time_onnxruntime, same
warm-up and runs) and the probes again. A round is filed under the state both its probes saw
(cpu_share.cache_state: "one core" when a 512 KiB handoff to the other CPU costs what it costs on
one CPU, "shared cache", "separate caches"), or under "changed" when the probes disagree (left out
of the per-state rows; the row of state "any" takes every round).

Per network, state and thread count: rounds, the medians of xfc's and onnxruntime's round medians,
and their ratio (onnxruntime / xfc, > 1: xfc is faster). With several networks (a comma-separated
list, or `all`: every network of benchmarks/nets.py) each round times every network in turn, and
per state and thread count the summary gives issue 32's figures over the networks that have rounds in
that state: the geometric mean of their ratios and the lowest (a state some network never met is
named with the networks it lacks). benchmarks/net_bench.py gives the figure over whatever states its
three rounds fell in; this tool says what each state contributes. Writes
benchmarks/results/net_states_<net>.json (net_states.json for several; machine named; --out-name for
another name) and a table. With --steps every xfc round also times each step (the program's
--profile, after the timed runs), and per network and thread count the steps that differ most between
its shared-cache and separate-cache rounds are listed (`steps_by_state` in the JSON). Needs torch
(`make bench-setup`).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx

import cpu_share
from machine import machine_facts, warn_if_loaded
from nets import ALL, export, networks_or_status

from xfc.model.runtime.bench import time_onnxruntime
from xfc.outputs import write_json_result

REPO = Path(__file__).resolve().parent.parent
STATES = cpu_share.CACHE_STATES
ANY_STATE = "any"   # every round, whatever its probes saw ("changed" included): what net_bench.py's rounds are


def emit_and_build(model: Path, threads: int, out: Path) -> tuple[Path, Path]:
    """The benchmark program and weights file of the network emitted for `threads` threads: `xfc
    model --emit lib --verify` builds the program (as --bench does) and checks the network with it
    against onnxruntime before anything is timed."""
    argv = [sys.executable, "-m", "xfc", "model", str(model), "--hw", "host", "--threads", str(threads),
            "--emit", "lib", "--verify", "-o", str(out), "--force", "--json"]
    print(f"[net-states] xfc model {' '.join(argv[4:])}", file=sys.stderr, flush=True)
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=str(REPO))
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-3000:])
        raise SystemExit(proc.returncode)
    manifest = json.loads((out / "manifest.json").read_text())
    return out / manifest["benchmark"]["program"], out / manifest["weights"]["file"]


def probe(exe: Path) -> dict:
    ping = float(subprocess.run([str(exe), "pingpong"], capture_output=True, text=True, check=True).stdout)
    return {"pingpong_us": ping, **cpu_share.handoff(exe)}


def state_of(before: dict, after: dict) -> str:
    return before["state"] if before["state"] == after["state"] else "changed"


def xfc_round(exe: Path, weights: Path, input_file: Path, threads: int, runs: int,
              steps: bool = False) -> tuple[float, list | None]:
    """The program's median ms over `runs` runs and, with steps, each step's median ms over as many
    runs more with the program's --profile (after the timed ones, which run without it)."""
    out = subprocess.run([str(exe), "--weights", str(weights), "--input", str(input_file), "--warmup", "3",
                          "--runs", str(runs), "--threads", str(threads), *(["--profile"] if steps else [])],
                         capture_output=True, text=True, check=True)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    return float(report["median_ms"]), report.get("steps_ms") if steps else None


STEPS_SHOWN = 12


def steps_by_state(rounds: list[dict], labels: dict) -> list[dict]:
    """--steps: per network and thread count with rounds in both the shared-cache and the separate-cache
    state, each step's median ms in either and the STEPS_SHOWN steps that differ most, by how much."""
    out = []
    for key in sorted({(r["net"], r["threads"]) for r in rounds if r.get("steps_ms")}):
        per = {state: [r["steps_ms"] for r in rounds if (r["net"], r["threads"]) == key and r["state"] == state
                       and r.get("steps_ms")] for state in ("shared cache", "separate caches")}
        if not all(per.values()):
            continue
        medians = {state: [statistics.median(run[i] for run in runs) for i in range(len(runs[0]))]
                   for state, runs in per.items()}
        shared, separate = medians["shared cache"], medians["separate caches"]
        worst = sorted(range(len(shared)), key=lambda i: shared[i] - separate[i])[:STEPS_SHOWN]
        out.append({"net": key[0], "threads": key[1], "rounds": {s: len(v) for s, v in per.items()},
                    "steps_sum_ms": {"shared cache": round(sum(shared), 4), "separate caches": round(sum(separate), 4)},
                    "steps": [{"step": i, "what": labels[key][i], "shared_cache_ms": round(shared[i], 4),
                               "separate_caches_ms": round(separate[i], 4)} for i in worst]})
    return out


def step_labels(program_dir: Path) -> list[str]:
    """What each step of an emitted network runs (its manifest): the op, or the kernel's layer."""
    steps = json.loads((program_dir / "manifest.json").read_text())["steps"]
    return [f"{s['op']}" + (f" {s['spec']}" + (f" x{s['groups']} groups" if s.get("groups", 1) > 1 else "")
                            if s["kind"] == "kernel" else "") for s in steps]


def ort_round(loaded, feeds: dict, threads: int, runs: int) -> float:
    """onnxruntime's median ms over `runs` session.run calls, set up as `xfc model --bench` sets it up."""
    samples, _ = time_onnxruntime(loaded, feeds, threads=threads, warmup=3, runs=runs)
    return statistics.median(samples) * 1e3


def summarize(rounds: list[dict], thread_counts: list[int], nets: list[str]) -> list[dict]:
    """Per network, thread count and state: rounds, medians of the round medians, their ratio."""
    rows = []
    for net in nets:
        for threads in thread_counts:
            for state in (*STATES, ANY_STATE):
                picked = [r for r in rounds if r["net"] == net and r["threads"] == threads
                          and state in (r["state"], ANY_STATE)]
                if not picked:
                    continue
                xfc_ms = statistics.median(r["xfc_ms"] for r in picked)
                ort_ms = statistics.median(r["onnxruntime_ms"] for r in picked)
                rows.append({"net": net, "threads": threads, "state": state, "rounds": len(picked),
                             "xfc_median_ms": round(xfc_ms, 4), "onnxruntime_median_ms": round(ort_ms, 4),
                             "speedup": round(ort_ms / xfc_ms, 4),
                             "speedup_per_round_median": round(statistics.median(
                                 r["onnxruntime_ms"] / r["xfc_ms"] for r in picked), 4)})
    return rows


def across_networks(summary: list[dict], thread_counts: list[int], nets: list[str]) -> list[dict]:
    """Per thread count and state: the geometric mean and the lowest of the networks' ratios in that
    state (issue 32's two figures), over the networks with rounds in it; the others are named."""
    rows = []
    for threads in thread_counts:
        for state in (*STATES, ANY_STATE):
            found = {s["net"]: s for s in summary if s["threads"] == threads and s["state"] == state}
            if not found:
                continue
            ratios = [found[n]["speedup"] for n in nets if n in found]
            paired = [found[n]["speedup_per_round_median"] for n in nets if n in found]
            lowest = min(found.values(), key=lambda s: s["speedup"])
            lowest_paired = min(found.values(), key=lambda s: s["speedup_per_round_median"])
            rows.append({"threads": threads, "state": state, "networks": len(found),
                         "missing": [n for n in nets if n not in found],
                         "rounds": sum(s["rounds"] for s in found.values()),
                         "geomean_speedup": round(geomean(ratios), 4),
                         "min_speedup": lowest["speedup"], "min_net": lowest["net"],
                         # the same from each network's median of its per-round ratios (each round pairs
                         # the two runtimes minutes apart at most; the medians of medians can pair a
                         # round of one state with a round of another when the state changed often)
                         "geomean_speedup_per_round": round(geomean(paired), 4),
                         "min_speedup_per_round": lowest_paired["speedup_per_round_median"],
                         "min_net_per_round": lowest_paired["net"]})
    return rows


def geomean(values) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def report(rounds: list[dict], thread_counts: list[int], nets: list[str]) -> tuple[list[dict], list[dict]]:
    """The summaries (summarize, across_networks), printed as tables."""
    summary = summarize(rounds, thread_counts, nets)
    print(f"\n{'network':14s} {'threads':>7} {'state':16s} {'rounds':>6} {'xfc ms':>8} {'ort ms':>8} {'ort/xfc':>7}")
    for s in summary:
        print(f"{s['net']:14s} {s['threads']:>7} {s['state']:16s} {s['rounds']:>6} {s['xfc_median_ms']:>8.3f} "
              f"{s['onnxruntime_median_ms']:>8.3f} {s['speedup']:>7.3f}")
    overall = across_networks(summary, thread_counts, nets) if len(nets) > 1 else []
    if overall:
        print(f"\n{'threads':>7} {'state':16s} {'networks':>8} {'geomean':>8} {'lowest':>7} {'paired':>7} "
              f"{'lowest':>7}  (lowest network; missing)")
        for o in overall:
            print(f"{o['threads']:>7} {o['state']:16s} {o['networks']:>8} {o['geomean_speedup']:>8.3f} "
                  f"{o['min_speedup']:>7.3f} {o['geomean_speedup_per_round']:>7.3f} {o['min_speedup_per_round']:>7.3f}  "
                  f"({o['min_net']}{'; missing ' + ', '.join(o['missing']) if o['missing'] else ''})")
    return summary, overall


def resummarize(path: Path) -> int:
    """--summarize FILE: the summaries of a file this tool wrote, computed again from its rounds (and
    written back), e.g. after a statistic was added."""
    data = json.loads(path.read_text())
    if data.get("xfc_output", {}).get("kind") != "net-states" or "rounds" not in data:
        print(f"net_states: {path}: not a file net_states.py wrote", file=sys.stderr)
        return 2
    nets = data.get("nets") or [data["net"]]
    for r in data["rounds"]:
        r.setdefault("net", nets[0])
    thread_counts = sorted({r["threads"] for r in data["rounds"]})
    data["summary"], data["across_networks"] = report(data["rounds"], thread_counts, nets)
    data["summarized_again_by"] = f"benchmarks/net_states.py --summarize {path.name}"
    write_json_result(path, {k: v for k, v in data.items() if k != "xfc_output"}, kind="net-states")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--net", default="mobilenet_v2",
                        help=f"comma-separated, of {', '.join(ALL)}; or all")
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--runs", type=int, default=30, help="timed runs per round and side")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--out-name", default=None,
                        help="file name under --results (default net_states_<net>.json, net_states.json for several)")
    parser.add_argument("--steps", action="store_true",
                        help="also time every step of xfc's program each round (its --profile, after the timed runs) "
                             "and list the steps that differ most between the shared-cache and separate-cache rounds")
    parser.add_argument("--summarize", type=Path, metavar="FILE",
                        help="time nothing: compute the summaries of FILE (written by this tool) again from its rounds")
    args = parser.parse_args(argv)
    if args.summarize:
        return resummarize(args.summarize)
    nets = networks_or_status("net_states", ",".join(ALL) if args.net.strip() == "all" else args.net)
    if isinstance(nets, int):
        return nets
    if not nets:
        print("net_states: --net names no network", file=sys.stderr)
        return 2
    try:
        thread_counts = [int(t) for t in args.threads.split(",") if t.strip()]
    except ValueError:
        thread_counts = []
    if not thread_counts or min(thread_counts) < 1 or args.rounds < 1 or args.runs < 1:
        print(f"net_states: --threads must list positive integers ('{args.threads}'), --rounds and --runs be >= 1",
              file=sys.stderr)
        return 2
    warn_if_loaded()
    rounds = []
    with tempfile.TemporaryDirectory(prefix="xfc-net-states-") as tmp_name:
        tmp = Path(tmp_name)
        probe_exe = cpu_share.build_probe(tmp)
        x = np.random.default_rng(0).uniform(-1, 1, (1, 3, args.size, args.size)).astype(np.float32)
        input_file = tmp / "input.f32"
        x.tofile(input_file)
        setups = {}
        for net in nets:
            model = tmp / f"{net}.onnx"
            export(net, model, args.size)
            loaded = SimpleNamespace(model=onnx.load(str(model)), path=model)   # what time_onnxruntime reads
            setups[net] = {"programs": {t: emit_and_build(model, t, tmp / f"{net}-t{t}") for t in thread_counts},
                           "loaded": loaded, "feeds": {loaded.model.graph.input[0].name: x}}
        print(f"{'round':>5} {'network':14s} {'threads':>7} {'xfc ms':>8} {'ort ms':>8} {'ort/xfc':>7} "
              f"{'handoff x':>10}  state")
        for index in range(args.rounds):
            for net in nets:
                setup = setups[net]
                for threads in thread_counts:
                    exe, weights = setup["programs"][threads]
                    before = probe(probe_exe)
                    xfc_ms, steps_ms = xfc_round(exe, weights, input_file, threads, args.runs, args.steps)
                    ort_ms = ort_round(setup["loaded"], setup["feeds"], threads, args.runs)
                    after = probe(probe_exe)
                    row = {"round": index, "net": net, "threads": threads, "xfc_ms": xfc_ms, "onnxruntime_ms": ort_ms,
                           "probe_before": before, "probe_after": after, "state": state_of(before, after),
                           "time_utc": time.strftime("%H:%M:%S", time.gmtime())}
                    if steps_ms is not None:
                        row["steps_ms"] = steps_ms
                    rounds.append(row)
                    print(f"{index:>5} {net:14s} {threads:>7} {xfc_ms:>8.3f} {ort_ms:>8.3f} {ort_ms / xfc_ms:>7.3f} "
                          f"{before['handoff_ratio']:>4.1f}/{after['handoff_ratio']:<5.1f}  {row['state']}", flush=True)
        labels = {(net, t): step_labels(tmp / f"{net}-t{t}") for net in nets for t in thread_counts}
    summary, overall = report(rounds, thread_counts, nets)
    by_state = steps_by_state(rounds, labels) if args.steps else []
    for block in by_state:
        print(f"\n{block['net']} at {block['threads']} thread(s), steps in ms, shared cache / separate caches "
              f"(rounds {block['rounds']['shared cache']} / {block['rounds']['separate caches']}; all steps "
              f"{block['steps_sum_ms']['shared cache']:.3f} / {block['steps_sum_ms']['separate caches']:.3f}):")
        for st in block["steps"]:
            print(f"  {st['step']:4d} {st['shared_cache_ms']:8.3f} {st['separate_caches_ms']:8.3f}  {st['what'][:100]}")
    default_name = f"net_states_{nets[0]}.json" if len(nets) == 1 else "net_states.json"
    write_json_result(args.results / (args.out_name or default_name), {
        "command": "benchmarks/net_states.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine_facts(), "nets": nets, "size": args.size, "runs_per_round": args.runs,
        "handoff_ratio_cuts": {"one_core_below": cpu_share.HANDOFF_ONE_CORE_RATIO,
                               "separate_caches_above": cpu_share.HANDOFF_SEPARATE_CACHES_RATIO},
        "summary": summary, "across_networks": overall, "steps_by_state": by_state, "rounds": rounds},
        kind="net-states")
    return 0


if __name__ == "__main__":
    sys.exit(main())
