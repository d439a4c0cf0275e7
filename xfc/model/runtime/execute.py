"""Run the network's benchmark program where the network is meant to run.

    host   the program built natively, run on this machine
    qemu   the static aarch64 program under qemu-aarch64 -cpu <model> (emulated: never phone timing)
    adb    the static aarch64 program on a phone (or the virtual device) through xfc.runners.adb,
           pinned to the cluster's CPUs, governor / clocks / temperatures read before and after

Each takes the same request (weights, input files, where the outputs and the step dumps go, the
program's options) and returns the program's JSON line as a dict, with where it ran.
"""
from __future__ import annotations

import json
import shlex
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from ...toolchain import procs
from ...toolchain.tools import QEMU, require_tool
from ...errors import DeviceError, VerificationError

RUN_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class ProgramRequest:
    binary: Path
    weights: Path
    inputs: tuple[Path, ...] = ()          # raw fp32 per graph input; empty: --random
    outputs_dir: Optional[Path] = None     # --outputs
    dump_dir: Optional[Path] = None        # --dump
    warmup: int = 3
    runs: int = 20
    threads: int = 0
    seed: int = 0
    output_count: int = 0
    step_outputs: tuple[int, ...] = ()     # outputs per step (the dump's files)
    env: tuple[tuple[str, str], ...] = ()  # the program's extra environment (OMP_WAIT_POLICY)
    profile: bool = False                  # --profile: the median time of every step ("steps_ms")


@dataclass(frozen=True)
class ProgramResult:
    report: dict                           # the program's JSON line
    where: str
    emulated: bool
    telemetry: dict = field(default_factory=dict)


def program_args(req: ProgramRequest, path=str) -> list[str]:
    """The program's options; `path` maps a local path to where the program sees it."""
    args = ["--weights", path(req.weights)]
    if req.inputs:
        for p in req.inputs:
            args += ["--input", path(p)]
    else:
        args += ["--random", "--seed", str(req.seed)]
    args += ["--warmup", str(req.warmup), "--runs", str(req.runs), "--threads", str(req.threads)]
    if req.outputs_dir is not None:
        args += ["--outputs", path(req.outputs_dir)]
    if req.dump_dir is not None:
        args += ["--dump", path(req.dump_dir)]
    if req.profile:
        args.append("--profile")
    return args


def _parse(stdout: str, what: str) -> dict:
    line = next((ln for ln in reversed(stdout.splitlines()) if ln.startswith("{")), None)
    if line is None:
        raise DeviceError(f"{what} printed no JSON line: {stdout.strip()[:200]!r}")
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        raise DeviceError(f"{what} printed a malformed JSON line: {line[:200]!r}") from None


def _local(argv: list[str], what: str, env=()) -> dict:
    try:
        proc = procs.run(argv, timeout=RUN_TIMEOUT_S, env_extra=dict(env) or None)
    except subprocess.TimeoutExpired:
        raise DeviceError(f"{what} timed out after {RUN_TIMEOUT_S:.0f} s: {shlex.join(argv[:3])} ...") from None
    except OSError as exc:
        raise DeviceError(f"{what} could not start: {exc}") from None
    if proc.returncode < 0 or proc.returncode > 128:
        sig = -proc.returncode if proc.returncode < 0 else proc.returncode - 128
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        raise VerificationError(f"{what} died with signal {name}: {(proc.stderr or '').strip()[:200]}")
    if proc.returncode != 0:
        raise DeviceError(f"{what} failed (exit {proc.returncode}): {(proc.stderr or proc.stdout or '').strip()[:300]}")
    return _parse(proc.stdout, what)


class HostProgram:
    where = "host (native benchmark program)"
    emulated = False

    def run(self, req: ProgramRequest) -> ProgramResult:
        report = _local([str(req.binary), *program_args(req)], f"benchmark program {req.binary.name}", req.env)
        return ProgramResult(report=report, where=self.where, emulated=False)


class QemuProgram:
    emulated = True

    def __init__(self, cpu: str = "max"):
        self.cpu = cpu or "max"

    @property
    def where(self) -> str:
        return f"qemu-aarch64 -cpu {self.cpu} (emulated: not phone timing)"

    def run(self, req: ProgramRequest) -> ProgramResult:
        qemu = require_tool(QEMU)
        report = _local([qemu, "-cpu", self.cpu, str(req.binary), *program_args(req)],
                        f"benchmark program {req.binary.name} under qemu-aarch64", req.env)
        return ProgramResult(report=report, where=self.where, emulated=True)


class AdbProgram:
    """The program on a device through an xfc.runners.adb.AdbRunner (already connected)."""

    def __init__(self, runner, cpu_ids: Sequence[int] = ()):
        self.runner = runner
        self.cpu_ids = tuple(cpu_ids)

    @property
    def where(self) -> str:
        return self.runner.where

    @property
    def emulated(self) -> bool:
        return bool(self.runner.emulated)

    def run(self, req: ProgramRequest) -> ProgramResult:
        files = [req.binary, req.weights, *req.inputs]
        pulls = []
        if req.outputs_dir is not None:
            pulls += [(f"outputs/output{j}.f32", req.outputs_dir / f"output{j}.f32") for j in range(req.output_count)]
        if req.dump_dir is not None:
            pulls += [(f"dump/step{i}_{k}.f32", req.dump_dir / f"step{i}_{k}.f32")
                      for i, n in enumerate(req.step_outputs) for k in range(n)]
        dirs = [d for d, on in (("outputs", req.outputs_dir is not None), ("dump", req.dump_dir is not None)) if on]
        mapping = {str(req.weights): req.weights.name, **{str(p): p.name for p in req.inputs},
                   **({str(req.outputs_dir): "outputs"} if req.outputs_dir is not None else {}),
                   **({str(req.dump_dir): "dump"} if req.dump_dir is not None else {})}
        args = program_args(req, path=lambda p: "{dir}/" + mapping[str(p)])
        stdout, telemetry = self.runner.run_program(files, args, mkdirs=dirs, pulls=pulls, cpu_ids=self.cpu_ids,
                                                    timeout=RUN_TIMEOUT_S, env=req.env)
        return ProgramResult(report=_parse(stdout, f"benchmark program {req.binary.name} on {self.where}"),
                             where=self.where, emulated=self.emulated, telemetry=telemetry)
