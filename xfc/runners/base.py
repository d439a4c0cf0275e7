"""The runner interface: run a built kernel somewhere, get its output and ONE Measurement back.

Five ways of running share it (docs/ARCHITECTURE.md):

    host   runners/host.HostRunner   the host .so, in this process through ctypes
    local  runners/qemu.LocalRunner  a host-native harness program (sanitizer builds)
    qemu   runners/qemu.QemuRunner   a static aarch64 harness under qemu-aarch64 (emulated)
    adb    runners/adb.AdbRunner     a phone, or android_runner's virtual device (emulated)
    pocl   runners/pocl.PoclRunner   an OpenCL kernel through the shape-free harness on PoCL

Every runner takes a RunSpec and returns a Measurement: `Runner.execute(spec) -> Measurement`.
`where` names where it ran; `emulated` is True whenever the timing is not the target device's
(qemu, the virtual device, PoCL on the host CPU): those timings are never phone timings.

The runners that ship a harness program somewhere (local, qemu, adb) share a life cycle
(HarnessRunner; `execute` does all of it, cleaning up in `finally`):

    ctx = runner.prepare(spec)   # stage inputs locally, choose a run id
    runner.upload(ctx)           # copy harness + inputs to where they run
    report = runner.run(ctx)     # run it; parse its timings; collect telemetry
    output = runner.fetch(ctx)   # bring OUT back as float32
    runner.cleanup(ctx)          # remove everything that was copied

The host library is already loaded in this process and PoCL runs a local program on local
files: neither uploads or fetches anything, so they implement `execute` directly.

A harness program has this command line ("json" protocol):

    ./harness IN_PATH... OUT_PATH [--repeat N] [--warmup W]

It reads its inputs as raw little-endian files (the RunSpec's input_types; float32 unless said
otherwise), runs its kernel (W warm-up runs, then N timed ones), writes OUT_PATH (output_type) and
prints exactly one JSON line on stdout:

    {"kernel": "...", "repeats": N, "median_s": x, "min_s": x, "max_s": x, "samples_s": [...]}

The CPU kernels' harnesses (templates/cpu/harness.c.j2 for fp32 and fp16, harness_int8.c.j2 for
int8: whatever the dtype, one contract) are the "times-file" protocol:

    ./harness OPERAND... OUT TIMES WARMUP REPEATS [prepacked]

with the kernel's operands in its entry point's order (fp32/fp16: IN0 IN1 BIAS; int8: X W BIAS
MULT), and write one sample (seconds) per line to TIMES; `prepacked` runs the pre-packed entry
point. A harness exits with HARNESS_EXIT_GUARD when a guard zone around a buffer changed, and with
HARNESS_EXIT_UNWRITTEN when an integer output element was never written (a wrong kernel either
way): every runner turns both into a VerificationError.

Medians, minima and maxima are computed in one place, Measurement.from_samples, from the samples.
"""
from __future__ import annotations

import json
import math
import shutil
import statistics
import tempfile
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from xfc.errors import DeviceError, OperatorError, ToolchainError, VerificationError

INPUT_NAMES = ("a", "b", "bias")      # the file names of three inputs; more are in3, in4, ...
PROTOCOLS = ("json", "times-file")

WHERE_VIRTUAL = "virtual-device (qemu-aarch64, emulated: not phone timing)"


def where_qemu(cpu: str) -> str:
    return f"qemu-aarch64 -cpu {cpu} (emulated: not phone timing)"


def where_adb(serial: str, model: str) -> str:
    return f"adb:{serial} ({model})"


# Exit status of a harness (CPU and OpenCL) when a guard zone around a buffer changed, and of an
# int8 harness when an output element was never written.
HARNESS_EXIT_GUARD = 5
HARNESS_EXIT_UNWRITTEN = 6
WRONG_KERNEL_LINES = ("xfc harness: guard violation", "xfc harness: unwritten output")


@dataclass(frozen=True)
class RunSpec:
    """What to run. Inputs are arrays (any shape; flattened C-order), raw bytes or raw files, in the
    kernel's operand order (xfc.ops.dtypes.KernelAbi)."""

    harness: Path                            # the built artifact: a harness program (local, qemu, adb),
                                             # the host .so (host) or an OpenCL kernel file (pocl)
    inputs: tuple[Any, ...]                 # np.ndarray | bytes | Path per operand (an optional one may be None)
    repeat: int = 5
    warmup: int = 1
    timeout_s: float = 120.0
    output_shape: tuple[int, ...] | None = None
    cpu_ids: tuple[int, ...] | None = None   # AdbRunner: pin to these CPUs (one cluster)
    env: tuple[tuple[str, str], ...] = ()    # extra environment for the harness
    label: str = ""
    protocol: str = "json"                   # "json" or "times-file" (see module docstring)
    march: str = ""                          # the -march it was built with (for SIGILL messages)
    prepacked: bool = False                  # the pre-packed entry point (host .so; times-file harness)
    input_shapes: tuple[tuple[int, ...], ...] | None = None   # checked before anything runs
    flops: int = 0                           # per call, for Measurement.gflops
    input_types: tuple[str, ...] | None = None   # numpy type strings of the staged files (None: all float32)
    output_type: str = "<f4"                 # numpy type string of the output elements

    def __post_init__(self):
        if self.protocol not in PROTOCOLS:
            raise DeviceError(f"unknown harness protocol '{self.protocol}'; "
                              f"known: {', '.join(PROTOCOLS)}")
        if not self.inputs:
            raise DeviceError("a run needs at least one input")
        for what, given in (("input_shapes", self.input_shapes), ("input_types", self.input_types)):
            if given is not None and len(given) != len(self.inputs):
                raise DeviceError(f"{len(self.inputs)} inputs but {len(given)} {what}")
        if self.repeat < 1:
            raise DeviceError(f"repeat must be >= 1, got {self.repeat}")
        if self.warmup < 0:
            raise DeviceError(f"warmup must be >= 0, got {self.warmup}")
        if self.timeout_s <= 0:
            raise DeviceError(f"timeout must be > 0 s, got {self.timeout_s}")

    def check_input_shapes(self, what: str) -> None:
        """OperatorError when an array input's shape is not the one the kernel was built for: bad input,
        not a wrong result (VerificationError, exit 4)."""
        if self.input_shapes is None:
            return
        names = ("in0", "in1", "bias") + tuple(f"in{i}" for i in range(3, len(self.inputs)))
        for name, value, shape in zip(names, self.inputs, self.input_shapes):
            if isinstance(value, np.ndarray) and value.shape != tuple(shape):
                raise OperatorError(f"{what}: {name} has shape {value.shape}, expected {tuple(shape)}")


@dataclass(frozen=True, eq=False)
class Measurement:
    """One run's output and timing. `where` always names where it was measured; `emulated` says
    that the timing is not the target device's (qemu, the virtual device, PoCL on the host CPU)."""

    samples_s: tuple[float, ...]
    median_s: float
    min_s: float
    max_s: float
    where: str
    emulated: bool = False
    output: np.ndarray | None = None        # float32, `output_shape` when given, else flat
    flops: int = 0                           # per call; 0 when the runner was not told
    device: dict = field(default_factory=dict)
    throttled: bool | None = None
    freq_before: dict = field(default_factory=dict)    # cpu id -> kHz
    freq_after: dict = field(default_factory=dict)
    temps_before: dict = field(default_factory=dict)   # thermal zone -> degrees C
    temps_after: dict = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    kernel: str = ""
    repeats: int = 0
    warmup: int = 0

    @staticmethod
    def from_samples(samples: Sequence[float], *, where: str, emulated: bool, **fields: Any) -> "Measurement":
        """The one place a median, minimum and maximum are computed. DeviceError without valid samples."""
        samples = tuple(float(s) for s in samples)
        if not samples or not all(math.isfinite(s) and s >= 0 for s in samples):
            raise DeviceError(f"no valid timing samples were produced ({where})")
        fields.setdefault("repeats", len(samples))
        return Measurement(samples_s=samples, median_s=statistics.median(samples), min_s=min(samples),
                           max_s=max(samples), where=where, emulated=emulated, **fields)

    @property
    def gflops(self) -> float:
        """GFLOP/s from the median (0 when flops is unknown)."""
        return (self.flops / self.median_s / 1e9) if self.median_s > 0 else float("inf")

    def summary(self) -> str:
        t = "throttled" if self.throttled else ("not throttled" if self.throttled is False
                                                  else "throttling unknown")
        return (f"{self.kernel or 'kernel'}: median {self.median_s * 1e3:.4f} ms "
                f"(min {self.min_s * 1e3:.4f}, max {self.max_s * 1e3:.4f}, n={self.repeats}) "
                f"on {self.where}; {t}")

    def to_dict(self) -> dict:
        return {
            "kernel": self.kernel, "where": self.where, "emulated": self.emulated,
            "repeats": self.repeats, "warmup": self.warmup,
            "median_s": self.median_s, "min_s": self.min_s, "max_s": self.max_s,
            "samples_s": list(self.samples_s), "device": dict(self.device),
            "throttled": self.throttled,
            "freq_before_khz": {str(k): v for k, v in self.freq_before.items()},
            "freq_after_khz": {str(k): v for k, v in self.freq_after.items()},
            "temps_before_c": dict(self.temps_before), "temps_after_c": dict(self.temps_after),
            "notes": list(self.notes),
            "output_shape": list(self.output.shape) if self.output is not None else None,
        }


@dataclass
class RunContext:
    """State of one run, shared by the life-cycle steps."""

    spec: RunSpec
    run_id: str
    local_dir: Path                          # host staging directory (removed by cleanup)
    input_files: list[Path] = field(default_factory=list)
    remote_dir: str = ""                     # where it runs (device path or local temp dir)
    uploaded: list[str] = field(default_factory=list)
    report: dict | None = None
    extra: dict = field(default_factory=dict)


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def input_names(count: int) -> tuple[str, ...]:
    """The names of a run's inputs (and of their staged files): a, b, bias, then in3, in4, ..."""
    return INPUT_NAMES[:count] + tuple(f"in{i}" for i in range(len(INPUT_NAMES), count))


def stage_inputs(spec: RunSpec, directory: Path) -> list[Path]:
    """Write the inputs as raw little-endian files of their types (input_types; float32 by default);
    return their paths."""
    paths = []
    types = spec.input_types or ("<f4",) * len(spec.inputs)
    for name, value, dtype in zip(input_names(len(spec.inputs)), spec.inputs, types):
        dest = directory / f"{name}.bin"
        if isinstance(value, (str, Path)):
            src = Path(value)
            if not src.is_file():
                raise DeviceError(f"input '{name}' file not found: {src}")
            shutil.copyfile(src, dest)
        elif isinstance(value, (bytes, bytearray, memoryview)):
            dest.write_bytes(bytes(value))
        elif value is None:   # no bias: the entry point still takes one (zeros it never reads)
            if spec.input_shapes is None:
                raise DeviceError(f"input '{name}' is None and the run names no input_shapes to size its zeros")
            dest.write_bytes(np.zeros(int(np.prod(spec.input_shapes[len(paths)])), dtype).tobytes())
        else:
            arr = np.ascontiguousarray(np.asarray(value, dtype=dtype))
            dest.write_bytes(arr.tobytes())
        paths.append(dest)
    return paths


def parse_report(stdout: str, where: str) -> dict:
    """The harness's single JSON line, checked. DeviceError when it is missing or malformed."""
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip().startswith("{")]
    if len(lines) != 1:
        tail = " | ".join(stdout.strip().splitlines()[-3:])[:300]
        raise DeviceError(f"harness on {where} printed {len(lines)} JSON lines instead of 1"
                          f"{': ' + tail if tail else ''}")
    try:
        report = json.loads(lines[0])
    except json.JSONDecodeError as exc:
        raise DeviceError(f"harness on {where} printed invalid JSON: {exc}") from None
    for key in ("median_s", "min_s", "max_s", "samples_s"):
        if key not in report:
            raise DeviceError(f"harness report on {where} lacks '{key}'")
    samples = report["samples_s"]
    if not isinstance(samples, list) or not samples or not all(
            isinstance(x, (int, float)) and math.isfinite(x) and x >= 0 for x in samples):
        raise DeviceError(f"harness report on {where} has invalid samples_s")
    return report


def harness_args(spec: "RunSpec", inputs: Sequence[str], out: str, times: str) -> list[str]:
    """The harness's arguments (after argv[0]) for the spec's protocol."""
    if spec.protocol == "times-file":
        return [*inputs, out, times, str(spec.warmup), str(spec.repeat)] + (["prepacked"] if spec.prepacked else [])
    if spec.prepacked:
        raise DeviceError("only the times-file harness has a pre-packed entry point")
    return [*inputs, out, "--repeat", str(spec.repeat), "--warmup", str(spec.warmup)]


def report_from_times(text: str, where: str, kernel: str = "") -> dict:
    """A report like the JSON line (its samples; Measurement.from_samples computes the rest),
    from a TIMES file (one sample in seconds per line)."""
    try:
        samples = [float(x) for x in text.split()]
    except ValueError:
        raise DeviceError(f"harness on {where} wrote a TIMES file that is not numbers") from None
    if not samples or not all(math.isfinite(x) and x >= 0 for x in samples):
        raise DeviceError(f"harness on {where} wrote no valid timing samples")
    return {"kernel": kernel, "repeats": len(samples), "samples_s": samples}


def load_output(data: bytes, spec: RunSpec, where: str) -> np.ndarray:
    dtype = np.dtype(spec.output_type)
    if len(data) % dtype.itemsize:
        raise DeviceError(f"output from {where} is {len(data)} bytes, not a {dtype.name} array")
    out = np.frombuffer(data, dtype=dtype).astype(dtype.newbyteorder("="))
    if spec.output_shape is not None:
        want = int(np.prod(spec.output_shape))
        if out.size != want:
            raise DeviceError(f"output from {where} has {out.size} values, expected {want} "
                              f"for shape {tuple(spec.output_shape)}")
        out = out.reshape(spec.output_shape)
    return out


class Runner(ABC):
    """Run a built kernel (RunSpec) and return its output and timing (Measurement)."""

    #: where measurements are taken, e.g. "qemu-aarch64 -cpu max (emulated: not phone timing)"
    where: str = ""
    #: True when the timing is not the target device's
    emulated: bool = True

    def describe(self) -> dict:
        """Device fingerprint recorded with every result."""
        return {}

    @abstractmethod
    def execute(self, spec: RunSpec) -> Measurement: ...


class HarnessRunner(Runner):
    """Ship a harness program, run it, fetch the output. Subclasses fill in the steps."""

    def prepare(self, spec: RunSpec) -> RunContext:
        if not Path(spec.harness).is_file():
            raise ToolchainError(f"harness binary not found: {spec.harness}")
        spec.check_input_shapes(f"run of {Path(spec.harness).name}")
        run_id = new_run_id()
        local = Path(tempfile.mkdtemp(prefix=f"xfc-run-{run_id}-"))
        ctx = RunContext(spec=spec, run_id=run_id, local_dir=local)
        try:
            ctx.input_files = stage_inputs(spec, local)
        except BaseException:  # an interrupt too: never leave the run directory behind
            shutil.rmtree(local, ignore_errors=True)
            raise
        return ctx

    @abstractmethod
    def upload(self, ctx: RunContext) -> None: ...

    @abstractmethod
    def run(self, ctx: RunContext) -> dict: ...

    @abstractmethod
    def fetch(self, ctx: RunContext) -> np.ndarray: ...

    def cleanup(self, ctx: RunContext) -> None:
        shutil.rmtree(ctx.local_dir, ignore_errors=True)

    def build_result(self, ctx: RunContext, output: np.ndarray) -> Measurement:
        rep = ctx.report or {}
        tele = ctx.extra.get("telemetry", {})
        notes = list(ctx.extra.get("notes", []))
        if self.emulated:
            notes.insert(0, "timings are emulated (qemu-aarch64) and say nothing about phone speed")
        return Measurement.from_samples(
            rep["samples_s"], where=self.where, emulated=self.emulated,
            output=output, flops=ctx.spec.flops, device=self.describe(),
            throttled=tele.get("throttled"),
            freq_before=tele.get("freq_before", {}), freq_after=tele.get("freq_after", {}),
            temps_before=tele.get("temps_before", {}), temps_after=tele.get("temps_after", {}),
            notes=tuple(notes), kernel=str(rep.get("kernel", "")),
            repeats=int(rep.get("repeats", len(rep["samples_s"]))), warmup=ctx.spec.warmup,
        )

    def execute(self, spec: RunSpec) -> Measurement:
        """prepare, upload, run, fetch; cleanup always."""
        ctx = self.prepare(spec)
        try:
            self.upload(ctx)
            self.run(ctx)
            output = self.fetch(ctx)
            return self.build_result(ctx, output)
        except DeviceError as exc:  # the harness found a changed guard zone or an unwritten output: a wrong kernel
            if any(line in str(exc) for line in WRONG_KERNEL_LINES):
                raise VerificationError(str(exc)) from None
            raise
        finally:
            self.cleanup(ctx)


def guard_violation(stderr: str, what: str) -> VerificationError:
    """The one line a harness printed about a changed guard zone, as a VerificationError."""
    line = next((ln.strip() for ln in stderr.splitlines()
                 if "guard violation" in ln or "unwritten output" in ln), stderr.strip())
    line = line.replace("xfc harness: ", "", 1).replace("harness: ", "", 1)
    return VerificationError(f"{what}: {line[:300]}")


def make_spec(harness: str | Path, a: Any, b: Any, bias: Any = None, **kw: Any) -> RunSpec:
    """Convenience: RunSpec from positional inputs."""
    return RunSpec(harness=Path(harness), inputs=(a, b, bias), **kw)


def hexmask(cpu_ids: Sequence[int]) -> str:
    """taskset mask for a set of CPU ids, e.g. [4, 5, 6, 7] -> 'f0'."""
    ids = sorted(set(int(c) for c in cpu_ids))
    if not ids or ids[0] < 0:
        raise DeviceError(f"invalid cpu ids for pinning: {list(cpu_ids)}")
    mask = 0
    for c in ids:
        mask |= 1 << c
    return format(mask, "x")
