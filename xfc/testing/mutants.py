"""TEST-ONLY fault injection: deliberately wrong CPU kernels ("mutants").

A verification suite is only as good as the bugs it rejects. Each mutant here is a small edit of
the *rendered* C source of a kernel (the templates carry no test logic, and nothing in the
normal pipeline calls this module): one realistic bug, such as a row tail stored as a whole
register tile, a forgotten ReLU6 clamp or an off-by-one in the padding. `mutate` refuses to
return a kernel whose source did not change, or a mutant that cannot change the result of this
plan (e.g. a row-tail bug when M is a multiple of MR), so a test that injects one cannot pass
vacuously.

Used by tests/test_mutants.py, by the sanitizer target, and by the CLI only when the environment
variable XFC_TEST_MUTANT names a mutant (xfc.settings.test_mutant; for testing exit status 4).
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Callable

from ..errors import OperatorError
from ..ops.spec import gemm_view
from ..cpu.codegen import RenderedKernel


@dataclass(frozen=True)
class Mutant:
    name: str
    bug: str                                   # what the deliberately wrong kernel does
    caught_by: str                             # which check is expected to reject it
    applies: Callable[[RenderedKernel], str]   # '' if applicable, else why not
    edit: Callable[[RenderedKernel], str]      # the mutated kernel source


def _sub(pattern: str, repl: str, text: str, *, literal: bool = True, flags: int = 0) -> str:
    """Replace every match (at least one); the caller checks that the text changed."""
    regex = re.escape(pattern) if literal else pattern
    new, count = re.subn(regex, repl if not literal else repl.replace("\\", "\\\\"), text, flags=flags)
    if count == 0:
        raise OperatorError(f"mutant edit found no '{pattern}' in the rendered source (template changed?)")
    return new


def _is_gemm(r: RenderedKernel) -> str:
    return "" if r.plan.gemm is not None else f"needs a GEMM lowering, not {r.plan.lowering}"


# ---- entry-point wrappers: the kernel body stays, its public entry points are wrapped ----------

def _wrap_entry_points(r: RenderedKernel, body: str, helpers: str = "") -> str:
    """Rename `fn` and `fn_packed` to static `..__exact` and append wrappers made from body, in
    which CALL is the exact function, WEIGHTS the weights pointer and WEIGHT_FLOATS their count."""
    fn, spec = r.function_name, r.plan.spec
    src = _sub(rf"^int ({re.escape(fn)}(?:_packed)?)\(", r"static int \1__exact(", r.source,
               literal=False, flags=re.M)
    proto = "(const float *, const float *, const float *, float *)"
    head = "\n".join([
        "/* ---- TEST-ONLY MUTANT (xfc.mutants): this kernel is deliberately wrong ---- */",
        "#include <stdint.h>", "#include <stdlib.h>", "#include <string.h>",
        f"static int {fn}__exact{proto};", f"static int {fn}_packed__exact{proto};",
        f"int {fn}{proto};", f"int {fn}_packed{proto};", f"long {fn}_packed_floats(void);", helpers, ""])
    in0_floats = math.prod(spec.operand_shapes[0])
    out_floats, row = math.prod(spec.output_shape), spec.output_shape[-1]
    wrappers = []
    for name, weights, weight_floats in ((fn, "in1", str(math.prod(spec.operand_shapes[1]))),
                                         (f"{fn}_packed", "packed", f"{fn}_packed_floats()")):
        text = (body.replace("CALL", f"{name}__exact").replace("WEIGHT_FLOATS", f"(long)({weight_floats})")
                .replace("WEIGHTS", weights).replace("IN0_FLOATS", f"{in0_floats}L")
                .replace("OUT_FLOATS", f"{out_floats}L").replace("ROW_FLOATS", f"{row}L"))
        wrappers.append(f"int {name}(const float *in0, const float *{weights}, const float *bias, float *out)\n"
                        f"{{\n{text}\n}}\n")
    return head + src + "\n/* ---- TEST-ONLY MUTANT wrappers ---- */\n" + "\n".join(wrappers)


_HALF_HELPER = """/* round to 11 significant bits (the precision of fp16), nearest even; inf/nan unchanged */
static float xfc_mutant_half(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7f800000u) != 0x7f800000u) { u += 0xfffu + ((u >> 13) & 1u); u &= ~0x1fffu; }
    memcpy(&x, &u, sizeof u);
    return x;
}"""

_HALF_BODY = """    float *r0 = (float *)malloc(sizeof(float) * (size_t)IN0_FLOATS);
    float *r1 = (float *)malloc(sizeof(float) * (size_t)WEIGHT_FLOATS);
    if (!r0 || !r1) { free(r0); free(r1); return 1; }
    for (long i = 0; i < IN0_FLOATS; i++) r0[i] = xfc_mutant_half(in0[i]);
    for (long i = 0; i < WEIGHT_FLOATS; i++) r1[i] = xfc_mutant_half(WEIGHTS[i]);
    int status = CALL(r0, r1, bias, out);
    free(r0); free(r1);
    return status;"""

_LAST_ROW_BODY = """    /* the last output row keeps whatever the buffer held before the call */
    float *saved = (float *)malloc(sizeof(float) * (size_t)ROW_FLOATS);
    if (!saved) return 1;
    memcpy(saved, out + OUT_FLOATS - ROW_FLOATS, sizeof(float) * (size_t)ROW_FLOATS);
    int status = CALL(in0, WEIGHTS, bias, out);
    memcpy(out + OUT_FLOATS - ROW_FLOATS, saved, sizeof(float) * (size_t)ROW_FLOATS);
    free(saved);
    return status;"""


# ---- in-kernel edits ----------------------------------------------------------------------------

def _gemm_m(r: RenderedKernel) -> int:
    return gemm_view(r.plan.spec, r.plan.lowering == "implicit_gemm_t").m


def _tail_applies(r: RenderedKernel) -> str:
    why = _is_gemm(r)
    if why:
        return why
    m, mr = _gemm_m(r), r.plan.gemm.mr
    return "" if m % mr else f"GEMM M={m} is a multiple of MR={mr}: there is no row tail"


def _tail_edit(r: RenderedKernel) -> str:
    return _sub("xfc_min(XFC_MR, mc - ir), xfc_min(XFC_NR, nc - jr)", "XFC_MR, xfc_min(XFC_NR, nc - jr)", r.source)


def _relu6_applies(r: RenderedKernel) -> str:
    return "" if r.plan.spec.epilogue.activation == "relu6" else "needs a relu6 epilogue"


def _relu6_edit(r: RenderedKernel) -> str:
    s = _sub("XFC_VMIN(XFC_VMAX(v, XFC_VZERO()), XFC_VBCAST(6.0f))", "XFC_VMAX(v, XFC_VZERO())", r.source)
    s = _sub("v > 0.0f ? (v < 6.0f ? v : 6.0f) : 0.0f", "v > 0.0f ? v : 0.0f", s)
    if "XFC_HVMIN(" in s:  # depthwise half-width tail (AVX-512)
        s = _sub("XFC_HVMIN(XFC_HVMAX(v, XFC_HV_OF(XFC_VZERO())), XFC_HV_OF(XFC_VBCAST(6.0f)))",
                 "XFC_HVMAX(v, XFC_HV_OF(XFC_VZERO()))", s)
    return s


def _pad_applies(r: RenderedKernel) -> str:
    return "" if re.search(r"^#define XFC_PT \d+", r.source, re.M) else \
        "needs a padded window (conv2d that is not pointwise, or depthwise)"


def _pad_edit(r: RenderedKernel) -> str:
    return re.sub(r"^#define XFC_PT (\d+)", lambda m: f"#define XFC_PT {int(m.group(1)) + 1}", r.source,
                  count=1, flags=re.M)


def _drop_k_applies(r: RenderedKernel) -> str:
    why = _is_gemm(r)
    if why:
        return why
    return "" if r.plan.gemm.a_pack != "im2col_direct" else "not for a_pack im2col_direct"


def _drop_k_edit(r: RenderedKernel) -> str:
    return _sub("    long k = 0;\n", "    long k = 1;  /* MUTANT: the last k of every KC slice is dropped */\n",
                r.source)


def _minus_one_edit(r: RenderedKernel) -> str:
    if r.plan.gemm is not None:
        return _sub("out + item * XFC_C_BATCH_STRIDE,", "out + item * XFC_C_BATCH_STRIDE - 1,", r.source)
    return _sub("out + plane * (XFC_OH * XFC_OW)", "out + plane * (XFC_OH * XFC_OW) - 1", r.source)


def _split_edit(r: RenderedKernel) -> str:
    if r.plan.gemm is not None:
        return _sub("panels * (tid + 1) / nth * ", "(panels * (tid + 1) / nth - (tid + 1 == nth)) * ", r.source)
    return _sub("last = planes * (tid + 1) / nth;", "last = planes * (tid + 1) / nth - (tid + 1 == nth);",
                r.source)


def _scratch_applies(r: RenderedKernel) -> str:
    return "" if "xfc_scratch(2, (size_t)XFC_STAGE_FLOATS, 0)" in r.source or r.plan.depthwise is not None else \
        "needs a staged input (a conv2d that is not pointwise, or depthwise)"


def _scratch_edit(r: RenderedKernel) -> str:
    if r.plan.depthwise is not None:
        return _sub("xfc_scratch(0, (size_t)XFC_BLOCK_ROWS * XFC_ROW_STRIDE, 0)",
                    "xfc_scratch(0, (size_t)(XFC_BLOCK_ROWS - 1) * XFC_ROW_STRIDE, 0)", r.source)
    return _sub("xfc_scratch(2, (size_t)XFC_STAGE_FLOATS, 0)",
                "xfc_scratch(2, (size_t)(XFC_STAGE_FLOATS - 16 * XFC_STAGE_COLS), 0)", r.source)


def _packed_size_edit(r: RenderedKernel) -> str:
    return re.sub(r"^#define XFC_PACKED_FLOATS (\d+)L",
                  lambda m: f"#define XFC_PACKED_FLOATS {max(1, int(m.group(1)) - 16)}L", r.source, count=1,
                  flags=re.M)


def _always(r: RenderedKernel) -> str:
    return ""


MUTANTS: dict[str, Mutant] = {m.name: m for m in (
    Mutant("tail_store_mr_rows", "the row tail (M % MR rows) runs the full MR-row tile and stores all MR rows",
           "guard zone after the output (or, inside a batch, the next item is overwritten later)",
           _tail_applies, _tail_edit),
    Mutant("drop_relu6_clamp", "ReLU6 forgets min(x, 6)", "worst-case bound (needs outputs above 6)",
           _relu6_applies, _relu6_edit),
    Mutant("pad_top_off_by_one", "the top padding is one row too large (the image is read one row too high)",
           "worst-case bound", _pad_applies, _pad_edit),
    Mutant("fp16_operands", "inputs and weights rounded to fp16 precision before an fp32 computation",
           "RMS statistical limit at large K (the worst-case bound alone passes it at K >= 1024)",
           _always, lambda r: _wrap_entry_points(r, _HALF_BODY, _HALF_HELPER)),
    Mutant("unwritten_last_row", "the last output row is never written", "NaN pre-fill of the output",
           _always, lambda r: _wrap_entry_points(r, _LAST_ROW_BODY)),
    Mutant("drop_last_k", "the last k of every KC slice is skipped", "worst-case bound",
           _drop_k_applies, _drop_k_edit),
    Mutant("out_pointer_minus_one", "the output is written one float early", "guard zone before the output",
           _always, _minus_one_edit),
    Mutant("thread_split_drops_last_panel", "the last thread stops one panel (or plane) early",
           "NaN pre-fill of the output", _always, _split_edit),
    Mutant("packed_size_too_small", "the pre-packed weights size is 16 floats short (prepack writes past it)",
           "guard zone after the packed weights", _is_gemm, _packed_size_edit),
    # Only the sanitizer sees this one (the overflow is inside the kernel's own scratch); never
    # run it unsanitized in a process you care about.
    Mutant("scratch_too_small", "the staging scratch is allocated too small (the last rows overflow it)",
           "AddressSanitizer (sanitizer target only)", _scratch_applies, _scratch_edit),
)}


def mutate(rendered: RenderedKernel, name: str) -> RenderedKernel:
    """The kernel with mutant `name` applied. OperatorError (one line) for an unknown mutant, one
    that does not apply to this plan, or an edit that left the source unchanged."""
    mutant = MUTANTS.get(name)
    if mutant is None:
        raise OperatorError(f"unknown test mutant '{name}' (known: {', '.join(MUTANTS)})")
    why = mutant.applies(rendered)
    if why:
        raise OperatorError(f"test mutant '{name}' does not apply to {rendered.function_name}: {why}")
    source = mutant.edit(rendered)
    if source == rendered.source:
        raise OperatorError(f"test mutant '{name}' left the source of {rendered.function_name} unchanged")
    return dataclasses.replace(rendered, source=source)
