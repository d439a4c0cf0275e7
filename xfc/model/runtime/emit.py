"""Render the network runtime's C sources and build its library (`xfc model --emit lib`).

Files, with <p> = xfc_<model> (library.c_identifier) and <abi> = x86_64 or arm64-v8a:

    <p>.h                 the C API (templates/runtime/network.h.j2)
    <p>.c                 the steps, the runtime ops, create / run / destroy (network.c.j2, ops.c.j2)
    <p>_kNN_<op>.c        one kernel per distinct layer spec (xfc.cpu.codegen, thread count a variable)
    <p>.weights           64-byte header (magic, sizes, digest), then the payload: every layer's weights
                          (all groups), then the constants section (biases, the ops' constants); raw
                          values of the program's dtype (fp32; fp16 for `--dtype fp16`)
    <p>_weights.c         --embed-weights: the weights file compiled in (.incbin)
    lib<p>-<abi>.a        all of the above compiled for the ABI
    benchmark_<name>.c    the benchmark program (benchmark.c.j2); CMakeLists.txt builds it
    CMakeLists.txt, manifest.json

Every decision (where each tensor lives, which step copies a residual, the tables of every op) is
made here or in arena.py / lower.py; the templates spell them.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from math import prod
from pathlib import Path
from typing import Callable, Mapping, Optional

import jinja2
import numpy as np

from ..._version import __version__
from ...toolchain.cpu import compile_with_pch
from ...wording import counted
from ...toolchain.tools import COMPILE_TIMEOUT_S, require_tool, run
from ...cpu.isa import ISA_TABLE
from ...errors import OperatorError
from ...ops.dtypes import FP32
from ...outputs import write_atomic
from ...paths import TEMPLATES_DIR
from ..library import LIB_FLAGS, abi_for, c_identifier, packed_floats, select_toolchain
from .arena import ALIGN_FLOATS, ArenaPlan, plan_arena
from .program import KernelStep, OpStep, Program

WEIGHTS_MAGIC = b"XFCWGT01"
HEADER_BYTES = 64
DEFAULT_WARMUP = 3
DEFAULT_RUNS = 20
PROGRAM_FLAGS = ("-O2", "-std=gnu11", "-fopenmp", "-Wall")
# With OMP_WAIT_POLICY=passive (read at create), a kernel step with fewer FLOPs runs on the calling
# thread: waking the sleeping team costs tens of microseconds (benchmarks/thread_wake.py), more than
# splitting such a step saves. With spinning threads (the default) a region costs under a microsecond
# and every step is split: a 0.85 MFLOP depthwise step takes 26 us on one core.
SERIAL_FLOPS = 1_000_000
# A grouped convolution whose per-group calls are this small runs its calls side by side, one kernel per
# thread, instead of splitting each small call across the team (a wake-up and a barrier per group).
SPLIT_GROUPS_FLOPS = 4_000_000
# ... when the calls deal out evenly: the busiest thread (whole calls; the team is known at create)
# gets at most this many eighths of the mean, else each call is split across the team. ShuffleNet's
# 3 groups on 2 threads (2 calls against 1.5): side by side its 2-thread network ran 1.11-1.18 ms,
# each call across the team 1.05-1.07 (benchmarks/net_states.py --net shufflenet_v1, shared-cache
# rounds; net_states_shufflenet_zen5_{c840882,group_spread}_*.json).
GROUP_SPREAD_EIGHTHS = 9


@dataclasses.dataclass(frozen=True)
class ElementSpelling:
    """How the runtime spells a program's dtype: the C type of its tensors, weights and constants,
    the weights file's element, and for a type narrower than fp32 the dialect of the runtime ops'
    fp32 arithmetic with the loads and stores that convert (XFC_TLOAD / XFC_TSTORE, network.c.j2)."""

    c_type: str
    numpy_type: str                   # little-endian, as in the weights file
    ops_isa: Optional[str] = None     # None: the kernels' own dialect (fp32)
    tload: str = ""
    tstore: str = ""
    ops_template: str = "runtime/ops.c.j2"


ELEMENT_SPELLINGS = {
    "fp32": ElementSpelling("float", "<f4"),
    # fp16 networks run on AArch64 cores with FP16 arithmetic (xfc.cpu.config.fp16_refusal): the
    # kernels are neon_fp16, the runtime ops fp32 NEON widening 4 halves per load
    "fp16": ElementSpelling("__fp16", "<f2", ops_isa="neon",
                            tload="vcvt_f32_f16(vld1_f16((const float16_t *)(p)))",
                            tstore="vst1_f16((float16_t *)(p), vcvt_f16_f32(v))"),
}


# int8 programs (quantized models): the tensors are the activation type's bytes; the weights file is
# bytes too (int8 weights, then int32 biases and fp32 multipliers in the constants section); the
# runtime ops are integer and scalar fp32 C (ops_int8.c.j2), so no vector dialect of their own.
INT8_SPELLINGS = {
    "uint8": ElementSpelling("uint8_t", "|u1", ops_isa="generic", ops_template="runtime/ops_int8.c.j2"),
    "int8": ElementSpelling("int8_t", "|u1", ops_isa="generic", ops_template="runtime/ops_int8.c.j2"),
}


def element_spelling(dtype, activation_type: str = "") -> ElementSpelling:
    if dtype.name == "int8":
        return INT8_SPELLINGS[activation_type or "uint8"]
    found = ELEMENT_SPELLINGS.get(dtype.name)
    if found is None:
        raise OperatorError(f"--dtype {dtype.name}: the network runtime runs fp32 and fp16 networks")
    return found


def _align(n: int) -> int:
    return (n + ALIGN_FLOATS - 1) // ALIGN_FLOATS * ALIGN_FLOATS


def c_string(text: str) -> str:
    """A C string literal (octal escapes for anything but printable ASCII)."""
    out = []
    for byte in text.encode():
        ch = chr(byte)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 32 <= byte < 127 and ch != "?":
            out.append(ch)
        else:
            out.append(f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def c_float(value: float) -> str:
    if np.isinf(value):
        return "INFINITY" if value > 0 else "(-INFINITY)"
    return f"{float(np.float32(value))!r}f"


def _templates() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)), undefined=jinja2.StrictUndefined,
                              trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)


@dataclasses.dataclass(frozen=True)
class Payload:
    """The weights file's payload: weights section, then constants section (floats)."""

    data: np.ndarray                  # the program's dtype (float32 or float16)
    const_section: int                # floats before the constants section
    weight_offsets: Mapping[int, int]  # kernel step index -> weights offset (payload)
    bias_offsets: Mapping[int, int]    # kernel step index -> bias offset (constants section)
    const_offsets: Mapping[str, int]   # op constant -> offset (constants section)
    digest: str                        # 32 hex digits
    mult_offsets: Mapping[int, int] = dataclasses.field(default_factory=dict)   # int8: multipliers (constants)

    @property
    def const_floats(self) -> int:
        return int(self.data.size) - self.const_section

    def file_bytes(self) -> bytes:
        header = bytearray(HEADER_BYTES)
        header[0:8] = WEIGHTS_MAGIC
        header[8:16] = int(self.data.size).to_bytes(8, "little")
        header[16:24] = int(self.const_section).to_bytes(8, "little")
        header[24:56] = self.digest.encode()
        return bytes(header) + np.ascontiguousarray(self.data, self.data.dtype.newbyteorder("<")).tobytes()


def element_values(program: Program, array, what: str) -> np.ndarray:
    """A weight or constant as the program's element type (fp32 values rounded once to fp16 for an
    fp16 program; the little-endian bytes of the typed array for an int8 program); a finite value
    the type cannot hold is a one-line OperatorError naming it."""
    if program.dtype.name == "int8":
        typed = np.asarray(array)
        return np.ascontiguousarray(typed.reshape(-1), typed.dtype.newbyteorder("<")).view(np.uint8)
    values = np.ascontiguousarray(np.asarray(array, np.float32).reshape(-1))
    if program.dtype == FP32:
        return values
    with np.errstate(over="ignore"):    # what overflows is refused just below
        narrow = values.astype(np.dtype(element_spelling(program.dtype).numpy_type).newbyteorder("="))
    over = np.isfinite(values) & ~np.isfinite(narrow)
    if over.any():
        raise OperatorError(f"--dtype {program.dtype.name}: {what} holds {float(values[over][0]):g}, beyond "
                            f"{program.dtype.name}'s range (largest {float(np.finfo(narrow.dtype).max):g})")
    return narrow


def build_payload(program: Program, identity: str) -> Payload:
    weights, consts = [], []
    w_size, c_size = 0, 0
    weight_offsets, bias_offsets, const_offsets, mult_offsets = {}, {}, {}, {}
    zero = element_values(program, np.zeros(0, np.float32), "")

    def put(chunks, size, array, what):
        array = element_values(program, array, what)
        pad = _align(array.size) - array.size
        chunks.append(array)
        if pad:
            chunks.append(np.zeros(pad, zero.dtype))
        return size + array.size + pad

    for i, step in enumerate(program.steps):
        if isinstance(step, KernelStep):
            if step.weight_tensor is None:
                weight_offsets[i] = w_size
                w_size = put(weights, w_size, step.layer.weight, f"the weights of '{step.name}'")
            bias_offsets[i] = c_size
            c_size = put(consts, c_size, step.layer.bias, f"the bias of '{step.name}'")
            if step.quant is not None:      # int8: the fp32 requantization multipliers
                mult_offsets[i] = c_size
                c_size = put(consts, c_size, step.layer.multipliers, f"the multipliers of '{step.name}'")
    for name, value in program.constants.items():
        const_offsets[name] = c_size
        c_size = put(consts, c_size, value, f"the constant '{name}'")
    data = np.concatenate(weights + consts) if (weights or consts) else zero
    h = hashlib.sha256(identity.encode())
    h.update(np.ascontiguousarray(data, data.dtype.newbyteorder("<")).tobytes())
    return Payload(data=data, const_section=w_size, weight_offsets=weight_offsets,
                   bias_offsets=bias_offsets, const_offsets=const_offsets, digest=h.hexdigest()[:32],
                   mult_offsets=mult_offsets)


class _Spelling:
    """Pointer expressions and per-step render data."""

    def __init__(self, program: Program, plan: ArenaPlan, payload: Payload, functions: Mapping, packed: Mapping):
        self.program, self.plan, self.payload = program, plan, payload
        self.functions, self.packed = functions, packed

    def ptr(self, tensor: str) -> str:
        place = self.plan.places[tensor]
        base = {"arena": "a", "input": f"in[{place.index}]", "output": f"out[{place.index}]"}[place.where]
        return f"{base} + {place.offset}" if place.offset else base

    def const(self, name: str) -> str:
        off = self.payload.const_offsets[name]
        return f"k + {off}" if off else "k"

    def outputs(self, step) -> list[dict]:
        return [{"c_name": c_string(t), "ptr": self.ptr(t), "floats": self.program.floats(t),
                 "fp32": self.program.element_type(t) == FP32} for t in step.outputs]

    def step(self, i: int, step) -> dict:
        base = {"index": i, "tables": [], "outputs": self.outputs(step)}
        if isinstance(step, KernelStep):
            return {**base, **self.kernel(i, step)}
        return {**base, **self.op(i, step)}

    def kernel(self, i: int, step: KernelStep) -> dict:
        spec = step.spec
        function = self.functions[step.kernel_key]
        nodes = ", ".join(step.nodes[:4]) + (f", ... ({len(step.nodes)} nodes)" if len(step.nodes) > 4 else "")
        d = {"op": "kernel", "function": function, "x": self.ptr(step.input), "y": self.ptr(step.output),
             "bias": f"k + {self.payload.bias_offsets[i]}" if self.payload.bias_offsets[i] else "k",
             "grouped": step.groups > 1, "packed": step.weight_tensor is None, "residual_copy": None,
             "int8": step.quant is not None,
             "mult": (f"k + {self.payload.mult_offsets[i]}" if self.payload.mult_offsets[i] else "k")
             if step.quant is not None else None,
             "serial": spec.flops * step.groups * step.batch < SERIAL_FLOPS, "flops": spec.flops * step.groups * step.batch,
             "comment": f"{step.label} [{nodes}] -> {function}"
                        + (f", {step.groups} groups" if step.groups > 1 else "")
                        + (f", residual '{step.residual}'" if step.residual else "")}
        d["w"] = (f"pw + {self.packed[i]}" if self.packed[i] else "pw") if step.weight_tensor is None \
            else self.ptr(step.weight_tensor)
        if step.residual is not None and i not in self.plan.residual_inplace:
            d["residual_copy"] = {"src": self.ptr(step.residual), "dst": self.ptr(step.output),
                                  "floats": self.program.floats(step.output)}
        if step.groups > 1:
            x_shape, y_shape = self.program.shapes[step.input], self.program.shapes[step.output]
            d.update(batch=step.batch, groups=step.groups, x_batch=prod(x_shape[1:]),
                     x_group=prod(spec.operand_shapes[0][1:]), y_batch=prod(y_shape[1:]),
                     y_group=prod(spec.output_shape[1:]), w_group=_align(self.packed_floats(step.kernel_key)),
                     b_group=spec.operand_shapes[2][0], call_flops=spec.flops,
                     split_groups=spec.flops < SPLIT_GROUPS_FLOPS and step.groups * step.batch > 1
                     and step.residual is None)
        return d

    def packed_floats(self, key) -> int:
        return self.packed["floats"][key]

    def op(self, i: int, step: OpStep) -> dict:
        p = step.params
        first_in = step.inputs[0] if step.inputs else None
        d = {"op": step.op, "comment": f"{step.op} [{', '.join(step.nodes) or step.name}] "
                                       f"{' '.join(step.inputs)} -> {' '.join(step.outputs)}"}
        if i in self.plan.inplace_steps:
            d["comment"] += " (in place)"
        if step.op in ("relu", "hardswish", "sigmoid", "silu", "clip", "leakyrelu", "hardsigmoid", "copy"):
            d.update(x=self.ptr(first_in), y=self.ptr(step.outputs[0]), n=self.program.floats(step.outputs[0]))
            d["args"] = {"clip": lambda: [c_float(p["lo"]), c_float(p["hi"])],
                         "leakyrelu": lambda: [c_float(p["alpha"])],
                         "hardsigmoid": lambda: [c_float(p["alpha"]), c_float(p["beta"])]}.get(step.op, list)()
        elif step.op == "affine":
            d.update(x=self.ptr(first_in), y=self.ptr(step.outputs[0]), outer=p["outer"], c=p["c"], inner=p["inner"],
                     scale=self.const(step.constants[0]), shift=self.const(step.constants[1]))
        elif step.op in ("add", "sub", "mul", "div", "expand"):
            operands = [self.const(t) if t in step.constants else self.ptr(t) for t in step.inputs]
            d.update(a=operands[0], b=operands[1] if len(operands) > 1 else "NULL", y=self.ptr(step.outputs[0]))
            d["tables"] = [("sa", p["a_strides"], "long"), ("sb", p["b_strides"], "long"), ("dims", p["dims"], "long")]
        elif step.op in ("maxpool", "avgpool"):
            d.update(x=self.ptr(first_in), y=self.ptr(step.outputs[0]), p=p)
        elif step.op in ("global_avgpool", "global_maxpool"):
            d.update(x=self.ptr(first_in), y=self.ptr(step.outputs[0]), outer=p["outer"], inner=p["inner"])
        elif step.op == "concat":
            d.update(srcs=[self.ptr(t) for t in step.inputs], y=self.ptr(step.outputs[0]), outer=p["outer"],
                     inner=p.get("inner", 1))
            d["tables"] = [("chunks", p["chunks"], "long")]
        elif step.op == "split":
            d.update(x=self.ptr(first_in), dsts=[self.ptr(t) for t in step.outputs], outer=p["outer"])
            d["tables"] = [("chunks", p["chunks"], "long")]
        elif step.op == "strided_copy":
            x = self.ptr(first_in)
            d.update(x=f"{x} + {p['offset']}" if p["offset"] else x, y=self.ptr(step.outputs[0]))
            d["tables"] = [("dims", p["dims"], "long"), ("strides", p["strides"], "long")]
        elif step.op == "pad":
            d.update(x=self.ptr(first_in), y=self.ptr(step.outputs[0]), value=c_float(p["value"]),
                     out_floats=p["out_floats"], offset=p["offset"])
            d["tables"] = [("dims", p["dims"], "long"), ("strides", p["strides"], "long")]
        elif step.op == "resize_nearest":
            d.update(x=self.ptr(first_in), y=self.ptr(step.outputs[0]), p=p)
            d["tables"] = [("rows", p["rows"], "int"), ("cols", p["cols"], "int")]
        elif step.op == "softmax":
            d.update(x=self.ptr(first_in), y=self.ptr(step.outputs[0]), outer=p["outer"], n=p["n"], inner=p["inner"])
        elif step.op in ("quantize", "dequantize"):   # int8: between the caller's fp32 and the bytes
            d.update(x=self.ptr(first_in), y=self.ptr(step.outputs[0]), n=self.program.floats(step.outputs[0]),
                     scale=c_float(p["scale"]), zp=p["zero_point"], lo=p.get("lo", 0), hi=p.get("hi", 0))
        elif step.op == "qadd":
            d.update(a=self.ptr(step.inputs[0]), b=self.ptr(step.inputs[1]), y=self.ptr(step.outputs[0]),
                     n=p["n"], ra=c_float(p["ra"]), rb=c_float(p["rb"]), za=p["za"], zb=p["zb"], zy=p["zy"],
                     lo=p["lo"], hi=p["hi"])
        elif step.op == "qgap":
            d.update(x=self.ptr(first_in), y=self.ptr(step.outputs[0]), outer=p["outer"], inner=p["inner"],
                     zx=p["zx"], mult=c_float(p["mult"]), zy=p["zy"], lo=p["lo"], hi=p["hi"])
        elif step.op == "qmaxpool":
            d.update(x=self.ptr(first_in), y=self.ptr(step.outputs[0]), p=p)
        elif step.op == "cast":   # between the caller's fp32 buffers and the program's dtype
            d.update(op="cast_in" if p["from"] == FP32.name else "cast_out", x=self.ptr(first_in),
                     y=self.ptr(step.outputs[0]), n=self.program.floats(step.outputs[0]))
        else:
            raise ValueError(f"no spelling for runtime op {step.op}")
        if step.op == "copy":
            d["n"] = p.get("floats", self.program.floats(step.outputs[0]))
        return d


@dataclasses.dataclass(frozen=True)
class Rendered:
    """Every source file of the network runtime, and what was decided for it."""

    prefix: str
    name: str                        # the model's C identifier (benchmark_<name>)
    files: Mapping[str, str]         # file name -> text
    kernel_files: tuple[str, ...]
    network_file: str
    weights_file: str
    weights: bytes
    plan: ArenaPlan
    payload: Payload
    functions: Mapping               # spec -> C function
    march: str
    packed_floats: int
    manifest: dict


def render_network(program: Program, syntheses: Mapping, names: Mapping, hw, model_name: str, *,
                   embed_weights: bool = False, default_threads: int = 1, cluster: Optional[str] = None) -> Rendered:
    """Plan the arena and render every source of the network runtime (pure: no files written).
    syntheses and names are keyed by KernelStep.kernel_key (the spec; for int8, with the quantization).
    The dialect and -march are the kernels'; a network with no kernel (no Conv, Gemm or MatMul) takes
    them from the cluster's configuration for its dtype (cpu.config.cpu_config)."""
    name = c_identifier(model_name)
    prefix = f"xfc_{name}"
    from ...cpu.codegen import SCRATCH_SLOTS
    threads_symbol = f"{prefix}_threads_now"
    scratch_symbol = f"{prefix}_scratch"   # the kernels' per-thread packing and staging buffers, shared
    plan = plan_arena(program)
    functions, kernel_sources, kernel_info, packed_per_spec = {}, {}, [], {}
    isa, march = None, ""
    for key in program.distinct_kernels():
        function = f"{prefix}_{names[key]}"
        functions[key] = function
        kplan = dataclasses.replace(syntheses[key].result.plan, function_name=function)
        source, packed_per_spec[key], kernel_isa = _render_kernel(kplan, threads_symbol, scratch_symbol)
        kernel_sources[f"{function}.c"] = source
        isa = isa or kernel_isa
        march = march or kplan.gcc_march
        kernel_info.append({"function": function, "spec": kplan.spec.describe(), "lowering": kplan.lowering,
                            "isa": kernel_isa, "packed_floats": packed_per_spec[key],
                            **({"quantization": kplan.quant.as_dict()} if program.dtype.name == "int8" else {}),
                            "tiles": syntheses[key].tiles})
    if isa is None:
        from ...cpu.config import cpu_config
        config = cpu_config(hw.cluster(cluster).core, program.dtype, target_arch=hw.target_arch)
        isa, march = config.dialect, config.gcc_march
    identity = f"{prefix} {__version__} " + " ".join(f"{s.label}:{','.join(s.inputs)}>{','.join(s.outputs)}"
                                                      for s in program.steps)
    payload = build_payload(program, identity)
    packed_offsets, packed_total, prepacks = {}, 0, []
    for i, step in enumerate(program.steps):
        if isinstance(step, KernelStep) and step.weight_tensor is None:
            per_group = _align(packed_per_spec[step.kernel_key])
            packed_offsets[i] = packed_total
            prepacks.append({"function": functions[step.kernel_key], "groups": step.groups, "int8": step.quant is not None,
                             "weight_offset": payload.weight_offsets[i],
                             "weight_group": prod(step.spec.operand_shapes[1]),
                             "packed_offset": packed_total, "packed_group": per_group,
                             "comment": f"'{step.name}' ({step.label})"})
            packed_total += per_group * step.groups
        else:
            packed_offsets[i] = 0
    spelling = _Spelling(program, plan, payload, functions, {**packed_offsets, "floats": packed_per_spec})
    steps = [spelling.step(i, s) for i, s in enumerate(program.steps)]
    element = element_spelling(program.dtype, program.activation_type)
    elem_bytes = program.dtype.element_bytes
    row = (ISA_TABLE.get(isa) if program.dtype.name == "int8" else ISA_TABLE[isa]) if isa else None   # int8: a dialect
    ops_row = ISA_TABLE[element.ops_isa] if element.ops_isa else row   # the runtime ops' dialect
    layout = (f"NCHW {program.dtype.name} between every two steps (the layout every kernel reads and writes): no "
              f"conversion inserted" + ("" if program.dtype == FP32 else
                                        "; the caller's fp32 inputs and outputs are cast at the edges"))
    weights_file = f"{prefix}.weights"
    io = [{"name": t, "c_name": c_string(t), "shape": list(program.shapes[t]), "floats": program.floats(t)}
          for t in program.inputs]
    oo = [{"name": t, "c_name": c_string(t), "shape": list(program.shapes[t]), "floats": program.floats(t)}
          for t in program.outputs]
    kernel_count = len(program.kernel_steps)
    header_lines = [
        f"hardware: {hw.name}, isa {isa} ({row.lanes[0] if row and row.lanes else '?'} {program.dtype.name} lanes), kernels synthesized "
        f"for {default_threads} thread{'s' if default_threads != 1 else ''} (the count is chosen at create)",
        f"steps: {len(program.steps)} ({counted(kernel_count, 'kernel call')}, "
        f"{counted(len(program.steps) - kernel_count, 'runtime op')}), {counted(len(functions), 'distinct kernel')}, "
        f"{counted(len(program.aliases), 'alias', 'aliases')} (no copy), {counted(len(program.folded), 'node')} "
        f"folded at load",
        f"arena: {plan.arena_bytes} bytes in {plan.buffers} buffers, liveness lower bound {plan.lower_bound_bytes} bytes "
        f"(x{plan.ratio:.3f}); {len(plan.inplace_steps)} ops and {len(plan.residual_inplace)} residual kernels in place",
        f"weights: {payload.data.size * elem_bytes} bytes of {program.dtype.name} in {weights_file}, packed at create into "
        f"{packed_total * elem_bytes} bytes",
        f"layout: {layout}",
    ] + [f"fused: {note}" for note in program.notes[:40]]
    context = {
        "prefix": prefix, "macro": prefix.upper(), "name": name, "model": model_name, "model_json": json.dumps(model_name)[1:-1],
        "version": __version__, "hardware": hw.name, "abi": abi_for(hw), "isa": isa or "-",
        "lanes": ops_row.lanes[0] if ops_row and ops_row.lanes else 4,
        "dialect_template": ops_row.prelude if ops_row else "cpu/dialect_generic.h.j2", "threads_symbol": threads_symbol,
        "scratch_symbol": scratch_symbol, "scratch_slots": SCRATCH_SLOTS, "group_spread_eighths": GROUP_SPREAD_EIGHTHS,
        "any_split_groups": any(step.get("split_groups") for step in steps),
        "dtype": program.dtype.name, "elem_c": element.c_type, "tload": element.tload, "tstore": element.tstore,
        "ops_template": element.ops_template,
        "layout": layout,
        "header_lines": header_lines, "inputs": io, "outputs": oo, "steps": steps, "prepacks": prepacks,
        "kernels": [{"function": f} for f in functions.values()],
        "arena_floats": plan.arena_floats, "arena_bytes": plan.arena_bytes, "lower_bound_bytes": plan.lower_bound_bytes,
        "packed_floats": packed_total, "packed_bytes": packed_total * elem_bytes, "const_floats": payload.const_floats,
        "const_bytes": payload.const_floats * elem_bytes, "weights_floats": int(payload.data.size),
        "const_section": payload.const_section, "digest": payload.digest,
        "file_bytes": HEADER_BYTES + payload.data.size * elem_bytes,
        "weights_file": weights_file, "embedded": embed_weights, "default_threads": default_threads,
        "io_floats": sum(_align(t["floats"]) for t in io + oo), "default_warmup": DEFAULT_WARMUP,
        "default_runs": DEFAULT_RUNS, "abis": [abi_for(hw)],
    }
    env = _templates()
    files = {f"{prefix}.h": env.get_template("runtime/network.h.j2").render(**context),
             f"{prefix}.c": env.get_template("runtime/network.c.j2").render(**context),
             f"benchmark_{name}.c": env.get_template("runtime/benchmark.c.j2").render(**context),
             "CMakeLists.txt": env.get_template("runtime/CMakeLists.txt.j2").render(**context),
             **kernel_sources}
    if embed_weights:
        files[f"{prefix}_weights.c"] = _embed_source(prefix, weights_file)
    manifest = _manifest(program, plan, payload, context, kernel_info, functions, packed_offsets, prefix)
    return Rendered(prefix=prefix, name=name, files=files, kernel_files=tuple(kernel_sources),
                    network_file=f"{prefix}.c", weights_file=weights_file, weights=payload.file_bytes(), plan=plan,
                    payload=payload, functions=functions, march=march or "", packed_floats=packed_total,
                    manifest=manifest)


def _render_kernel(kplan, threads_symbol: str, scratch_symbol: str) -> tuple[str, int, str]:
    """(C source, packed weight elements, isa label) of one kernel plan: fp32 / fp16 (CpuKernelPlan)
    or int8 (Int8Plan: packed bytes, the int8 dialect)."""
    from ...cpu.int8_plan import Int8Plan
    if isinstance(kplan, Int8Plan):
        from ...cpu.int8_codegen import packed_bytes, render_int8_kernel
        return render_int8_kernel(kplan, threads_symbol, scratch_symbol).source, packed_bytes(kplan), kplan.dialect
    from ...cpu.codegen import render_cpu_kernel
    rendered = render_cpu_kernel(kplan, threads_symbol=threads_symbol, scratch_symbol=scratch_symbol)
    return rendered.source, packed_floats(rendered), kplan.isa


def _embed_source(prefix: str, weights_file: str) -> str:
    return (f"/* {prefix}_weights.c: the weights file {weights_file} compiled into the library (--embed-weights);\n"
            f" * generated. Assembled from {weights_file} in the directory the compiler runs in. */\n"
            f"__asm__(\".section .rodata\\n\"\n"
            f"        \".balign 64\\n\"\n"
            f"        \".globl {prefix}_embedded_weights\\n\"\n"
            f"        \"{prefix}_embedded_weights:\\n\"\n"
            f"        \".incbin \\\"{weights_file}\\\"\\n\"\n"
            f"        \".globl {prefix}_embedded_weights_end\\n\"\n"
            f"        \"{prefix}_embedded_weights_end:\\n\"\n"
            f"        \".previous\\n\");\n")


def _manifest(program: Program, plan: ArenaPlan, payload: Payload, context: dict, kernel_info, functions,
              packed_offsets, prefix: str) -> dict:
    steps = []
    for i, s in enumerate(program.steps):
        entry = {"index": i, "kind": s.kind, "op": s.label, "name": s.name, "nodes": list(s.nodes),
                 "inputs": list(s.inputs), "outputs": list(s.outputs)}
        if isinstance(s, KernelStep):
            entry.update(function=functions[s.kernel_key], spec=s.spec.describe(), groups=s.groups,
                         notes=list(s.layer.notes),
                         weights=None if s.weight_tensor else {
                             "payload_offset_floats": payload.weight_offsets[i],
                             "shape": [s.layer.weight.shape[0], *s.spec.operand_shapes[1][1:]] if s.groups > 1
                             else list(s.spec.operand_shapes[1])},
                         bias={"constants_offset_floats": payload.bias_offsets[i],
                               "floats": int(np.asarray(s.layer.bias).size)},
                         **({"quantization": s.quant.as_dict(),
                             "multipliers": {"constants_offset_floats": payload.mult_offsets[i],
                                             "floats": int(s.layer.multipliers.size)}} if s.quant is not None else {}),
                         packed_offset_floats=packed_offsets.get(i), residual=s.residual,
                         residual_in_place=i in plan.residual_inplace if s.residual else None)
        else:
            entry.update(params={k: v for k, v in s.params.items() if k not in ("rows", "cols")},
                         in_place=i in plan.inplace_steps)
        steps.append(entry)
    tensors = {t: {"shape": list(program.shapes[t]), "where": plan.places[t].where,
                   "offset_floats": plan.places[t].offset, **({"alias_of": program.aliases[t][0]}
                                                              if t in program.aliases else {}),
                   **({"lifetime_steps": list(plan.lifetimes[t])} if t in plan.lifetimes else {})}
               for t in program.shapes}
    return {
        "xfc_library": 2, "xfc_version": __version__, "model": context["model"], "hardware": context["hardware"],
        "header": f"{prefix}.h", "cmake": "CMakeLists.txt", "cmake_target": prefix,
        "benchmark": {"source": f"benchmark_{context['name']}.c", "program": f"benchmark_{context['name']}"},
        "weights": {"file": context["weights_file"], "bytes": context["file_bytes"], "digest": payload.digest,
                    "embedded": context["embedded"], "header_bytes": HEADER_BYTES,
                    "constants_section_offset_floats": payload.const_section,
                    "dtype": context["dtype"], "element_bytes": program.dtype.element_bytes,
                    "layout": f"64-byte header (magic XFCWGT01, payload values u64, constants section offset u64, "
                              f"digest[32]), then raw little-endian {context['dtype']}: every layer's weights (all "
                              f"groups, in the kernel's layout), then the constants section (biases, the ops' constants)"
                              if program.dtype.name != "int8" else
                              "64-byte header (magic XFCWGT01, payload bytes u64, constants section offset u64, "
                              "digest[32]), then bytes: every layer's int8 weights (in the kernel's layout), then the "
                              "constants section: per layer its int32 biases and fp32 multipliers, little-endian; every "
                              "*_offset_floats and floats here counts elements of element_bytes (bytes for int8) for "
                              "offsets and values of the array's own type for 'floats'"},
        "sizes": {"arena_bytes": plan.arena_bytes, "arena_lower_bound_bytes": plan.lower_bound_bytes,
                  "arena_to_lower_bound": plan.ratio, "arena_buffers": plan.buffers,
                  "packed_weight_bytes": context["packed_bytes"], "constant_bytes": context["const_bytes"],
                  "weights_file_bytes": context["file_bytes"]},
        "threads": {"default": context["default_threads"], "note": "kernels synthesized for the default; create "
                                                                   "takes any count"},
        "layout": context["layout"], "dtype": context["dtype"],
        "inputs": [{"name": t["name"], "shape": t["shape"]} for t in context["inputs"]],
        "outputs": [{"name": t["name"], "shape": t["shape"]} for t in context["outputs"]],
        "functions": kernel_info, "steps": steps, "tensors": tensors, "folded_nodes": list(program.folded),
        "notes": list(program.notes),
    }


# ---------------------------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------------------------

def compile_objects(rendered: Rendered, src_dir: Path, obj_dir: Path, tools, progress=None, *,
                    pic: bool = True) -> list[Path]:
    """Compile the kernels, the network and (embedded) the weights in src_dir into obj_dir."""
    say = progress or (lambda msg: None)
    march = rendered.march or ("armv8-a" if tools.abi == "arm64-v8a" else "native")
    flags = [*LIB_FLAGS] if pic else [f for f in LIB_FLAGS if f != "-fPIC"]
    sources = [*rendered.kernel_files, rendered.network_file]
    if f"{rendered.prefix}_weights.c" in rendered.files:
        sources.append(f"{rendered.prefix}_weights.c")
    obj_dir.mkdir(parents=True, exist_ok=True)
    objects = [obj_dir / (Path(source).stem + ".o") for source in sources]

    def compile_one(item):
        source, obj = item
        compile_with_pch([tools.cc, *flags, f"-march={march}", "-c", str(src_dir / source), "-o", str(obj)],
                         f"{tools.abi} compile of {source}", (rendered.files.get(source, ""),), cwd=src_dir)

    say(f"--emit lib: compiling {len(sources)} sources for {tools.abi} ({counted(len(rendered.kernel_files), 'kernel')}, the "
        f"network{', the weights' if len(sources) > len(rendered.kernel_files) + 1 else ''})")
    workers = max(1, min(len(sources), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:   # one compiler process per core
        list(pool.map(compile_one, zip(sources, objects)))
    return objects


def write_sources(rendered: Rendered, directory: Path) -> None:
    for name, text in rendered.files.items():
        write_atomic(directory / name, text)
    write_atomic(directory / rendered.weights_file, rendered.weights)


def build_archive(rendered: Rendered, objects, tools, scratch: Path) -> Path:
    archive = scratch / f"lib{rendered.prefix}-{tools.abi}.a"
    if archive.exists():
        archive.unlink()
    run([tools.ar, "rcs", str(archive), *map(str, objects)], f"archiving {archive.name}", COMPILE_TIMEOUT_S)
    return archive


def build_program(rendered: Rendered, src_dir: Path, archive: Path, out: Path, tools, *, static: bool) -> Path:
    """The benchmark program linked against the archive (static for aarch64: runs under qemu or on a phone)."""
    argv = [tools.cc, *PROGRAM_FLAGS, f"-I{src_dir}", str(src_dir / f"benchmark_{rendered.name}.c"), str(archive),
            "-lm", "-o", str(out)]
    if static:
        argv.insert(1, "-static")
    run(argv, f"{tools.abi} link of benchmark_{rendered.name}", COMPILE_TIMEOUT_S)
    return out


def build_shared(rendered: Rendered, objects, out: Path, tools) -> Path:
    """A shared library of the same objects (the Python API loads it with ctypes)."""
    run([tools.cc, "-shared", "-fopenmp", *map(str, objects), "-lm", "-o", str(out)],
        f"link of {out.name}", COMPILE_TIMEOUT_S)
    return out


@dataclasses.dataclass(frozen=True)
class Built:
    """What emit_network_library compiled (in scratch): to link the benchmark program or a shared library."""

    tools: object                    # library.Toolchain
    source_dir: Path
    archive: Path
    objects: tuple[Path, ...]


def emit_network_library(rendered: Rendered, hw, lib_dir: Path, scratch: Path, *, env=None,
                         progress: Optional[Callable[[str], None]] = None) -> tuple[dict, Built]:
    """Write the sources, the weights, the archive for the description's ABI and the manifest into
    lib_dir (a staging directory); objects are compiled in scratch. Returns the report's 'library'
    and what was built."""
    say = progress or (lambda msg: None)
    tools = select_toolchain(abi_for(hw), env or {})
    require_tool(tools.cc)
    require_tool(tools.ar)
    lib_dir, scratch = Path(lib_dir), Path(scratch)
    src = scratch / "src"
    src.mkdir(parents=True, exist_ok=True)
    write_sources(rendered, src)
    objects = compile_objects(rendered, src, scratch / "obj", tools, progress)
    archive = build_archive(rendered, objects, tools, scratch)
    for name in rendered.files:
        shutil.copy2(src / name, lib_dir / name)
    shutil.copy2(src / rendered.weights_file, lib_dir / rendered.weights_file)
    shutil.copy2(archive, lib_dir / archive.name)
    manifest = {**rendered.manifest, "abis": {tools.abi: {"library": archive.name, "compiler": tools.label}}}
    write_atomic(lib_dir / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    say(f"--emit lib: {archive.name} ({tools.abi}: {counted(len(rendered.kernel_files), 'kernel')}, the network runtime) with "
        f"{rendered.prefix}.h, benchmark_{rendered.name}.c, CMakeLists.txt, {rendered.weights_file} and manifest.json, "
        f"into the output directory")
    return {"abi": tools.abi, "compiler": tools.label, "library": archive.name, "header": f"{rendered.prefix}.h",
            "cmake": "CMakeLists.txt", "manifest": "manifest.json", "cmake_target": rendered.prefix,
            "functions": len(rendered.kernel_files), "weights": rendered.weights_file,
            "benchmark_source": f"benchmark_{rendered.name}.c", "benchmark_program": f"benchmark_{rendered.name}",
            "embedded_weights": f"{rendered.prefix}_weights.c" in rendered.files,
            **rendered.manifest["sizes"]}, Built(tools=tools, source_dir=src, archive=archive, objects=tuple(objects))
