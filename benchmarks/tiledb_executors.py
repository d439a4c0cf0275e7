#!/usr/bin/env python3
"""Tile-database build throughput: the local executor against the Ray executor, on this machine.

    .venv/bin/python benchmarks/tiledb_executors.py                         # static tiles, 2 SoCs
    .venv/bin/python benchmarks/tiledb_executors.py --hw host --evaluators host --ray-cpus 2

The benchmark builds the same task list (xfc.tiledb.build.plan_tasks) into a fresh database in a
temporary directory, once per executor. It uses the path `xfc tiledb build` takes (run_build with
one writer), and counts tasks per second from the first claim to the last row:

  local xN    LocalExecutor(jobs=N), for each --jobs value
  ray         RayExecutor on a local cluster that this script starts: `xfc cluster head` on
              127.0.0.1 (listening there only) with --ray-cpus CPUs, its token and Ray's files
              in its own temporary directory, stopped at the end (SIGTERM: xfc stops every Ray
              process of the node). Connecting (ray.init) is reported apart, as 'connect_s'.

Every database is checked equal to the first one, by its export, when all evaluators are
deterministic (static). Output: a table, and benchmarks/results/tiledb_executors.json (written
through xfc.outputs, never over a file that xfc did not write), together with the machine it
ran on. A busy machine inflates every figure, so run it quietly. The Ray figures include the
cost of shipping every task to a worker process and its result back.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from xfc.errors import XfcError
from xfc.outputs import write_json_result
from machine import machine_facts

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plan(db, hw_names, evaluator_names):
    from xfc.cli.hardware import load_for_command_line
    from xfc.cli.tiledb import _evaluators
    from xfc.tiledb.build import plan_tasks, register_hardware
    tasks, hws = [], []
    for name in hw_names:
        hw = load_for_command_line(name)
        register_hardware(db, hw)
        tasks += plan_tasks(db, hw, _evaluators(evaluator_names, hw, Path(db.path)), ["gemm"])
        hws.append(hw)
    return tasks, hws


def build(path: Path, hw_names, evaluator_names, executor_for) -> tuple[float, float, int, str]:
    """(connect seconds, build seconds, tasks evaluated, export) of one build into path."""
    from xfc.tiledb.build import run_build
    from xfc.tiledb.exchange import export_lines
    from xfc.tiledb.store import TileDb, timestamps
    with TileDb.open(path) as db:
        tasks, hws = plan(db, hw_names, evaluator_names)
        t0 = time.perf_counter()
        with executor_for(hws[0]) as executor:
            t1 = time.perf_counter()
            summary = run_build(db, tasks, progress=None, created_at=timestamps({"SOURCE_DATE_EPOCH": "1700000000"}),
                                executor=executor)
            t2 = time.perf_counter()
        export = "\n".join(export_lines(db))
    if summary.unmeasured:
        raise XfcError(f"{len(summary.unmeasured)} task(s) not measured: {summary.unmeasured[0]}")
    return t1 - t0, t2 - t1, summary.evaluated, export


def start_head(root: Path, cpus: int) -> tuple[subprocess.Popen, str, Path]:
    """(the `xfc cluster head` process, its address, its token file)."""
    port = free_port()
    token = root / "cluster.token"
    env = dict(os.environ, PYTHONPATH=str(REPO), RAY_USAGE_STATS_ENABLED="0")
    log = open(root / "head.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "xfc", "cluster", "head", "--port", str(port), "--no-adb",
                             "--num-cpus", str(cpus), "--object-store-mb", "100", "--temp-dir", str(root / "ray"),
                             "--token-file", str(token)],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    address = f"127.0.0.1:{port}"
    end = time.monotonic() + 120
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise XfcError(f"the Ray head stopped: {(root / 'head.log').read_text()[-300:]}")
        probe = subprocess.run([sys.executable, "-m", "xfc", "cluster", "resources", "--address", address,
                                "--token-file", str(token)], capture_output=True, text=True, timeout=60, env=env)
        if probe.returncode == 0 and json.loads(probe.stdout):
            return proc, address, token
        time.sleep(1)
    stop_head(proc)
    raise XfcError("the Ray head did not start within 120 s")


def stop_head(proc: subprocess.Popen) -> None:
    """SIGTERM to `xfc cluster head`, which stops every Ray process of its node (up to ~25 s); SIGKILL
    only if it does not exit within 60 s (Ray's processes, in their own session, may then be left)."""
    for sig, wait_s in ((signal.SIGTERM, 60), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait_s)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            print(f"tiledb_executors: warning: the Ray head did not stop within {wait_s} s", file=sys.stderr)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hw", default="snapdragon-865,dimensity-9000", help="descriptions, comma-separated")
    ap.add_argument("--evaluators", default="static", help="as for xfc tiledb build (no adb here)")
    ap.add_argument("--jobs", default="1,2", help="local executor thread counts, comma-separated")
    ap.add_argument("--ray-cpus", type=int, default=2, help="CPUs of the local Ray head")
    ap.add_argument("--no-ray", action="store_true", help="local executor only")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "tiledb_executors.json"))
    args = ap.parse_args(argv)
    from xfc.tiledb.build import LocalExecutor
    hw_names = [h.strip() for h in args.hw.split(",") if h.strip()]
    rows = []
    with tempfile.TemporaryDirectory(prefix="xfc-bench-exec-") as tmp:
        root = Path(tmp)
        exports = []
        for jobs in (int(j) for j in args.jobs.split(",")):
            connect_s, build_s, n, export = build(root / f"local{jobs}.sqlite", hw_names, args.evaluators,
                                                  lambda hw, jobs=jobs: LocalExecutor(jobs))
            rows.append(dict(executor=f"local x{jobs}", tasks=n, connect_s=connect_s, build_s=build_s))
            exports.append(export)
        if not args.no_ray:
            from xfc.tiledb.ray_executor import RayExecutor, require_ray
            require_ray()
            from xfc.tiledb.raytoken import read_token
            head, address, token_file = start_head(root, args.ray_cpus)
            try:
                token = read_token(token_file)
                connect_s, build_s, n, export = build(root / "ray.sqlite", hw_names, args.evaluators,
                                                      lambda hw: RayExecutor(address, hw, token=token,
                                                                             capacity=4 * args.ray_cpus))
            finally:
                stop_head(head)
            rows.append(dict(executor=f"ray ({args.ray_cpus} CPUs, 1 node)", tasks=n, connect_s=connect_s,
                             build_s=build_s))
            exports.append(export)
    deterministic = all(e.strip() in ("static",) for e in args.evaluators.split(","))
    if deterministic and any(e != exports[0] for e in exports):
        raise XfcError("the executors built different databases from the same tasks")
    for r in rows:
        r["tasks_per_s"] = r["tasks"] / r["build_s"] if r["build_s"] > 0 else None
    print(f"{'executor':<24} {'tasks':>6} {'connect s':>10} {'build s':>9} {'tasks/s':>9}")
    for r in rows:
        print(f"{r['executor']:<24} {r['tasks']:>6} {r['connect_s']:>10.2f} {r['build_s']:>9.2f} "
              f"{r['tasks_per_s'] or 0:>9.1f}")
    if deterministic:
        print("every executor's database exports the same records")
    write_json_result(Path(args.out), dict(machine=machine_facts(), hardware=hw_names, evaluators=args.evaluators,
                                           rows=rows, same_export=deterministic), kind="tiledb_executors")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except XfcError as exc:
        print(f"tiledb_executors: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
