#!/usr/bin/env python3
"""What calling xfc from Python costs on top of C (issue 32 item 5; not run in CI).

1. A kernel: `kernel(a, b)` / `kernel.run_packed(a, packed)` of xfc.compile (one C call on the
   arrays themselves) timed with perf_counter around each call in a loop, against the same kernel's
   median timed inside C (kernel.time: the library's own bench loop), 512 x 512 x 512 matmul.
2. A network: `net(x)` of xfc.compile_model against the same network's benchmark program (its own
   C timing loop), on the families of tests/support/nets.py or an ONNX file.

On a shared machine the load changes within seconds, so the two sides are paired closely: a kernel's
tight loops alternate in blocks (runs calls timed in C, runs Python calls), and a network's ROUNDS short
rounds alternate (the program's median, then the Python calls' median); the overhead is the median
of the paired ratios python / C, minus 1. Writes benchmarks/results/python_overhead.json (--out-name; machine
named). The minima of both sides are reported too: on a loaded machine they are the runs nothing
interrupted, and their ratio is the overhead a quiet machine would show.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from machine import machine_facts

REPO = Path(__file__).resolve().parent.parent
ROUNDS = 15


def python_times(call, runs: int, warmup: int = 3) -> tuple[float, float]:
    """(median, minimum) milliseconds of runs calls."""
    samples = _python_block(call, runs, warmup)
    return statistics.median(samples), min(samples)


KERNEL_BLOCKS = 12


def _python_block(call, runs: int, warmup: int = 3) -> list[float]:
    """Milliseconds of `runs` back-to-back calls (after warmup), as an app's loop makes them."""
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        call()
        samples.append((time.perf_counter() - t) * 1e3)
    return samples


def kernel_overhead(m: int, n: int, k: int, threads: int, runs: int) -> dict:
    """The Python call against the C-timed median, both as tight loops: KERNEL_BLOCKS blocks alternate
    kernel.time (runs calls timed inside C, the library's bench entry) and runs Python calls timed with
    perf_counter; overhead = the median of the per-block ratios of medians, minus 1."""
    import xfc
    hw = xfc.load_hardware("host")
    spec = xfc.make_spec("matmul", {"m": m, "n": n, "k": k})
    kernel = xfc.compile(spec, hw, threads=threads)
    rng = np.random.default_rng(0)
    a, b = (rng.uniform(-1, 1, size=s).astype(np.float32) for s in spec.operand_shapes[:2])
    packed = kernel.host.prepack(b)
    sides = {"c": [], "python": [], "c_packed": [], "python_packed": []}
    for _ in range(KERNEL_BLOCKS):
        sides["c"].append([s * 1e3 for s in kernel.host.time(a, b, repeats=runs, warmup=3).samples_s])
        sides["python"].append(_python_block(lambda: kernel(a, b), runs))
        sides["c_packed"].append([s * 1e3 for s in kernel.host.time(a, b, repeats=runs, warmup=3,
                                                                    prepacked=True).samples_s])
        sides["python_packed"].append(_python_block(lambda: kernel.host.run_packed(a, packed), runs))
    med = {side: [statistics.median(block) for block in blocks] for side, blocks in sides.items()}
    every = {side: [x for block in blocks for x in block] for side, blocks in sides.items()}
    ratio = statistics.median(p / c for p, c in zip(med["python"], med["c"]))
    ratio_packed = statistics.median(p / c for p, c in zip(med["python_packed"], med["c_packed"]))
    return {"spec": spec.describe(), "threads": threads, "runs_per_block": runs, "blocks": KERNEL_BLOCKS,
            "c_median_ms": statistics.median(every["c"]), "python_median_ms": statistics.median(every["python"]),
            "overhead": ratio - 1,
            "c_packed_median_ms": statistics.median(every["c_packed"]),
            "python_run_packed_median_ms": statistics.median(every["python_packed"]), "packed_overhead": ratio_packed - 1,
            "c_min_ms": min(every["c"]), "python_min_ms": min(every["python"]),
            "min_overhead": min(every["python"]) / min(every["c"]) - 1,
            "c_packed_min_ms": min(every["c_packed"]), "python_run_packed_min_ms": min(every["python_packed"]),
            "packed_min_overhead": min(every["python_packed"]) / min(every["c_packed"]) - 1,
            "block_medians_ms": med,
            "how": "tight loops, alternating blocks: runs calls timed inside C (kernel.time, the library's bench "
                   "entry), then runs Python calls timed with perf_counter; overhead = median of the per-block "
                   "ratios of medians - 1"}


def network_overhead(name: str, model, threads: int, runs: int) -> dict:
    import onnx
    import xfc
    with tempfile.TemporaryDirectory(prefix="xfc-py-overhead-") as tmp:
        tmp = Path(tmp)
        path = tmp / f"{name}.onnx"
        onnx.save(model, str(path))
        out = tmp / "lib"
        proc = subprocess.run([sys.executable, "-m", "xfc", "model", str(path), "--hw", "host", "--emit", "lib",
                               "--bench", "--repeat", "1", "--threads", str(threads), "--json", "-o", str(out)],
                              capture_output=True, text=True, cwd=str(REPO))
        if proc.returncode:
            raise SystemExit(proc.stderr[-2000:])
        report = json.loads(proc.stdout)
        program, weights = out / report["library"]["benchmark_program"], out / report["library"]["weights"]
        net = xfc.compile_model(path, threads=threads)
        env = None   # the program and this process share the OpenMP defaults (OMP_WAIT_POLICY as inherited)
        (inp_name, shape), = net.inputs
        x = np.random.default_rng(0).uniform(-1, 1, size=shape).astype(np.float32)
        x.tofile(tmp / "x.f32")
        c_ms, py_ms, c_min, py_min = [], [], [], []
        for _ in range(ROUNDS):
            line = subprocess.run([str(program), "--weights", str(weights), "--input", str(tmp / "x.f32"),
                                   "--runs", str(runs), "--warmup", "3", "--threads", str(threads)],
                                  capture_output=True, text=True, check=True, env=env).stdout
            c_ms.append(json.loads(line)["median_ms"])
            c_min.append(json.loads(line)["min_ms"])
            median, minimum = python_times(lambda: net(x), runs)
            py_ms.append(median)
            py_min.append(minimum)
        net.close()
    ratio = statistics.median(p / q for p, q in zip(py_ms, c_ms))
    return {"network": name, "threads": threads, "runs": runs, "rounds": ROUNDS, "c_median_ms": statistics.median(c_ms),
            "python_median_ms": statistics.median(py_ms), "overhead": ratio - 1,
            "c_min_ms": min(c_min), "python_min_ms": min(py_min), "min_overhead": min(py_min) / min(c_min) - 1,
            "round_medians_ms": {"c": c_ms, "python": py_ms},
            "how": "alternating short rounds: the benchmark program's median, then the Python calls' median; "
                   "overhead = median of the paired round ratios - 1"}


def call_cost_us(samples: int = 3000) -> dict:
    """What HostNetwork.__call__ adds to its one C call (checking the inputs, allocating the outputs,
    ctypes), on a network so small that the C call itself is microseconds: paired samples of the call
    and of the bare ctypes call on the same buffers, in this process (robust to load)."""
    import xfc
    from support import nets as model_nets
    net = xfc.compile_model(model_nets.resnet_net(blocks=1, hw=7), threads=1)
    x = np.random.default_rng(0).uniform(-1, 1, size=net.inputs[0][1]).astype(np.float32)
    net(x)   # binds the pointer arrays the bare call reuses
    bare, full = [], []
    for _ in range(samples):
        t = time.perf_counter()
        net._run(net._handle, net._in_ptrs, net._out_ptrs)
        bare.append(time.perf_counter() - t)
        t = time.perf_counter()
        net(x)
        full.append(time.perf_counter() - t)
    net.close()
    return {"bare_c_call_median_us": statistics.median(bare) * 1e6, "python_call_median_us": statistics.median(full) * 1e6,
            "added_us": (statistics.median(full) - statistics.median(bare)) * 1e6, "samples": samples}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--onnx", type=Path, action="append", default=[], help="also time these networks")
    parser.add_argument("--net", action="append", default=[],
                        help="also time this network of benchmarks/nets.py at 224 x 224 (mobilenet_v2, resnet18, ...; "
                             "needs torch: scripts/setup.sh --bench)")
    parser.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--out-name", default="python_overhead.json", help="file name under --results")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO / "tests"))
    from support import nets as model_nets
    cost = call_cost_us()
    print(f"compile_model call: {cost['added_us']:.1f} us on top of its bare C call ({cost['bare_c_call_median_us']:.1f} "
          f"-> {cost['python_call_median_us']:.1f} us, tiny network)")
    kernel = kernel_overhead(512, 512, 512, args.threads, args.runs)
    print(f"kernel {kernel['spec']}: C {kernel['c_median_ms']:.3f} ms, Python {kernel['python_median_ms']:.3f} ms "
          f"({kernel['overhead'] * 100:+.2f}%; minima {kernel['min_overhead'] * 100:+.2f}%); pre-packed: C "
          f"{kernel['c_packed_median_ms']:.3f} ms, Python {kernel['python_run_packed_median_ms']:.3f} ms "
          f"({kernel['packed_overhead'] * 100:+.2f}%; minima {kernel['packed_min_overhead'] * 100:+.2f}%)")
    nets = [("bottleneck", model_nets.bottleneck_net(c=16, hw=56)), ("mobilenet_v3", model_nets.mobilenet_v3_net(c=16, hw=97))]
    import onnx
    nets += [(p.stem, onnx.load(str(p))) for p in args.onnx]
    if args.net:
        from nets import export
        with tempfile.TemporaryDirectory(prefix="xfc-py-overhead-nets-") as tmp:
            for name in args.net:
                export(name, Path(tmp) / f"{name}.onnx", 224)
                nets.append((name, onnx.load(str(Path(tmp) / f"{name}.onnx"))))
    networks = []
    for name, model in nets:
        r = network_overhead(name, model, args.threads, args.runs)
        networks.append(r)
        print(f"network {name}: benchmark program {r['c_median_ms']:.3f} ms, compile_model call "
              f"{r['python_median_ms']:.3f} ms ({r['overhead'] * 100:+.2f}%; minima {r['c_min_ms']:.3f} vs "
              f"{r['python_min_ms']:.3f} ms, {r['min_overhead'] * 100:+.2f}%)")
    from xfc.outputs import write_json_result
    out = args.results / args.out_name
    write_json_result(out, {"machine": machine_facts(), "call_cost": cost, "kernel": kernel, "networks": networks},
                      kind="python-overhead")
    print(f"-> {out.relative_to(REPO) if out.is_relative_to(REPO) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
