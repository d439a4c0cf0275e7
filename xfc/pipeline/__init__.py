"""The library pipeline: (spec, hardware, dtype, target, options) -> plan -> the chain -> report.
The CLI (`xfc synth`, `xfc bench`) parses arguments, calls these and prints their reports.

  stages.py   the one chain every CPU kernel goes through (render -> fault -> build -> run both entry
              points -> verify -> time), whoever asks: synth, bench, compile, fuzz, model, sanitize,
              the tile database
  synth.py    run_synth (`xfc synth` on a CPU, every dtype), plan_cpu (the planner per dtype),
              synthesize_timed (fp32 synthesis with the tile database and its plan cache)
  bench.py    run_bench (`xfc bench`: a device or QEMU)
  kernel.py   compile -> Kernel (the Python API's kernel)
  gpu.py      run_gpu_synth (`xfc synth --target gpu`: OpenCL on PoCL)
  report.py   Report, the one report schema
"""
from .bench import run_bench
from .gpu import run_gpu_synth
from .kernel import Kernel, compile
from .report import REPORT_CORE_KEYS, REPORT_SCHEMA_VERSION, REPORT_TARGETS, Report, measurement_dict, report_core
from .synth import plan_cpu, run_synth, synthesize_timed

__all__ = ["Kernel", "REPORT_CORE_KEYS", "REPORT_SCHEMA_VERSION", "REPORT_TARGETS", "Report", "compile",
           "measurement_dict", "plan_cpu", "report_core", "run_bench", "run_gpu_synth", "run_synth", "synthesize_timed"]
