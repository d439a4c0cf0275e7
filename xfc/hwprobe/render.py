"""Draft -> YAML text with each value's source as a comment; writing the files.

The YAML is emitted by hand (a small, fixed shape: mappings, lists of mappings, flow lists of
scalars) so that every value can carry its source beside it; strings are written double-quoted
with JSON escapes, which YAML reads back unchanged. Files are written through xfc.outputs: a
draft replaces only a file whose first line shows xfc hw probe wrote it.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Mapping, Optional

from xfc import __version__
from xfc.errors import HardwareError
from xfc.hardware import HardwareDescription, validate_file
from xfc.outputs import OutputError, claim_file, write_owned_file

from .draft import Draft

OWNER_LINE = "# xfc hw probe draft"
_HEX_KEYS = ("implementer", "part")


def _scalar(key: str, value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value:#x}" if key in _HEX_KEYS else str(value)
    if isinstance(value, float):
        return repr(value)
    return json.dumps(str(value))


def _comment(provenance: Mapping[str, str], path: str) -> str:
    src = provenance.get(path)
    if not src:
        return ""
    return "  # " + " ".join(str(src).split()).replace("#", "no.")


def _flow(key: str, value) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_scalar(k, v)}" for k, v in value.items()) + "}"
    return _scalar(key, value)


def _emit(data: Mapping, provenance: Mapping[str, str], indent: str, prefix: str, out: list[str]) -> None:
    for key, value in data.items():
        path = f"{prefix}{key}"
        if key == "notes" and isinstance(value, str):
            out.append(f"{indent}notes: |")
            out.extend(f"{indent}  {' '.join(line.split()) or '.'}" for line in value.splitlines())
        elif isinstance(value, dict):
            out.append(f"{indent}{key}:{_comment(provenance, path)}")
            _emit(value, provenance, indent + "  ", f"{path}.", out)
        elif isinstance(value, list) and key in ("sources", "uncertain"):
            if not value:
                out.append(f"{indent}{key}: []")
                continue
            out.append(f"{indent}{key}:")
            out.extend(f"{indent}- {_scalar(key, v)}" for v in value)
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value) and key == "clusters":
            out.append(f"{indent}{key}:")
            for item in value:
                first = True
                for k, v in item.items():
                    lead = f"{indent}- " if first else f"{indent}  "
                    first = False
                    cpath = f"{path}.{item.get('role')}.{k}"
                    if isinstance(v, list) and v and isinstance(v[0], dict):
                        out.append(f"{lead}{k}:{_comment(provenance, cpath)}")
                        out.extend(f"{indent}  - {_flow(k, x)}" for x in v)
                    elif isinstance(v, list):
                        out.append(f"{lead}{k}: [{', '.join(_scalar(k, x) for x in v)}]{_comment(provenance, cpath)}")
                    else:
                        out.append(f"{lead}{k}: {_scalar(k, v)}{_comment(provenance, cpath)}")
        elif isinstance(value, list):
            out.append(f"{indent}{key}: [{', '.join(_flow(key, v) for v in value)}]{_comment(provenance, path)}")
        else:
            out.append(f"{indent}{key}: {_scalar(key, value)}{_comment(provenance, path)}")


def render_yaml(data: Mapping, provenance: Mapping[str, str], serial: str, what: str) -> str:
    lines = [f"{OWNER_LINE} ({what}) written by xfc {__version__} from device {serial}.",
             "# Each comment names where the value came from; fields under 'uncertain' were not read from",
             "# the device (placeholders or the matched shipped description): check them."]
    _emit(data, provenance, "", "", lines)
    return "\n".join(lines) + "\n"


def render_draft(draft: Draft) -> dict[str, str]:
    """File name -> YAML text: the SoC file and any new core files."""
    files = {f"{draft.name}.yaml": render_yaml(draft.data, draft.provenance, draft.serial, "SoC")}
    for core in draft.new_cores:
        files[f"{core.name}.yaml"] = render_yaml(core.data, core.provenance, draft.serial, "CPU core")
    return files


def is_probe_draft(path: Path) -> bool:
    """A file xfc hw probe wrote (its first line says so)."""
    with open(path, "rb") as f:
        return f.readline().startswith(OWNER_LINE.encode())


def validate_draft(draft: Draft) -> HardwareDescription:
    """Load the rendered draft with the strict loader (in a temporary directory)."""
    files = render_draft(draft)
    with tempfile.TemporaryDirectory(prefix="xfc-probe-") as tmp:
        for name, text in files.items():
            (Path(tmp) / name).write_text(text)
        try:
            return validate_file(Path(tmp) / f"{draft.name}.yaml")
        except HardwareError as exc:
            raise HardwareError(f"the draft for device {draft.serial} does not validate ({exc}); "
                                "please report this with the device's /proc/cpuinfo") from None


def write_draft(draft: Draft, dest: Path, option: str = "-o") -> list[Path]:
    """Write the SoC file to `dest` (its stem is the draft's name) and new core files beside it.

    Refuses (OutputError, exit 2) before writing anything when one of the files exists and was
    not written by xfc hw probe. Core files go first, so the SoC file never names a missing one."""
    dest = Path(dest)
    if dest.suffix != ".yaml" or dest.stem != draft.name:
        raise OutputError(f"{option} {dest}: the draft is named '{draft.name}', so its file must be {draft.name}.yaml")
    files = render_draft(draft)
    targets = {name: dest.with_name(name) for name in files}
    for name, target in targets.items():
        claim_file(target, is_probe_draft, option=option if target == dest else f"{option} (core file)")
    written = []
    for name in sorted(files, key=lambda n: n == dest.name):
        written.append(write_owned_file(targets[name], files[name], is_probe_draft, option=option))
    return written


def draft_json(draft: Draft, hw: Optional[HardwareDescription] = None) -> dict:
    """The draft as JSON (for --json): the files, every value's source, notes and facts read."""
    facts = draft.facts
    return {
        "serial": draft.serial, "name": draft.name, "matched": draft.match.name,
        "matched_by": draft.match.how or None, "candidates": list(draft.match.candidates),
        "soc": draft.data, "provenance": dict(draft.provenance), "uncertain": list(draft.uncertain),
        "new_cores": [{"name": c.name, "data": c.data, "provenance": dict(c.provenance)} for c in draft.new_cores],
        "notes": list(draft.notes),
        "device": {
            "model": facts.prop("ro.product.model"), "android_version": facts.prop("ro.build.version.release"),
            "sdk": facts.prop("ro.build.version.sdk"), "abi": facts.prop("ro.product.cpu.abi"),
            "abilist": facts.prop("ro.product.cpu.abilist"),
            "cpuinfo_format": facts.cpuinfo.format,
            "mem_total_bytes": facts.mem_total_bytes,
            "vendor_opencl": facts.vendor_opencl,
            "clusters": [{"role": role, "cpu_ids": list(cf.cpu_ids), "max_clock_ghz": cf.max_clock_ghz,
                          "min_clock_ghz": cf.min_clock_ghz, "cpu_part": cf.midr.text if cf.midr else None,
                          "features": list(cf.hwcaps),
                          "l1d_bytes": cf.l1d.size_bytes if cf.l1d else None,
                          "l2_bytes": cf.l2.size_bytes if cf.l2 else None,
                          "l2_shared_by_cores": cf.l2_shared_by} for role, cf in draft.clusters],
        },
        "validated": hw is not None,
    }


__all__ = ["render_yaml", "render_draft", "validate_draft", "write_draft", "draft_json", "is_probe_draft",
           "OWNER_LINE", "OutputError"]
