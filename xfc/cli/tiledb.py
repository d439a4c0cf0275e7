"""`xfc tiledb build|show|stats|export|import|merge|verify|gc|calibrate`.

The environment is read here only (per-user database location, SOURCE_DATE_EPOCH); everything
below gets paths and clocks as arguments. Errors are one line through xfc.errors (exit 2, or 3
for a missing compiler).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ..errors import XfcError
from .adb_options import add_adb_server_options
from .arg_types import non_negative_int, positive_int
from ..wording import counted
from ..tiledb.records import RANKS, source_kind
from ..tiledb.store import TileDb, TileDbError, timestamps

EVALUATOR_NAMES = ("static", "host", "llvm-mca", "adb:SERIAL")


def _db_path(args) -> Path:
    from ..tiledb.locations import user_db_path
    return Path(args.db) if args.db else user_db_path(os.environ)


def _evaluators(text: str, hw, db_path: Path, args=None) -> list:
    from ..tiledb.evaluators import HostMicroKernelEvaluator, McaMicroKernelEvaluator, StaticDbEvaluator
    from ..tiledb.operators import HostOperatorEvaluator
    from ..tiledb.locations import is_shipped_location
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise XfcError("--evaluators: give at least one of " + ", ".join(EVALUATOR_NAMES))
    out = []
    for name in dict.fromkeys(names):
        kind = source_kind(name)
        if name == "static":
            out.append(StaticDbEvaluator())
        elif name == "host":
            if hw.kind != "host":
                raise XfcError(f"--evaluators host times kernels on this machine; it needs --hw host, not {hw.name}")
            if is_shipped_location(db_path):
                raise XfcError(f"--db {db_path}: host measurements go to the per-user database, never into the "
                               "shipped tile_db/")
            out += [HostMicroKernelEvaluator(), HostOperatorEvaluator()]
        elif name == "llvm-mca":
            from ..analysis import mca
            if hw.target_arch != "aarch64":
                raise XfcError(f"--evaluators llvm-mca analyses AArch64 kernels; {hw.name} is {hw.target_arch}")
            mca.require_tools()
            out.append(McaMicroKernelEvaluator())
        elif kind == "llvm-mca":
            raise XfcError(f"--evaluators {name}: give 'llvm-mca'; the model comes from each core's entry in "
                           "xfc.analysis.mca.MODELS")
        elif kind == "adb" and getattr(args, "executor", "local") == "ray":
            # the phone hangs off some node of the cluster: the node holding it attaches there
            from ..tiledb.ray_executor import ClusterDevice
            if is_shipped_location(db_path):
                raise XfcError(f"--db {db_path}: device measurements go to your own database, never into the "
                               "shipped tile_db/")
            out.append(ClusterDevice(name.split(":", 1)[1] if ":" in name else "", hw))
        elif kind == "adb":
            out.append(_device_evaluator(name, hw, db_path, args))
        else:
            raise XfcError(f"--evaluators: unknown evaluator {name!r} (available: {', '.join(EVALUATOR_NAMES)})")
    return out


def _device_evaluator(name: str, hw, db_path: Path, args):
    """adb:SERIAL (or adb: the only device): connected and checked against --hw before the
    database is opened, so a missing, unauthorized, offline or different device costs one line
    (exit 3) and writes nothing."""
    from ..runners.adb import AdbRunner
    from ..tiledb.build import clusters_of
    from ..tiledb.device import DeviceEvaluator
    from ..tiledb.locations import is_shipped_location
    if is_shipped_location(db_path):
        raise XfcError(f"--db {db_path}: device measurements go to your own database, never into the shipped "
                       "tile_db/")
    serial = name.split(":", 1)[1] if ":" in name else None
    if serial == "":
        raise XfcError("--evaluators adb:SERIAL: the serial is empty (see 'xfc devices')")
    runner = AdbRunner(serial=serial, adb_host=getattr(args, "adb_host", None), adb_port=getattr(args, "adb_port", None),
                       start_server=not getattr(args, "no_start_server", False))
    return DeviceEvaluator(runner).attach(hw, clusters_of(hw, getattr(args, "cluster", None)))


def cmd_build(args) -> int:
    from .hardware import load_for_command_line as load
    from ..tiledb.build import OP_CHOICES, parse_tiles, plan_tasks, register_hardware, run_build
    hw = load(args.hw)
    if not hw.clusters:
        raise XfcError(f"--hw {args.hw}: {hw.name} has no CPU clusters; GPU tiles are not built yet")
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    for op in ops:
        if op not in OP_CHOICES:
            raise XfcError(f"--ops: unknown operator class {op!r} (available: {', '.join(OP_CHOICES)})")
    if args.jobs < 1:
        raise XfcError(f"--jobs must be >= 1, got {args.jobs}")
    tiles = parse_tiles(args.tiles) if args.tiles else None
    path = _db_path(args)
    if args.executor == "ray":
        from ..tiledb.ray_executor import RayExecutor, require_ray
        require_ray()                       # before anything is opened: one line saying what to install
        if not args.address:
            raise XfcError("--executor ray needs --address HOST:PORT (the head of 'xfc cluster head')")
        from ..tiledb.raytoken import default_token_path, read_token
        token = read_token(Path(args.token_file) if args.token_file else default_token_path(os.environ))
    elif args.address or args.token_file:
        raise XfcError(f"{'--address' if args.address else '--token-file'} is for --executor ray")
    evaluators = _evaluators(args.evaluators, hw, path, args)
    with TileDb.open(path) as db:
        if db.migrated_from is not None:
            print(f"note: {path}: migrated from schema {db.migrated_from}", file=sys.stderr)
        register_hardware(db, hw, args.cluster)
        tasks = plan_tasks(db, hw, evaluators, ops, args.cluster, tiles)
        progress = None if args.quiet else sys.stderr
        if args.executor == "ray":
            with RayExecutor(args.address, hw, token=token, retries=args.retries) as executor:
                executor.check(tasks)       # no node for a phone / SoC / host: one line, nothing measured
                summary = run_build(db, tasks, progress=progress, created_at=timestamps(os.environ),
                                    executor=executor)
        else:
            summary = run_build(db, tasks, jobs=args.jobs, progress=progress, created_at=timestamps(os.environ))
    if args.executor == "ray":
        for source in dict.fromkeys(src for src, _, _ in summary.where):
            print(f"ran {source}: " + ", ".join(f"{n} on {place}" for src, place, n in summary.where
                                                 if src == source))
    for what, why in summary.unmeasured:
        print(f"not measured: {what}: {why}")
    print(f"{path}: {summary.planned} task(s) for {hw.name}: {summary.evaluated} evaluated, "
          f"{summary.skipped} already present, {summary.taken_by_others} done by another builder"
          + (f", {summary.replaced} recomputed (other xfc version)" if summary.replaced else "")
          + (f", {summary.conflicts} conflict(s) kept as they were" if summary.conflicts else ""))
    if summary.unmeasured:
        from ..errors import DeviceError
        raise DeviceError(f"{len(summary.unmeasured)} task(s) could not be measured (listed above, no rows "
                          "written for them); run the build again to retry them")
    return 0


def _print_table(rows, header) -> None:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip())
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())


def _num(v, fmt="{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def cmd_show(args) -> int:
    path = _db_path(args)
    with TileDb.open(path, readonly=True) as db:
        where, params = [], []
        if args.hw:
            from .hardware import load_for_command_line as load
            from ..tiledb.fingerprint import fingerprint
            hw = load(args.hw)
            clusters = (hw.cluster(args.cluster),) if args.cluster else hw.clusters
            fps = [fingerprint(hw, c) for c in clusters]
            where.append(f"fingerprint IN ({', '.join('?' * len(fps))})")
            params += fps
        if args.source:
            where.append("source = ?")
            params.append(args.source)
        if args.isa:
            where.append("isa = ?")
            params.append(args.isa)
        rows = db.rows("tile", " AND ".join(where), params)
        labels = db.labels()
    rows.sort(key=lambda r: (r.fingerprint, r.isa, r.params, -r.rank, r.source, r.origin))
    if args.limit:
        rows = rows[:args.limit]
    if args.json:
        from ..tiledb.records import as_dict
        print(json.dumps([as_dict(r) for r in rows], indent=1))
        return 0
    if not rows:
        print(f"{path}: no tile rows" + (" for that selection" if where else ""))
        return 0
    table = []
    for r in rows:
        p = json.loads(r.params)
        tile = f"{p.get('mr')}x{p.get('nr_vectors', 0) * p.get('lanes', 0)}" if "mr" in p else r.params
        table.append([",".join(labels.get(r.fingerprint, ["?"])), r.isa, tile, p.get("a_load_bits", "-"),
                      r.source + (" (emulated)" if r.emulated else ""), _num(r.cycles_per_k), _num(r.gflops, "{:.1f}"),
                      _num(r.efficiency, "{:.0%}"), r.bound, r.repeats, _num(r.spread, "{:.1%}"), r.created_at])
    _print_table(table, ["hardware", "isa", "tile", "A bits", "source", "cycles/k", "GFLOP/s", "eff", "bound",
                         "reps", "spread", "when"])
    return 0


def cmd_stats(args) -> int:
    path = _db_path(args)
    with TileDb.open(path, readonly=True) as db:
        by = db.query("SELECT fingerprint, source, COUNT(*), SUM(emulated) FROM tile GROUP BY fingerprint, source")
        labels = db.labels()
        counts = {t: db.count(t) for t in ("hardware", "tile", "operator", "calibration", "claim")}
        from ..tiledb.schema import user_version
        version, db_id = user_version(db.conn), db.db_id
    size = path.stat().st_size
    measured = sorted({lab for fp, src, n, emulated in by if RANKS[source_kind(src)] == RANKS["host"]
                       and n > (emulated or 0) for lab in labels.get(fp, [fp[:12]])})
    emulated_only = sorted({lab for fp, src, n, emulated in by if (emulated or 0) > 0
                            for lab in labels.get(fp, [fp[:12]])} - set(measured))
    if args.json:
        print(json.dumps({"path": str(path), "schema_version": version, "db_id": db_id, "bytes": size,
                          "counts": counts, "measured_hardware": measured, "emulated_only_hardware": emulated_only,
                          "tiles": [{"fingerprint": fp, "labels": labels.get(fp, []), "source": src, "rows": n,
                                     "emulated": int(e or 0)} for fp, src, n, e in by]}, indent=1))
        return 0
    print(f"{path}: schema {version}, id {db_id}, {size / 1024:.0f} KiB")
    print("rows: " + ", ".join(f"{t} {n}" for t, n in counts.items()))
    print("hardware with measured rows: " + (", ".join(measured) if measured else "none"))
    if emulated_only:
        print("hardware with emulated rows only (kept for the record, never used to rank): " + ", ".join(emulated_only))
    if by:
        _print_table([[",".join(labels.get(fp, ["?"])), fp[:12], src, n, int(e or 0)] for fp, src, n, e in sorted(
            by, key=lambda r: (",".join(labels.get(r[0], [])), r[1]))],
            ["hardware", "fingerprint", "source", "tiles", "emulated"])
    return 0


def cmd_export(args) -> int:
    from ..tiledb.exchange import export_lines, write_export
    path = _db_path(args)
    with TileDb.open(path, readonly=True) as db:
        if args.output and args.output != "-":
            n = write_export(db, Path(args.output))
            print(f"{args.output}: {n} record(s) from {path}", file=sys.stderr)
        else:
            for line in export_lines(db):
                sys.stdout.write(line + "\n")
    return 0


def _report_merge(report, what: str, dest: Path) -> int:
    inserted = ", ".join(f"{k} {v}" for k, v in sorted(report.inserted.items())) or "nothing"
    print(f"{dest}: from {what}: inserted {inserted}; {report.unchanged} already present; "
          f"{len(report.conflicts)} conflict(s)")
    for line in report.conflicts[:10]:
        print(f"  conflict (existing row kept): {line}", file=sys.stderr)
    if len(report.conflicts) > 10:
        print(f"  ... and {len(report.conflicts) - 10} more", file=sys.stderr)
    return 0


def cmd_import(args) -> int:
    from ..tiledb.exchange import merge_records, read_export_file
    dest = _db_path(args)
    records = []
    for f in args.files:
        records += read_export_file(Path(f))
    with TileDb.open(dest) as db:
        return _report_merge(merge_records(db, records), ", ".join(args.files), dest)


def cmd_merge(args) -> int:
    from ..tiledb.exchange import merge_records, rows_of_database
    dest = _db_path(args)
    records = []
    for src in args.sources:
        if Path(src).resolve() == dest.resolve():
            raise XfcError(f"{src}: is the destination database itself")
        records += rows_of_database(Path(src))
    with TileDb.open(dest) as db:
        return _report_merge(merge_records(db, records), ", ".join(args.sources), dest)


def cmd_verify(args) -> int:
    from ..tiledb.verify import verify
    path = _db_path(args)
    problems, checked = verify(path)
    for p in problems[:50]:
        print(f"problem: {p}")
    if problems:
        raise TileDbError(f"{path}: {len(problems)} problem(s) found (listed above)")
    print(f"{path}: ok ({checked} rows checked)")
    return 0


def cmd_gc(args) -> int:
    from ..tiledb.gc import collect
    path = _db_path(args)
    with TileDb.open(path, create=False) as db:
        lines = collect(db, stale=args.stale, dry_run=args.dry_run)
    for line in lines:
        print(line)
    return 0


def cmd_calibrate(args) -> int:
    import sys
    from ..hardware.load import is_host_name
    from ..tiledb.calibrate import (RANK_MARGIN, calibrated_constants, fit, measure, measurements_document,
                                    read_measurements, store_fit, training_cases)
    from .hardware import load_for_command_line
    from ..tiledb.locations import is_shipped_location
    from ..outputs import claim_file, json_is_ours, write_json_result
    if not is_host_name(args.hw):
        raise XfcError(f"--hw {args.hw}: only the host can be measured here, so only the host is calibrated "
                       "(phones keep the static constants until a device has been measured)")
    refit = args.from_measurements is not None
    for given, option in ((args.threads, "--threads"), (args.repeats, "--repeats"), (args.save_measurements,
                                                                                    "--save-measurements")):
        if refit and given is not None:
            raise XfcError(f"{option}: --from-measurements measures nothing; the files say what was timed")
    measuring = (args.threads, args.repeats, args.save_measurements)
    if args.forget and (refit or args.dry_run or args.winograd or any(v is not None for v in measuring)):
        raise XfcError("--forget measures and fits nothing: give it alone (with --hw and --db)")
    threads_text = args.threads or "1,2"
    repeats = args.repeats if args.repeats is not None else 15
    try:
        threads = sorted({int(t) for t in threads_text.split(",") if t.strip()})
    except ValueError:
        raise XfcError(f"--threads {threads_text!r}: expected thread counts such as 1,2") from None
    hw = load_for_command_line(args.hw)
    cluster = hw.cluster()
    if not threads or threads[0] < 1 or threads[-1] > cluster.count:
        raise XfcError(f"--threads {threads_text}: between 1 and the {cluster.count} cores of {hw.name}")
    if repeats < 3:
        raise XfcError(f"--repeats {repeats}: at least 3")
    path = _db_path(args)
    if is_shipped_location(path):
        raise XfcError(f"--db {path}: the shipped databases hold computed rows only; calibrate into your own database")
    if args.forget:
        return _forget_calibration(path, hw, cluster, args.hw)
    say = (lambda m: None) if args.quiet else (lambda m: print(f"xfc: {m}", file=sys.stderr, flush=True))
    if args.save_measurements is not None:   # refuse a file xfc did not write before minutes of measuring
        claim_file(args.save_measurements, json_is_ours(), option="--save-measurements")
    if args.dry_run:   # read the last fit, if any; create and change nothing
        stored = None
        if path.exists():
            with TileDb.open(path, readonly=True) as db:
                stored = calibrated_constants(db, hw, cluster)
    else:
        with TileDb.open(path) as db:   # fail on an unwritable database before minutes of measuring
            stored = calibrated_constants(db, hw, cluster)   # this machine's last fit: a second start
    if refit:
        items = read_measurements(args.from_measurements, hw, cluster,
                                  warn=lambda m: print(f"xfc: warning: {m}", file=sys.stderr, flush=True))
        threads = sorted({i.threads for i in items})
    else:
        items = measure(hw, cluster, training_cases(winograd=args.winograd), threads, repeats=repeats, progress=say)
        if args.save_measurements is not None:
            from ..tiledb import hostcc
            from ..tiledb.store import utc_now
            document = measurements_document(items, hw, cluster, repeats, hostcc.compiler_version(), utc_now())
            write_json_result(args.save_measurements, document, kind="calibration-measurements",
                              option="--save-measurements")
            say(f"measurements written to {args.save_measurements} (refit later with --from-measurements)")
    result = fit(items, hw, cluster, stored=stored, winograd=args.winograd)
    if not args.dry_run:
        with TileDb.open(path) as db:
            store_fit(db, hw, cluster, result, threads)
    from ..tiledb.calibrate import predicted_s
    from ..cpu.cost_model import DEFAULT_CONSTANTS
    rows = [[i.spec.describe().replace(" dilation=1x1", "").replace(" epilogue=none", "")
             + (f" winograd m={i.plan.winograd_m}" if i.plan.lowering == "winograd" else "")
             + (" (contended: not fitted)" if i.contended else ""), str(i.threads), f"{i.measured_s * 1e3:.3f}",
             f"{predicted_s(i, hw, cluster, DEFAULT_CONSTANTS) * 1e3:.3f}",
             f"{predicted_s(i, hw, cluster, result.constants) * 1e3:.3f}"] for i in items]
    _print_table(rows, ["operator", "T", "measured ms (fastest)", "static ms", "calibrated ms"])
    print(f"\nmean |error| {result.error_before:.1%} -> {result.error_after:.1%}; "
          f"worst {result.worst_before:.1%} -> {result.worst_after:.1%} ({result.cases} timed operators, "
          f"outside the benchmark suite" + (f"; {result.left_out} contended left out" if result.left_out else "") + ")")
    (right_before, clear), (right_after, _) = result.rank_before, result.rank_after
    print(f"plan order (pairs of one layer's plans predicted in the measured order / pairs measured more than "
          f"{RANK_MARGIN:.0%} apart): {right_before}/{clear} -> {right_after}/{clear}")
    print(f"descent won from the {'stored constants of the last calibration' if result.start == 'stored' else 'static constants'}"
          + ("" if stored is not None else " (no stored constants: the only start)"))
    print("fitted: " + ", ".join(f"{k}={v:g}" if not isinstance(v, bool) else f"{k}={v}"
                                 for k, v in result.constants.as_dict().items()))
    if not args.winograd:
        print("Winograd constants: static (--winograd fits them too; see docs/tile-db.md before keeping them)")
    if refit:
        print(f"fitted to the measurements of {', '.join(map(str, args.from_measurements))} (timed nothing)")
    if args.dry_run:
        print(f"--dry-run: nothing stored; {path} is unchanged")
    else:
        print(f"stored in {path} for {hw.name}; `xfc synth --hw {args.hw} --tile-db` and "
              "benchmarks/prediction_error.py use them")
    return 0


def _forget_calibration(path, hw, cluster, hw_arg: str) -> int:
    """`xfc tiledb calibrate --forget`: drop this machine's fitted constants, measure nothing."""
    from ..tiledb.calibrate import forget_fit
    if not path.exists():
        print(f"{path}: no database, so no calibration to forget; {hw.name} is planned with the static constants")
        return 0
    with TileDb.open(path) as db:
        removed = forget_fit(db, hw, cluster)
    if removed:
        print(f"removed {counted(removed, 'fitted constant')} of {hw.name} from {path}; `xfc synth --hw {hw_arg}` "
              "plans with the static constants again")
    else:
        print(f"{path} holds no calibration of {hw.name} (this description's fingerprint); nothing removed")
    return 0


def register(sub) -> None:
    p = sub.add_parser("tiledb", help="build, inspect and exchange offline tile databases",
                       description="The offline tile database: evaluated micro-tiles per hardware fingerprint "
                       "(see docs/tile-db.md).")
    tsub = p.add_subparsers(dest="tiledb_command", metavar="SUBCOMMAND")
    db_help = "database file (default: the per-user database, $XDG_CACHE_HOME/xfc/tile-db.sqlite)"

    b = tsub.add_parser("build", help="evaluate every micro-tile of a description into a database (resumable)")
    b.add_argument("--hw", required=True, metavar="HW", help="hardware: shipped name, file, or 'host'")
    b.add_argument("--cluster", choices=("prime", "big", "mid", "little"), help="one cluster (default: all)")
    b.add_argument("--evaluators", default="static", metavar="E[,E...]",
                   help="static (the cost model), host (time the rendered micro-kernels here; --hw host only), "
                        "llvm-mca (the rendered AArch64 micro-kernel's K loop under llvm-mca-16; ARM descriptions), "
                        "adb:SERIAL or adb (build for aarch64 and time on that Android device, pinned per cluster; "
                        "the device must be the --hw description; a virtual device's rows are stored as emulated "
                        "and never rank)")
    b.add_argument("--ops", default="gemm", metavar="OP[,OP...]",
                   help="gemm (GEMM micro-kernels), operators (the workload suite at 1 and all cores: operator table)")
    b.add_argument("--tiles", metavar="MRxNR[,...]", help="only these register tiles (default: every tile that fits)")
    b.add_argument("--jobs", type=int, default=1, help="tasks evaluated at once (host timing stays one at a time)")
    b.add_argument("--db", metavar="PATH", help=db_help)
    b.add_argument("--quiet", action="store_true", help="no progress bar")
    b.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="local (threads here, the default) or ray (the nodes of a Ray cluster; needs xfc[ray], "
                        "see 'xfc cluster')")
    b.add_argument("--address", metavar="ADDR", help="--executor ray: the cluster head's HOST:PORT")
    b.add_argument("--token-file", metavar="PATH",
                   help="--executor ray: the cluster token, a copy of the file 'xfc cluster head' wrote "
                        "(default: $XDG_STATE_HOME/xfc/ray-cluster.token, i.e. ~/.local/state/xfc/...)")
    b.add_argument("--retries", type=non_negative_int, default=2,
                   help="--executor ray: times a task is retried when its worker or node dies (default 2)")
    add_adb_server_options(b)
    b.set_defaults(func=cmd_build)

    s = tsub.add_parser("show", help="tile rows, best source first")
    s.add_argument("--db", metavar="PATH", help=db_help)
    s.add_argument("--hw", metavar="HW", help="only this description's fingerprints")
    s.add_argument("--cluster", choices=("prime", "big", "mid", "little"))
    s.add_argument("--source", help="only rows of this source (static, host, llvm-mca:<model>, ...)")
    s.add_argument("--isa", help="only this ISA")
    s.add_argument("--limit", type=non_negative_int, default=0, help="at most this many rows (default 0: all)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_show)

    s = tsub.add_parser("stats", help="row counts per hardware and source")
    s.add_argument("--db", metavar="PATH", help=db_help)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_stats)

    s = tsub.add_parser("export", help="deterministic sorted JSON lines (stdout or -o FILE)")
    s.add_argument("--db", metavar="PATH", help=db_help)
    s.add_argument("-o", "--output", metavar="FILE", help="write here atomically instead of stdout")
    s.set_defaults(func=cmd_export)

    s = tsub.add_parser("import", help="add the rows of exports (all or nothing; conflicts kept, reported)")
    s.add_argument("files", nargs="+", metavar="EXPORT.jsonl")
    s.add_argument("--db", metavar="PATH", help=db_help)
    s.set_defaults(func=cmd_import)

    s = tsub.add_parser("merge", help="add the rows of other databases, keeping every provenance")
    s.add_argument("sources", nargs="+", metavar="OTHER.sqlite")
    s.add_argument("--db", metavar="PATH", help="destination " + db_help)
    s.set_defaults(func=cmd_merge)

    s = tsub.add_parser("verify", help="integrity, schema and row checks")
    s.add_argument("--db", metavar="PATH", help=db_help)
    s.set_defaults(func=cmd_verify)

    s = tsub.add_parser("gc", help="drop dead build claims and xfc's own stray temporary files; compact")
    s.add_argument("--db", metavar="PATH", help=db_help)
    s.add_argument("--stale", action="store_true",
                   help="also delete rows of fingerprints whose description has changed since (resolved by label)")
    s.add_argument("--dry-run", action="store_true", help="say what would be removed, remove nothing")
    s.set_defaults(func=cmd_gc)

    s = tsub.add_parser("calibrate", help="time operators here and fit the cost model's constants to them (host)",
                        description="Synthesize, build, verify and time a fixed set of operators outside the "
                        "benchmark suite on this machine, fit the CPU cost model's constants to the times "
                        "(xfc/tiledb/calibrate.py) and store them in the database. About a minute; three or four "
                        "with --winograd.")
    s.add_argument("--hw", default="host", metavar="HW", help="host or host:<isa> (default host)")
    s.add_argument("--threads", metavar="T[,T...]", help="thread counts to time (default 1,2)")
    s.add_argument("--repeats", type=positive_int, help="timed runs per operator (the fastest counts; default 15)")
    s.add_argument("--save-measurements", type=Path, metavar="FILE",
                   help="also write what was timed to FILE (JSON naming this machine), to refit later without "
                        "timing again")
    s.add_argument("--from-measurements", type=Path, nargs="+", metavar="FILE",
                   help="time nothing: fit to the measurements of these files (this machine's, from "
                        "--save-measurements); several files are pooled, the fastest time of each operator counts")
    s.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    s.add_argument("--db", metavar="PATH", help=db_help)
    s.add_argument("--winograd", action="store_true",
                   help="also time Winograd plans of 3x3 layers and fit the Winograd constants to them (off by "
                        "default: on the Zen 4 VM where this was judged, fitted ones chose slower plans than the "
                        "static ones on layers outside the training set; docs/tile-db.md)")
    s.add_argument("--dry-run", action="store_true", help="fit and print the constants, store nothing")
    s.add_argument("--forget", action="store_true",
                   help="measure nothing: remove this machine's fitted constants from the database, so synthesis "
                        "uses the static ones again")
    s.set_defaults(func=cmd_calibrate)

    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])
