"""GPU code generation: a GpuKernelPlan -> OpenCL C (templates/opencl/), and the shape-free C host
harness and build script. Spelling only: the plan decided every tile, flag and store shape; this
module turns them into the type names, load/store spellings and index lists the templates paste.
"""
from __future__ import annotations

from typing import Optional

import jinja2

from .._version import __version__
from ..paths import TEMPLATES_DIR
from .ir import GpuKernelPlan

TEMPLATE_DIR = TEMPLATES_DIR / "opencl"

_env: Optional[jinja2.Environment] = None


def _environment() -> jinja2.Environment:
    global _env
    if _env is None:
        _env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)), undefined=jinja2.StrictUndefined,
                                  keep_trailing_newline=True, autoescape=False)
    return _env


def template_context(plan: GpuKernelPlan) -> dict:
    """The values a template pastes. Type names and load/store spellings are spelled here."""
    st, ct = plan.storage_type, plan.compute_type
    vec = plan.register_tile.vector_width
    vt = ct if vec == 1 else f"{ct}{vec}"
    if st == ct:           # plain loads/stores of the compute type
        ld1, st1 = "(*(P))", "(*(P) = (V))"
        ldv = ld1 if vec == 1 else f"vload{vec}(0, (P))"
        stv = st1 if vec == 1 else f"vstore{vec}((V), 0, (P))"
    else:                  # half storage, float arithmetic
        ld1, st1 = "vload_half(0, (P))", "vstore_half_rte((V), 0, (P))"
        ldv = ld1 if vec == 1 else f"vload_half{vec}(0, (P))"
        stv = st1 if vec == 1 else f"vstore_half{vec}_rte((V), 0, (P))"
    lanes = [f"s{i:x}" for i in range(vec)] if vec > 1 else []
    return {
        "kernel_name": plan.kernel_name,
        "header_lines": plan.header_lines,
        "launch_line": plan.launch_line(),
        "constants": plan.constants,
        "flags": dict(plan.flags),
        "guarded_vector_store": plan.guarded_vector_store,
        "c": dict(plan.constants),
        "storage_t": st,
        "compute_t": ct,
        "vec_t": vt,
        "vec": vec,
        "lanes": lanes,
        "needs_fp16_pragma": ct == "half",
        "ld1": ld1, "ldv": ldv, "st1": st1, "stv": stv,
        "bias": plan.spec.epilogue.bias,
        "activation": plan.spec.epilogue.activation,
        "rows": list(range(plan.register_tile.rows)),
        "cols": list(range(plan.register_tile.cols)),
        "vectors": list(range(plan.register_tile.cols // vec)),
        "k_unroll": plan.register_tile.k_unroll,
        "staged": plan.work_group.local_staging,
    }


def render_kernel(plan: GpuKernelPlan) -> str:
    return _environment().get_template(plan.template).render(**template_context(plan))


def render_harness(default_repeat: int = 10, default_warmup: int = 1) -> str:
    return _environment().get_template("harness.c.j2").render(
        version=__version__, default_repeat=default_repeat, default_warmup=default_warmup)


def build_script(kernel_names: list[str]) -> str:
    """build.sh beside the rendered kernels: build the harness and run each kernel file."""
    return "\n".join([
        "#!/bin/sh",
        f"# xfc {__version__}: build and run the OpenCL harness (host: gcc + PoCL; phone: the NDK's clang",
        "# against the device's libOpenCL.so, e.g. $NDK/.../aarch64-linux-android29-clang harness.c -lOpenCL).",
        "set -e",
        'cd "$(dirname "$0")"',
        "${CC:-gcc} -O2 -std=c11 -Wall harness.c -o harness -lOpenCL -lm",
        *[f"./harness {k} a.f32 b.f32 bias.f32 out.f32 --repeat 10 --warmup 1" for k in kernel_names],
        "",
    ])
