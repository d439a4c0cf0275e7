"""The one report every pipeline run returns (`xfc synth` on CPU and GPU, `xfc bench`): its schema
(docs/ARCHITECTURE.md, "Reports") and the Report type."""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping, Optional

from .._version import __version__
from ..runners import Measurement

REPORT_TARGETS = ("cpu", "gpu", "bench")
# The one report schema (docs/ARCHITECTURE.md, "Reports"): every report starts with these keys,
# with the same meaning and type whatever the command and target; target-specific keys follow.
REPORT_SCHEMA_VERSION = 2
REPORT_CORE_KEYS = ("xfc_report", "xfc_version", "command", "target", "operator", "shape", "hardware", "tiles",
                    "predicted_gflops", "verified", "failure", "max_abs_error", "error_to_bound_ratio", "measurement")


def report_core(command: str, target: str, spec, hardware: str, tiles, predicted_gflops) -> dict:
    """The keys every report starts with. shape: spec.describe(); measurement: measurement_dict()
    of the timed run, None until something ran; verified/failure/errors: None until verified."""
    return {"xfc_report": REPORT_SCHEMA_VERSION, "xfc_version": __version__, "command": command, "target": target,
            "operator": spec.name, "shape": spec.describe(), "hardware": hardware, "tiles": tiles,
            "predicted_gflops": predicted_gflops, "verified": None, "failure": None, "max_abs_error": None,
            "error_to_bound_ratio": None, "measurement": None}


def measurement_dict(m: Measurement, weights: Optional[str] = None) -> dict:
    """A Measurement in a report: Measurement.to_dict() plus GFLOP/s (and how weights were packed)."""
    out = {**m.to_dict(), "gflops": m.gflops}
    if weights is not None:
        out["weights"] = weights
    return out


@dataclass(frozen=True, eq=False)
class Report:
    """One pipeline run, for CPU and GPU kernels alike (`xfc synth`, `xfc synth --target gpu`,
    `xfc bench`). The typed fields are what code reads; `to_dict()` is report.json / `--json`.

    measurement: the timed run, or None when nothing was timed: the pre-packed entry point (CPU),
    the PoCL run (GPU), the device or qemu run (bench). per_call: CPU only, the weights packed
    inside every call. Both are runners.Measurement (with `where` and `emulated`: qemu, virtual
    device and PoCL timings are never phone timings). keys: every report key, in report order
    (the JSON schema per target is documented in docs/ARCHITECTURE.md, "Reports").
    """

    target: str                           # one of REPORT_TARGETS
    operator: str                         # spec.name: matmul, conv2d, depthwise
    hardware: str                         # the description's name
    verified: Optional[bool] = None       # None: not verified
    failure: Optional[str] = None         # why verification failed (None when it did not)
    measurement: Optional[Measurement] = None
    per_call: Optional[Measurement] = None
    output_dir: Optional[str] = None
    explain: Optional[str] = None
    keys: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.target not in REPORT_TARGETS:
            raise ValueError(f"report target must be one of {REPORT_TARGETS}, got {self.target!r}")
        object.__setattr__(self, "keys", MappingProxyType(dict(self.keys)))

    @staticmethod
    def of(target: str, keys: dict, *, hardware: str, measurement=None, per_call=None,
           output_dir: Optional[str] = None) -> "Report":
        """A Report from its report keys (the typed fields are read from the same keys)."""
        return Report(target=target, operator=str(keys.get("operator") or ""), hardware=hardware,
                      verified=keys.get("verified"), failure=keys.get("failure"), measurement=measurement,
                      per_call=per_call, output_dir=output_dir, explain=keys.get("explain"), keys=keys)

    def to_dict(self) -> dict:
        """report.json / --json: the keys, and the output directory when the run wrote one."""
        out = dict(self.keys)
        if self.output_dir is not None:
            out["output_dir"] = self.output_dir
        return out
