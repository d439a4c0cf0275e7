"""`xfc devices`: the Android devices the adb server sees, and which hardware description fits.

Registered by xfc/cli/main.py through `register(subparsers)`.
"""
from __future__ import annotations

import json
import sys

from ..errors import DeviceError
from .adb_options import add_adb_server_options

HINT = ("No device. Connect a phone with USB debugging enabled (Settings > Developer options), "
        "or start the virtual device:\n"
        "  python -m android_runner.virtual_device --port 5599 --soc snapdragon-865 &\n"
        "  adb connect 127.0.0.1:5599")


def cmd_devices(args) -> int:
    from ..runners.adb import default_host, default_port, device_rows
    host = args.adb_host or default_host()
    port = args.adb_port or default_port()
    error = None
    try:
        rows = device_rows(host, port, start_server=not args.no_start_server)
    except DeviceError as exc:
        rows, error = [], str(exc)
    for r in rows:   # matched by xfc.runners.identity, the same code `xfc bench` uses
        r["description"] = r["hardware"]
    if args.json:
        print(json.dumps({"adb_server": f"{host}:{port}", "error": error, "devices": rows},
                         indent=2))
        return 0
    header = ["serial", "state", "model", "ABI", "SoC", "hardware description"]
    table = []
    for r in rows:
        soc = r["soc"] or r["board_platform"] or "-"
        if r["soc"] and r["board_platform"]:
            soc = f"{r['soc']} ({r['board_platform']})"
        if r["description"]:
            hw = (f"{r['description']} (by {r['matched_by']})"
                  + (" (virtual device: emulated)" if r["virtual"] else ""))
        elif r.get("candidates"):
            hw = f"one of {', '.join(r['candidates'])} (same CPUs): pass --hw"
        elif r["state"] != "device":
            hw = "-"
        else:
            hw = "unknown SoC: pass --hw, or write hardware_descriptions/soc/<name>.yaml"
        table.append([r["serial"], r["state"], r["model"] or "-", r["abi"] or "-", soc, hw])
    widths = [max([len(h)] + [len(row[i]) for row in table]) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip())
    print("  ".join("-" * w for w in widths))
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    if error:
        print(f"\n(adb server {host}:{port}: {error})", file=sys.stderr)
    if not rows:
        print("\n" + HINT)
    for r in rows:
        if r["state"] == "unauthorized":
            print(f"\n{r['serial']}: accept the 'Allow USB debugging' prompt on the phone.")
        elif r["state"] == "device" and r["abi"] and r["abi"] != "arm64-v8a":
            print(f"\n{r['serial']}: ABI {r['abi']} cannot run xfc's arm64-v8a harnesses.")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "devices", help="list connected Android devices and their matching hardware description")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_adb_server_options(p)
    p.set_defaults(func=cmd_devices)
