"""The seam between `xfc model` and xfc's kernel pipeline: synthesize one layer, build one layer,
and run it where it was asked to run.

`xfc model` calls xfc's pipeline only through this module (the lead adapts these calls when the
runners and the build move):

  CPU synthesis       xfc.cpu.synth.synthesize_cpu (the tile database's evaluator when given)
  CPU render/build    xfc.cpu.codegen.render_cpu_kernel, xfc.toolchain.cpu.build_host / build_arm
  CPU runs            host: ctypes (xfc.runners.host.HostKernel, in-process); ARM: the static aarch64 harness through
                      xfc.runners (get_runner('qemu') or an ADB serial; RunSpec, times-file protocol)
  GPU                 xfc.gpu.synth.synthesize_gpu, xfc.gpu.codegen.render_kernel, the shape-free
                      OpenCL harness (xfc.toolchain.opencl) run on PoCL (xfc.runners.pocl): host CPU,
                      never a phone GPU timing

Every built layer is a LayerKernel that runs like xfc.runners.host.HostKernel: `prepack(weight)` once,
then `run_packed(x, packed, bias)`; `__call__(x, weight, bias)` packs on every call (a MatMul
whose B is not a constant). Kernels that run out of process (qemu, a device, PoCL) take the plain
weights as their "packed" form: the harness packs them on each call.
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
TARGETS = ("cpu", "gpu")
RUN_TIMEOUT_S = 600.0


def prediction_source(micro_tile_source: str) -> str:
    """'static' (cost model only), 'calibrated' (micro-tiles scored from a measured tile database)."""
    return PREDICTION_SOURCES.get(micro_tile_source, "calibrated" if micro_tile_source.startswith("tile_db")
                                  else micro_tile_source)


@dataclass(frozen=True)
class LayerSynthesis:
    """One distinct layer's synthesis, CPU (xfc.cpu.explain.CpuSynthesis) or GPU (GpuSynthesis)."""

    spec: object                     # OperatorSpec
    result: object                   # CpuSynthesis or GpuSynthesis
    seconds: float                   # synthesis time (this call only)
    target: str = "cpu"

    @property
    def predicted_s(self) -> float:
        if self.target == "gpu":
            return self.result.plan.cost.seconds
        if not hasattr(self.result, "estimate"):      # int8: the issue model's rate
            return self.result.predicted_s
        return self.result.estimate.predicted_s

    @property
    def source(self) -> str:
        if self.target == "gpu":
            return "static"
        return prediction_source(self.result.micro_tile_source)

    @property
    def tiles(self) -> str:
        if self.target == "gpu":
            return self.result.plan.tile_summary()
        if not hasattr(self.result, "levels"):          # int8: no level tiles, one register tile or block
            return self.result.summary_line()
        line = next((ln for ln in self.result.plan.header_lines if ln.startswith("tiles:")), "tiles: ?")
        return line[len("tiles:"):].strip()

    def details(self) -> dict:
        """The report's per-kernel synthesis fields."""
        if self.target == "gpu":
            plan = self.result.plan
            return {"lowering": f"opencl ({plan.family}, {plan.variant})", "isa": "opencl",
                    "gpu": plan.gpu_name, "levels": [{"level": k, "tile": str(v)} for k, v in plan.tiles().items()],
                    "predicted_gflops": plan.cost.gflops, "predicted_bound": plan.cost.bound,
                    "candidates_evaluated": self.result.candidates_evaluated}
        r = self.result
        return {"lowering": r.plan.lowering, "isa": r.plan.isa, "winograd_m": r.plan.winograd_m,
                "levels": [{"level": lv.level, "tile": lv.tile, "usage": lv.usage, "decided_by": lv.decided_by}
                           for lv in r.levels],
                "predicted_gflops": r.estimate.predicted_gflops, "predicted_bound": r.estimate.bound}

    def explain(self) -> str:
        return self.result.explain()


def synthesize_layer(spec, hw, *, target: str = "cpu", cluster: Optional[str] = None,
                     threads: Optional[int] = None, evaluator=None, dtype: str = "fp32",
                     quant=None, weights_from_memory: bool = False) -> LayerSynthesis:
    """Synthesize one layer's kernel (pure; timed here). `evaluator`: a measured tile database's
    MicroTileEvaluator when one exists, else the static model (CPU only). dtype 'fp16' (CPU): the
    neon_fp16 kernel (xfc.cpu.fp16.synthesize_fp16: static model, direct lowering); 'int8' (CPU):
    xfc's int8 kernel for the QuantParams `quant` (xfc.cpu.int8_synth.plan_int8).
    weights_from_memory (fp32 CPU): plan the layer to read its weights from DRAM on every call, as
    a layer of a network whose weights exceed the shared cache does (synthesize_cpu)."""
    start = time.perf_counter()
    if dtype == "int8":    # the chain's int8 planner (the host's VNNI read from its flags)
        from ..pipeline.synth import plan_cpu
        result, _seconds = plan_cpu(spec, hw, "int8", cluster=cluster, threads=threads, quant=quant)
    elif target == "gpu":
        from ..gpu.synth import synthesize_gpu
        result = synthesize_gpu(spec, hw, dtype="fp32")
    elif dtype == "fp16":
        from ..cpu.fp16 import synthesize_fp16
        result = synthesize_fp16(spec, hw, cluster=cluster, threads=threads)
    else:
        from ..cpu.synth import synthesize_cpu
        # Any lowering the synthesizer picks: a Winograd layer's network error bound uses the
        # Winograd magnitude (bounds.winograd_layer_bound; run.py reads the plan's winograd_m).
        result = synthesize_cpu(spec, hw, cluster=cluster, threads=threads, evaluator=evaluator,
                                weights_from_memory=weights_from_memory)
    return LayerSynthesis(spec=spec, result=result, seconds=time.perf_counter() - start, target=target)


# ---------------------------------------------------------------------------------------------
# Where a layer runs
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Placement:
    """Where built layers run. device: None (host in-process, or qemu-aarch64 for an ARM
    description), 'qemu', or an ADB serial; runner: an xfc.runners Runner already made for it."""

    device: Optional[str] = None
    runner: object = None
    adb_host: Optional[str] = None
    adb_port: Optional[int] = None

    def runner_for(self, qemu_cpu: str):
        from ..runners import get_runner
        if self.runner is not None:
            return self.runner
        if self.device in (None, "qemu"):
            return get_runner("qemu", qemu_cpu=qemu_cpu or "max")
        return get_runner(self.device, adb_host=self.adb_host, adb_port=self.adb_port)


def _fp32(a, shape) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a, np.float32).reshape(shape))


class _PerCallKernel:
    """A built artifact run through an xfc Runner on every call; the harness packs the weights
    inside every call, so the "packed" form is the plain weights."""

    def __init__(self, artifact: Path, spec, runner, **run_options):
        self.artifact, self.spec, self.runner = Path(artifact), spec, runner
        self.run_options = run_options   # extra RunSpec fields (pinning, protocol, -march, label)
        self.last = None                 # the last Measurement (where, timings, emulated)

    def run(self, x, weight, bias, repeat: int = 1, warmup: int = 0):
        from ..runners import RunSpec
        shapes = self.spec.operand_shapes
        zeros = np.zeros(shapes[2], np.float32) if bias is None else bias
        self.last = self.runner.execute(RunSpec(
            harness=self.artifact, inputs=(_fp32(x, shapes[0]), _fp32(weight, shapes[1]), _fp32(zeros, shapes[2])),
            repeat=repeat, warmup=warmup, timeout_s=RUN_TIMEOUT_S, output_shape=tuple(self.spec.output_shape),
            flops=self.spec.flops, **self.run_options))
        return self.last.output

    def prepack(self, weight):
        return np.array(weight, np.float32, copy=True)

    def run_packed(self, x, packed, bias):
        return self.run(x, packed, bias)

    def __call__(self, x, weight, bias):
        return self.run(x, weight, bias)


class RunnerKernel(_PerCallKernel):
    """A static aarch64 harness run through an xfc Runner (qemu-aarch64 or ADB) per call."""

    def __init__(self, binary: Path, spec, runner, *, cpu_ids=None, march: str = "", label: str = ""):
        super().__init__(binary, spec, runner, cpu_ids=tuple(cpu_ids) if cpu_ids else None, label=label,
                         protocol="times-file", march=march)
        self.label = label

    @property
    def where(self) -> str:
        return self.runner.where


class PoclKernel(_PerCallKernel):
    """An OpenCL kernel file run by the shape-free harness on PoCL (the host CPU) per call."""

    where = "PoCL on the host CPU (not a phone GPU timing)"

    def __init__(self, harness: Path, kernel_file: Path, spec):
        from ..runners.pocl import PoclRunner
        super().__init__(kernel_file, spec, PoclRunner(Path(harness)))


@dataclass(frozen=True, eq=False)
class LayerKernel:
    """One distinct layer's kernel, built, and what runs it (`host`): a HostKernel (in-process,
    x86-64), a RunnerKernel (aarch64 harness under qemu or on a device) or a PoclKernel."""

    name: str                        # e.g. 'k03_conv2d'; the C symbol is xfc_<name>
    synthesis: LayerSynthesis
    files: tuple[Path, ...]          # what it leaves for the output directory (sources, build script, binary)
    build_seconds: float
    host: object = None              # xfc.runners.host.HostKernel
    where: str = "host (native)"

    @property
    def spec(self):
        return self.synthesis.spec

    def _need_host(self):
        if self.host is None:
            from ..errors import OperatorError
            raise OperatorError(f"kernel {self.name} was built without anything to run it here")
        return self.host

    def _bias(self, bias):
        """A layer carries a bias array (zeros without one); the kernel takes one only when its spec adds it."""
        return bias if self.spec.epilogue.bias else None

    def prepack(self, weight: np.ndarray) -> np.ndarray:
        return self._need_host().prepack(weight)

    def run_packed(self, x: np.ndarray, packed: np.ndarray, bias: np.ndarray) -> np.ndarray:
        return self._need_host().run_packed(x, packed, self._bias(bias))

    def __call__(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
        return self._need_host()(x, weight, self._bias(bias))


def build_layer_kernel(spec, hw, *, name: str, work_dir: Path, cluster: Optional[str] = None,
                       threads: Optional[int] = None, synthesis: Optional[LayerSynthesis] = None,
                       target: str = "cpu", placement: Optional[Placement] = None,
                       runnable: bool = True) -> LayerKernel:
    """Synthesize (unless given), render and build one layer's kernel in work_dir/<name>/.

    CPU, x86-64: a shared library loaded with ctypes. CPU, AArch64: the static harness, run
    through placement's runner (qemu-aarch64 unless a device is named). GPU: the OpenCL kernel
    file, run by the harness on PoCL. The kernel's symbol is xfc_<name>, so the files of every
    layer can sit side by side in one flat output directory (build scripts become build_<name>.sh).
    runnable=False builds the files only (no harness, no runner).
    """
    synthesis = synthesis or synthesize_layer(spec, hw, target=target, cluster=cluster, threads=threads)
    layer_dir = Path(work_dir) / name
    if synthesis.target == "gpu":
        return _build_gpu(synthesis, name, layer_dir, runnable)
    from ..pipeline import stages
    plan = dataclasses.replace(synthesis.result.plan, function_name=f"xfc_{name}")
    placement = placement or Placement()
    runner = placement.runner_for(plan.qemu_cpu) if hw.target_arch != "x86_64" and runnable else None
    built = stages.realize(plan, layer_dir, runner=runner)      # the chain's render and build
    host, where = built.host, "host (native)"
    produced = [built.artifact]
    script = "build.sh" if built.host is not None else "build_arm.sh"
    if built.host is None and runnable:
        host = RunnerKernel(built.artifact, spec, built.runner, cpu_ids=synthesis.result.cluster.cpu_ids
                            if placement.device not in (None, "qemu") else None,
                            march=plan.gcc_march or "", label=f"xfc_{name}")
        where = built.runner.where
    if built.host is not None:
        built.host.guarded = True   # --verify runs every layer on guarded buffers (NaN-filled outputs, guard zones)
    seconds = built.build_seconds
    files = [layer_dir / f"{plan.function_name}.c", layer_dir / f"{plan.function_name}_harness.c", *produced]
    renamed = layer_dir / f"{script[:-3]}_{name}.sh"
    shutil.copy2(layer_dir / script, renamed)
    files.append(renamed)
    return LayerKernel(name=name, synthesis=synthesis, files=tuple(files), build_seconds=seconds, host=host,
                       where=where)


def _build_gpu(synthesis: LayerSynthesis, name: str, layer_dir: Path, runnable: bool) -> LayerKernel:
    from ..toolchain import opencl
    from ..outputs import write_atomic
    from ..gpu import codegen
    plan = synthesis.result.plan
    layer_dir.mkdir(parents=True, exist_ok=True)
    kernel_file = layer_dir / f"xfc_{name}.cl"
    start = time.perf_counter()
    write_atomic(kernel_file, codegen.render_kernel(plan))
    host = None
    if runnable:
        host = PoclKernel(opencl.build_harness(), kernel_file, synthesis.spec)
    return LayerKernel(name=name, synthesis=synthesis, files=(kernel_file,),
                       build_seconds=time.perf_counter() - start, host=host, where=PoclKernel.where)


@dataclass(frozen=True)
class LayerTiming:
    median_s: float
    min_s: float
    samples_s: tuple[float, ...]
    where: str                       # names emulation (qemu, the virtual device) and PoCL as such
    prepacked: bool
    emulated: bool = False
    throttled: Optional[bool] = None # from the device's frequencies and temperatures (ADB); None: unknown


def time_layer(kernel: LayerKernel, x, weight, bias, *, repeats: int, warmup: int, prepacked: bool) -> LayerTiming:
    """Time one built layer kernel (median of `repeats` after `warmup`). Host: in C through ctypes,
    weights pre-packed once when `prepacked`; elsewhere through the runner / harness, which
    packs per call."""
    runner = kernel._need_host()
    if hasattr(runner, "time"):                                     # HostKernel
        m = runner.time(x, weight, kernel._bias(bias), repeats=repeats, warmup=warmup, prepacked=prepacked)
        return LayerTiming(median_s=m.median_s, min_s=m.min_s, samples_s=m.samples_s,
                           where=f"{kernel.where}{', weights pre-packed' if prepacked else ''}", prepacked=prepacked)
    runner.run(x, weight, bias, repeat=repeats, warmup=warmup)
    last = runner.last                                              # a runner Measurement
    return LayerTiming(median_s=last.median_s, min_s=last.min_s, samples_s=last.samples_s, where=last.where,
                       prepacked=False, emulated=bool(last.emulated), throttled=last.throttled)
