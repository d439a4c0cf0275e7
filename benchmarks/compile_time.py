#!/usr/bin/env python3
"""Build time with and without the precompiled ISA header (xfc.toolchain.pch; not run in CI).

    .venv/bin/python benchmarks/compile_time.py [--rounds 3]

1. Kernels: `xfc.compile` of the workload suite's first operators for the host (x86-64) and for
   snapdragon-865 (aarch64, cross-compiled), each into a fresh directory, XFC_PCH=off and on
   alternating per kernel; the per-kernel medians over --rounds are compared. The built files are
   compared byte for byte (they must be identical: the header only saves parsing).
2. A network: `xfc model NET.onnx --hw host --emit lib` of tests/support/nets.py's bottleneck and
   MobileNetV3-like nets, off and on alternating, whole command wall time.

The precompiled headers are built once before timing, in a private cache directory (their build
time is reported on its own). Writes benchmarks/results/compile_time.json with the machine named.
A busy machine inflates both sides; the alternation keeps them comparable.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import machine_facts

REPO = Path(__file__).resolve().parent.parent


def _kernel_build_s(spec, hw, pch: str, scratch: Path) -> tuple[float, str]:
    import xfc
    os.environ["XFC_PCH"] = pch
    out = Path(tempfile.mkdtemp(dir=scratch)) / "k"
    t = time.perf_counter()
    kernel = xfc.compile(spec, hw, threads=1, out_dir=out)
    seconds = time.perf_counter() - t
    built = kernel.files.get("binary") or next(out.glob("*.so"))
    return seconds, hashlib.sha256(Path(built).read_bytes()).hexdigest()


def kernels(rounds: int, scratch: Path) -> list[dict]:
    import xfc
    from xfc.ops.workloads import suite_spec
    rows = []
    for hw_name in ("host", "snapdragon-865"):
        hw = xfc.load_hardware(hw_name)
        specs = [suite_spec(w) for w in ("mm_512", "conv_r18_l1", "conv_pw", "conv_s2", "dw_mbv2_s1", "dw_mbv2_s2")]
        _kernel_build_s(specs[0], hw, "on", scratch)            # the header, precompiled once
        for spec in specs:
            times = {"off": [], "on": []}
            digests = set()
            for _ in range(rounds):
                for pch in ("off", "on"):
                    seconds, sha = _kernel_build_s(spec, hw, pch, scratch)
                    times[pch].append(seconds)
                    digests.add(sha)
            off, on = statistics.median(times["off"]), statistics.median(times["on"])
            rows.append({"hardware": hw_name, "spec": spec.describe(), "off_s": off, "on_s": on, "speedup": off / on,
                         "identical": len(digests) == 1})
            print(f"{hw_name:15s} {spec.describe()[:58]:58s} off {off:6.3f} s  on {on:6.3f} s  x{off / on:.2f}"
                  f"{'' if len(digests) == 1 else '  DIFFERENT BYTES'}", flush=True)
    return rows


def networks(rounds: int, scratch: Path) -> list[dict]:
    import onnx
    sys.path.insert(0, str(REPO / "tests"))
    from support import nets
    rows = []
    for name, model in (("bottleneck", nets.bottleneck_net(c=16, hw=56)), ("mobilenet_v3", nets.mobilenet_v3_net(c=16, hw=97))):
        path = scratch / f"{name}.onnx"
        onnx.save(model, str(path))
        times = {"off": [], "on": []}
        for r in range(rounds):
            for pch in ("off", "on"):
                out = scratch / f"{name}-{pch}-{r}"
                t = time.perf_counter()
                subprocess.run([sys.executable, "-m", "xfc", "model", str(path), "--hw", "host", "--emit", "lib",
                                "--threads", "1", "-o", str(out)], check=True, cwd=str(REPO),
                               env={**os.environ, "XFC_PCH": pch}, capture_output=True)
                times[pch].append(time.perf_counter() - t)
        off, on = statistics.median(times["off"]), statistics.median(times["on"])
        rows.append({"network": name, "off_s": off, "on_s": on, "speedup": off / on})
        print(f"xfc model {name} --emit lib: off {off:.2f} s  on {on:.2f} s  x{off / on:.2f}", flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="xfc-compile-time-") as tmp:
        scratch = Path(tmp)
        os.environ["XFC_CACHE_DIR"] = str(scratch / "cache")
        t = time.perf_counter()
        kernel_rows = kernels(args.rounds, scratch)
        network_rows = networks(args.rounds, scratch)
        wall = time.perf_counter() - t
    geo = statistics.geometric_mean(r["speedup"] for r in kernel_rows)
    print(f"kernels: geomean x{geo:.2f} faster to build with the precompiled header; all identical: "
          f"{all(r['identical'] for r in kernel_rows)}")
    from xfc.outputs import write_json_result
    out = args.results / "compile_time.json"
    write_json_result(out, {"machine": machine_facts(), "rounds": args.rounds, "kernels": kernel_rows,
                            "kernel_geomean_speedup": geo, "networks": network_rows, "wall_s": wall,
                            "command": "benchmarks/compile_time.py --rounds %d" % args.rounds}, kind="compile-time")
    print(f"-> {out.relative_to(REPO) if out.is_relative_to(REPO) else out}")
    return 0 if all(r["identical"] for r in kernel_rows) else 1


if __name__ == "__main__":
    sys.exit(main())
