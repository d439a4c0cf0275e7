#!/usr/bin/env python3
"""What calling xfc from Python costs on top of C (issue 32 item 5; not run in CI).

1. A kernel: `kernel(a, b)` / `kernel.run_packed(a, packed)` of xfc.compile (one C call on the
   arrays themselves) timed with perf_counter around each call, against the same kernel's median
   timed inside C (kernel.time: the library's own bench loop), 512 x 512 x 512 matmul by default.
2. A network: `net(x)` of xfc.compile_model against the same network's benchmark program (its own
   C timing loop), on the families of tests/support/nets.py or an ONNX file.

The two sides alternate ROUNDS times; each reports the median of its round medians, and the
overhead is python / C - 1. Writes benchmarks/results/python_overhead.json (machine named).
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
ROUNDS = 5


def python_median(call, runs: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e3


def kernel_overhead(m: int, n: int, k: int, threads: int, runs: int) -> dict:
    import xfc
    hw = xfc.load_hardware("host")
    spec = xfc.make_spec("matmul", {"m": m, "n": n, "k": k})
    kernel = xfc.compile(spec, hw, threads=threads)
    rng = np.random.default_rng(0)
    a, b = (rng.uniform(-1, 1, size=s).astype(np.float32) for s in spec.operand_shapes[:2])
    packed = kernel.host.prepack(b)
    c_ms, py_ms, py_packed_ms, c_packed_ms = [], [], [], []
    for _ in range(ROUNDS):
        c_ms.append(kernel.host.time(a, b, repeats=runs, warmup=3).median_s * 1e3)
        py_ms.append(python_median(lambda: kernel(a, b), runs))
        c_packed_ms.append(kernel.host.time(a, b, repeats=runs, warmup=3, prepacked=True).median_s * 1e3)
        py_packed_ms.append(python_median(lambda: kernel.host.run_packed(a, packed), runs))
    c, py, cp, pp = (statistics.median(v) for v in (c_ms, py_ms, c_packed_ms, py_packed_ms))
    return {"spec": spec.describe(), "threads": threads, "runs": runs, "rounds": ROUNDS,
            "c_median_ms": c, "python_median_ms": py, "overhead": py / c - 1,
            "c_packed_median_ms": cp, "python_run_packed_median_ms": pp, "packed_overhead": pp / cp - 1,
            "round_medians_ms": {"c": c_ms, "python": py_ms, "c_packed": c_packed_ms, "python_packed": py_packed_ms}}


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
        (inp_name, shape), = net.inputs
        x = np.random.default_rng(0).uniform(-1, 1, size=shape).astype(np.float32)
        x.tofile(tmp / "x.f32")
        c_ms, py_ms = [], []
        for _ in range(ROUNDS):
            line = subprocess.run([str(program), "--weights", str(weights), "--input", str(tmp / "x.f32"),
                                   "--runs", str(runs), "--warmup", "3", "--threads", str(threads)],
                                  capture_output=True, text=True, check=True).stdout
            c_ms.append(json.loads(line)["median_ms"])
            py_ms.append(python_median(lambda: net(x), runs))
        net.close()
    c, py = statistics.median(c_ms), statistics.median(py_ms)
    return {"network": name, "threads": threads, "runs": runs, "rounds": ROUNDS, "c_median_ms": c,
            "python_median_ms": py, "overhead": py / c - 1, "round_medians_ms": {"c": c_ms, "python": py_ms}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--onnx", type=Path, action="append", default=[], help="also time these networks")
    parser.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO / "tests"))
    from support import nets as model_nets
    kernel = kernel_overhead(512, 512, 512, args.threads, args.runs)
    print(f"kernel {kernel['spec']}: C {kernel['c_median_ms']:.3f} ms, Python {kernel['python_median_ms']:.3f} ms "
          f"({kernel['overhead'] * 100:+.2f}%); pre-packed: C {kernel['c_packed_median_ms']:.3f} ms, Python "
          f"{kernel['python_run_packed_median_ms']:.3f} ms ({kernel['packed_overhead'] * 100:+.2f}%)")
    nets = [("bottleneck", model_nets.bottleneck_net(c=16, hw=56)), ("mobilenet_v3", model_nets.mobilenet_v3_net(c=16, hw=97))]
    import onnx
    nets += [(p.stem, onnx.load(str(p))) for p in args.onnx]
    networks = []
    for name, model in nets:
        r = network_overhead(name, model, args.threads, args.runs)
        networks.append(r)
        print(f"network {name}: benchmark program {r['c_median_ms']:.3f} ms, compile_model call "
              f"{r['python_median_ms']:.3f} ms ({r['overhead'] * 100:+.2f}%)")
    from xfc.outputs import write_json_result
    out = args.results / "python_overhead.json"
    write_json_result(out, {"machine": machine_facts(), "kernel": kernel, "networks": networks}, kind="python-overhead")
    print(f"-> {out.relative_to(REPO) if out.is_relative_to(REPO) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
