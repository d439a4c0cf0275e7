"""`xfc hw probe --device SERIAL [-o FILE] [--compare NAME] [--json]`: draft a hardware
description from an attached phone (xfc/hwprobe/), and compare a shipped one with the device.

Registered under `xfc hw` by xfc/cli.py through `register(hw_subparsers)`.
Exit status: 0 drafted (differences found by --compare are a report, not an error); 2 bad input
(an unusable -o, an unknown --compare name, a device the draft cannot describe); 3 no device,
unauthorized or offline (DeviceError).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from .adb_options import add_adb_server_options


def cmd_hw_probe(args) -> int:
    from ..hardware import load
    from ..hwprobe import compare, draft_description, draft_json, render_draft, validate_draft, write_draft
    from ..hwprobe.device import read_facts
    from ..outputs import OutputError
    from ..runners.adb import AdbRunner

    out = Path(args.output) if args.output else None
    if out is not None and out.suffix != ".yaml":
        raise OutputError(f"-o {out}: a hardware description file ends in .yaml")
    shipped = load(args.compare) if args.compare else None      # bad names fail before the device
    runner = AdbRunner(serial=args.device, adb_host=args.adb_host, adb_port=args.adb_port,
                       start_server=not args.no_start_server)
    facts = read_facts(runner)
    draft = draft_description(facts, name=out.stem if out is not None else args.name)
    hw = validate_draft(draft)
    comparison = compare(draft, shipped) if shipped is not None else None
    written = write_draft(draft, out) if out is not None else []
    if args.json:
        payload = draft_json(draft, hw)
        payload["files"] = [str(p) for p in written]
        payload["compare"] = comparison.to_json() if comparison else None
        print(json.dumps(payload, indent=2, default=str))
        return 0
    say = (lambda msg: print(msg, file=sys.stderr)) if out is None and comparison is None else print
    if out is None and comparison is None:
        for name, text in render_draft(draft).items():
            if len(draft.new_cores):
                print(f"# --- {name}")
            print(text, end="")
    say(f"device {draft.serial}: {len(draft.clusters)} CPU clusters "
        f"({', '.join(f'{role} {cf.count}x' for role, cf in draft.clusters)}); matched shipped description: "
        f"{draft.match.describe()}")
    for p in written:
        say(f"wrote {p}")
    if written:
        say(f"validated: xfc hw validate {written[-1]} passes; use it with: xfc synth ... --hw {written[-1]}")
    say(f"{len(draft.uncertain)} fields are not from the device (listed under 'uncertain'); "
        f"{len(draft.new_cores)} new core file(s)")
    for note in draft.notes:
        say(f"note: {note}")
    if comparison is not None:
        if comparison.agrees:
            print(f"{comparison.name} agrees with device {draft.serial} on all {len(comparison.checked)} "
                  "fields the device exposes")
        else:
            print(f"{comparison.name} disagrees with device {draft.serial} on {len(comparison.differences)} of "
                  f"{len(comparison.checked)} fields the device exposes:")
            for d in comparison.differences:
                print(f"  {d.line()}")
    return 0


def register(hw_subparsers) -> None:
    p = hw_subparsers.add_parser(
        "probe", help="draft a hardware description from an attached Android phone (over adb)")
    p.add_argument("--device", required=True, metavar="SERIAL",
                   help="adb serial of the phone (or 127.0.0.1:PORT of the virtual device)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="write the draft here (NAME.yaml; new core files go beside it); default: print it")
    p.add_argument("--name", default=None,
                   help="the draft's name without -o (default: <matched name or SoC model>-probed)")
    p.add_argument("--compare", metavar="NAME",
                   help="report where this shipped SoC description disagrees with the device")
    p.add_argument("--json", action="store_true", help="print the draft, sources and comparison as JSON")
    add_adb_server_options(p)
    p.set_defaults(func=cmd_hw_probe)
