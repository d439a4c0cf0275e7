"""`xfc hw probe`: draft a hardware description from an attached Android phone.

    parse.py    raw device text (getprop, /proc/cpuinfo in both arm64 formats, sysfs, meminfo) -> facts
    facts.py    DeviceFacts and the CPU clusters (cpufreq policies) they form
    draft.py    facts -> a SoC description in the shipped schema (+ core files for unknown parts),
                every value with its source; what the device cannot show is listed under `uncertain`
    compare.py  where a shipped description disagrees with the device
    render.py   YAML with sources as comments, validation, writing through xfc.outputs
    device.py   the only I/O: reading the phone through xfc.runners.adb

Everything but device.py (and render.write_draft) is pure.
"""
from __future__ import annotations

from .compare import Comparison, Difference, compare
from .draft import CoreDraft, Draft, draft_description
from .facts import ClusterFacts, DeviceFacts, cluster_facts, facts_from_files
from xfc.hardware.cpuinfo import Cpuinfo, parse_cpuinfo
from .render import draft_json, render_draft, validate_draft, write_draft

__all__ = ["Comparison", "Difference", "compare", "CoreDraft", "Draft", "draft_description", "ClusterFacts",
           "DeviceFacts", "cluster_facts", "facts_from_files", "Cpuinfo", "parse_cpuinfo", "draft_json",
           "render_draft", "validate_draft", "write_draft"]
