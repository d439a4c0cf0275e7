"""xfc.compile: synthesize + render + build a CPU kernel -> Kernel (callable on numpy arrays when
built for this machine; otherwise the built artifact's paths). The build is the chain's
(stages.realize), so a compiled kernel is the same kernel `xfc synth` builds for the same plan."""
from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..errors import OperatorError, XfcError
from ..outputs import API_OUTPUT_NAMES, OutputDir
from ..runners.host import HostKernel
from . import stages
from .synth import plan_cpu


@dataclass(frozen=True)
class Kernel:
    """A synthesized, rendered and built CPU kernel.

    Built for this machine (an x86-64 description such as 'host'), it is callable on numpy arrays:
    `kernel(in0, in1[, bias]) -> out` (int8: `kernel(x, w, bias, mult)`), shaped as spec.input_shapes /
    spec.output_shape. Built for an ARM description, it is the static aarch64 harness at
    `files['binary']` (run it with `xfc bench`, or under qemu-aarch64); calling it raises XfcError.
    """

    spec: object
    hardware: str
    synthesis: object                       # xfc.cpu.explain.CpuSynthesis (.plan, .explain(), .report())
    files: dict = field(default_factory=dict)   # what was built: 'library' or 'binary', and the sources' directory
    host: Optional[HostKernel] = None

    @property
    def plan(self):
        return self.synthesis.plan

    def __call__(self, *operands):
        if self.host is None:
            raise XfcError(f"the kernel for {self.hardware} is an aarch64 binary ({self.files.get('binary')}); "
                           f"it cannot run in this process (use 'xfc bench' or qemu-aarch64)")
        return self.host(*operands)


def compile(spec, hw, *, target: str = "cpu", cluster: Optional[str] = None, threads: Optional[int] = None,
            evaluator=None, constants=None, lowering: str = "auto", dtype="fp32", quant=None,
            out_dir=None, force: bool = False) -> Kernel:   # noqa: A001  (the public name the issue asks for)
    """Plan (plan_cpu: evaluator and constants from a tile database, or the static model), render and
    build spec for hw. out_dir: where the sources and the built file go (default: a temporary
    directory, removed once the host library is loaded; an ARM build needs out_dir, since the binary
    must outlive the call); force: write beside files xfc did not write there."""
    if target != "cpu":
        raise OperatorError(f"compile supports target 'cpu' (GPU kernels: xfc.pipeline.run_gpu_synth), got {target!r}")
    result, _seconds = plan_cpu(spec, hw, dtype, cluster=cluster, threads=threads, evaluator=evaluator,
                                constants=constants, lowering=lowering, quant=quant)
    if result.plan.target_arch == "x86_64" and out_dir is None:
        with tempfile.TemporaryDirectory(prefix="xfc-compile-") as tmp:
            built = stages.realize(result.plan, Path(tmp))   # loaded now: the mapping outlives the file
        return Kernel(spec=spec, hardware=hw.name, synthesis=result, host=built.host)
    if out_dir is None:
        raise XfcError(f"compile for {hw.name} ({hw.target_arch}) builds a binary that must outlive the call: "
                       f"pass out_dir")
    out_dir = Path(out_dir)
    # Built in a staged directory committed under the output-ownership rules (xfc.outputs): a user's
    # directory with files xfc did not write is refused, never overwritten. A loaded host library
    # keeps its mapping across the rename.
    with OutputDir(out_dir, what=f"xfc.compile {spec.key()} for {hw.name}", force=force,
                   **API_OUTPUT_NAMES) as staging:
        built = stages.realize(result.plan, staging.path)
        staging.commit()
    files = {"dir": out_dir}
    if built.host is None:
        files["binary"] = out_dir / built.artifact.relative_to(staging.path)
    return Kernel(spec=spec, hardware=hw.name, synthesis=result, files=files, host=built.host)
