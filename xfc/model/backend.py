"""The seam between `xfc model` and xfc's kernel pipeline: synthesize one layer, build one layer.

`xfc model` calls xfc's pipeline only through the two functions here. Today they use
xfc.cpu.synth.synthesize_cpu, xfc.cpu.codegen.render_cpu_kernel and xfc.build.cpu (host gcc +
ctypes, or the aarch64 cross compiler); when xfc gains one library pipeline for CPU and GPU,
this module is the one to point at it (ARM/qemu and GPU runs, tile database, --emit lib).

A LayerKernel runs like xfc.runners.host.HostKernel: `prepack(weight)` once, then
`run_packed(x, packed, bias)`; `__call__(x, weight, bias)` packs on every call (for a MatMul
whose B is not a constant).
"""
from __future__ import annotations

import dataclasses
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

PREDICTION_SOURCES = {"static": "static"}   # micro_tile_source -> report label; tile_db:* -> calibrated


def prediction_source(micro_tile_source: str) -> str:
    """'static' (cost model only), 'calibrated' (micro-tiles scored from a measured tile database)."""
    return PREDICTION_SOURCES.get(micro_tile_source, "calibrated" if micro_tile_source.startswith("tile_db")
                                  else micro_tile_source)


@dataclass(frozen=True)
class LayerSynthesis:
    spec: object                     # OperatorSpec
    result: object                   # xfc.cpu.explain.CpuSynthesis
    seconds: float                   # synthesis time (this call only)

    @property
    def predicted_s(self) -> float:
        return self.result.estimate.predicted_s

    @property
    def source(self) -> str:
        return prediction_source(self.result.micro_tile_source)

    @property
    def tiles(self) -> str:
        line = next((ln for ln in self.result.plan.header_lines if ln.startswith("tiles:")), "tiles: ?")
        return line[len("tiles:"):].strip()


def synthesize_layer(spec, hw, *, cluster: Optional[str] = None, threads: Optional[int] = None,
                     evaluator=None) -> LayerSynthesis:
    """Synthesize one layer's kernel (pure; timed here). `evaluator`: a measured tile database's
    MicroTileEvaluator when one exists, else the static model."""
    from ..cpu.synth import synthesize_cpu
    start = time.perf_counter()
    result = synthesize_cpu(spec, hw, cluster=cluster, threads=threads, evaluator=evaluator)
    return LayerSynthesis(spec=spec, result=result, seconds=time.perf_counter() - start)


@dataclass(frozen=True, eq=False)
class LayerKernel:
    """One distinct layer's kernel, built. `host` is None when it cannot run here (ARM build)."""

    name: str                        # e.g. 'k03_conv2d'; the C symbol is xfc_<name>
    synthesis: LayerSynthesis
    files: tuple[Path, ...]          # what it leaves for the output directory (sources, build script, binary)
    build_seconds: float
    host: object = None              # xfc.runners.host.HostKernel

    @property
    def spec(self):
        return self.synthesis.spec

    def _need_host(self):
        if self.host is None:
            from ..errors import OperatorError
            raise OperatorError(f"kernel {self.name} was built for {self.synthesis.result.hardware}, "
                                f"not for this machine")
        return self.host

    def prepack(self, weight: np.ndarray) -> np.ndarray:
        return self._need_host().prepack(weight)

    def run_packed(self, x: np.ndarray, packed: np.ndarray, bias: np.ndarray) -> np.ndarray:
        return self._need_host().run_packed(x, packed, bias)

    def __call__(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
        return self._need_host()(x, weight, bias)


def build_layer_kernel(spec, hw, *, name: str, work_dir: Path, cluster: Optional[str] = None,
                       threads: Optional[int] = None, synthesis: Optional[LayerSynthesis] = None) -> LayerKernel:
    """Synthesize (unless given), render and build one layer's kernel in work_dir/<name>/.

    Host descriptions (x86_64) build a shared library loaded with ctypes; AArch64 descriptions
    cross-build the static harness (runs under qemu come with the library pipeline). The kernel's
    C symbol is xfc_<name>, so the files of every layer can sit side by side in one flat output
    directory (the build script is renamed build_<name>.sh).
    """
    from ..build.cpu import build_arm, build_host
    from ..runners.host import HostKernel
    from ..cpu.codegen import render_cpu_kernel
    synthesis = synthesis or synthesize_layer(spec, hw, cluster=cluster, threads=threads)
    plan = dataclasses.replace(synthesis.result.plan, function_name=f"xfc_{name}")
    rendered = render_cpu_kernel(plan)
    layer_dir = Path(work_dir) / name
    start = time.perf_counter()
    host = None
    if hw.target_arch == "x86_64":
        host = HostKernel(rendered, build_host(rendered, layer_dir))
        produced = [host.library]
        script = "build.sh"
    else:
        produced = [build_arm(rendered, layer_dir)]
        script = "build_arm.sh"
    seconds = time.perf_counter() - start
    files = [layer_dir / f"{plan.function_name}.c", layer_dir / f"{plan.function_name}_harness.c", *produced]
    renamed = layer_dir / f"{script[:-3]}_{name}.sh"
    shutil.copy2(layer_dir / script, renamed)
    files.append(renamed)
    return LayerKernel(name=name, synthesis=synthesis, files=tuple(files), build_seconds=seconds, host=host)
