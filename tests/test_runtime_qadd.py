"""The int8 runtime's requantizing Add (templates/runtime/ops_int8.c.j2, xfc_rt_qadd) against the
oracle's (xfc.model.quantized.run_add) on every pair of input bytes, both activation types, ratios
from ordinary to overflowing (products past fp32: inf, inf - inf: NaN), zero points at both ends and
clamps narrower than the type, in place on either operand. Compiled for each of its paths: AVX-512, AVX2
and scalar on this host (where the host runs them), NEON under qemu-aarch64, with OpenMP (2 threads: the
chunked split)."""
from __future__ import annotations

import struct
import subprocess

import numpy as np
import pytest

from xfc.model.quantized import QTensor, run_add
from xfc.model.runtime.emit import _templates
from xfc.hardware.host import read_flags

PAIRS = 65536 + 13          # every (a, b) byte pair, then a ragged tail (no vector width divides it)
# (ra, rb, za, zb, zy, lo, hi) for uint8; int8 takes the zero points shifted by -128
CASES = [(0.9867, 0.0865, 129, 124, 133, 0, 255),
         (251.3, 3.7e-3, 0, 255, 0, 0, 255),
         (3.0e38, -3.0e38, 17, 200, 100, 20, 200),     # products overflow to +-inf; their sum is NaN -> 0
         (1.0, 1.0, 255, 0, 255, 0, 255),
         (0.5, 0.5, 128, 128, 128, 0, 255)]

MAIN = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv)
{
    static xfc_t a[%(n)d], b[%(n)d], y[%(n)d];
    for (long i = 0; i < %(n)d; i++) { a[i] = (xfc_t)(i & 255); b[i] = (xfc_t)((i >> 8) & 255); }
    FILE *out = fopen(argv[1], "wb");
    for (int k = 2; k + 7 <= argc; k += 7) {
        unsigned ra_bits = (unsigned)strtoul(argv[k], 0, 16), rb_bits = (unsigned)strtoul(argv[k + 1], 0, 16);
        float ra, rb;
        memcpy(&ra, &ra_bits, 4);
        memcpy(&rb, &rb_bits, 4);
        memcpy(y, a, sizeof y);            /* in place on the first operand: y is a */
        xfc_rt_qadd(y, b, y, %(n)d, ra, rb, atoi(argv[k + 2]), atoi(argv[k + 3]), atoi(argv[k + 4]),
                    atoi(argv[k + 5]), atoi(argv[k + 6]));
        fwrite(y, 1, sizeof y, out);
        memcpy(y, b, sizeof y);            /* ... and on the second: y is b */
        xfc_rt_qadd(a, y, y, %(n)d, ra, rb, atoi(argv[k + 2]), atoi(argv[k + 3]), atoi(argv[k + 4]),
                    atoi(argv[k + 5]), atoi(argv[k + 6]));
        fwrite(y, 1, sizeof y, out);
    }
    return fclose(out) != 0;
}
"""


def _source(elem_c: str) -> str:
    ops = _templates().get_template("runtime/ops_int8.c.j2").render(elem_c=elem_c)
    # what templates/runtime/network.c.j2 defines before it includes the ops
    prelude = (f"#include <stddef.h>\n#include <stdint.h>\n#include <string.h>\n#include <math.h>\n"
               f"typedef {elem_c} xfc_t;\n#define XFC_RT_THREADS 2\n"
               "static inline long xfc_rt_min(long a, long b) { return a < b ? a : b; }\n"
               "static inline long xfc_rt_max(long a, long b) { return a > b ? a : b; }\n")
    return prelude + ops + MAIN % {"n": PAIRS}


def _cases(act: str):
    shift = -128 if act == "int8" else 0
    for ra, rb, za, zb, zy, lo, hi in CASES:
        yield np.float32(ra), np.float32(rb), za + shift, zb + shift, zy + shift, lo + shift, hi + shift


def _argv(act: str) -> list[str]:
    args = []
    for ra, rb, za, zb, zy, lo, hi in _cases(act):
        args += [f"{struct.unpack('<I', struct.pack('<f', ra))[0]:08x}",
                 f"{struct.unpack('<I', struct.pack('<f', rb))[0]:08x}", str(za), str(zb), str(zy), str(lo), str(hi)]
    return args


def _check(act: str, raw: bytes) -> None:
    dtype = np.int8 if act == "int8" else np.uint8
    i = np.arange(PAIRS)
    a, b = (i & 255).astype(np.uint8).view(dtype), ((i >> 8) & 255).astype(np.uint8).view(dtype)
    got = np.frombuffer(raw, dtype).reshape(-1, 2, PAIRS)    # per case: in place on a, then on b
    assert got.shape[0] == len(CASES)
    for rows, (ra, rb, za, zb, zy, lo, hi) in zip(got, _cases(act)):
        # the oracle's tensors: scales whose fp32 ratios are ra and rb (sy = 1), then the narrower clamp
        with np.errstate(over="ignore", invalid="ignore"):     # the overflowing case, on purpose
            want = run_add(a, b, QTensor("a", act, float(ra), za), QTensor("b", act, float(rb), zb),
                           QTensor("y", act, 1.0, zy))
        want = np.clip(want.astype(np.int32), lo, hi).astype(dtype)
        for which, row in zip("ab", rows):
            bad = np.flatnonzero(row != want)
            assert bad.size == 0, (act, which, float(ra), float(rb), int(bad[0]), int(row[bad[0]]), int(want[bad[0]]))


HOST_BUILDS = [("avx512", ["-march=x86-64-v4"]), ("avx2", ["-march=x86-64-v3"]), ("scalar", ["-march=x86-64"])]
NEEDS = {"avx512": ("avx512f", "avx512bw", "avx512vl"), "avx2": ("avx2", "fma"), "scalar": ()}


@pytest.mark.host
@pytest.mark.parametrize("act", ["uint8", "int8"])
@pytest.mark.parametrize("build, flags", HOST_BUILDS, ids=[b for b, _ in HOST_BUILDS])
def test_runtime_qadd_matches_the_oracle_on_every_byte_pair(build, flags, act, tmp_path):
    missing = [f for f in NEEDS[build] if f not in read_flags()]
    if missing:
        pytest.skip(f"this host lacks {', '.join(missing)}")
    src = tmp_path / "qadd.c"
    src.write_text(_source("int8_t" if act == "int8" else "uint8_t"))
    exe = tmp_path / "qadd"
    subprocess.run(["gcc", "-O3", "-std=gnu11", "-fopenmp", "-Werror=implicit-function-declaration", *flags, str(src),
                    "-o", str(exe), "-lm"], check=True)
    subprocess.run([str(exe), str(tmp_path / "y.bin"), *_argv(act)], check=True, timeout=60)
    _check(act, (tmp_path / "y.bin").read_bytes())


@pytest.mark.emulated
@pytest.mark.parametrize("act", ["uint8", "int8"])
def test_runtime_qadd_neon_matches_the_oracle_on_every_byte_pair(act, tmp_path):
    from xfc.runners.qemu import qemu_path
    src = tmp_path / "qadd.c"
    src.write_text(_source("int8_t" if act == "int8" else "uint8_t"))
    exe = tmp_path / "qadd"
    subprocess.run(["aarch64-linux-gnu-gcc", "-O3", "-std=gnu11", "-march=armv8.2-a", "-fopenmp",
                    "-Werror=implicit-function-declaration", "-static", str(src), "-o", str(exe), "-lm"], check=True)
    subprocess.run([qemu_path(), "-cpu", "max", str(exe), str(tmp_path / "y.bin"), *_argv(act)], check=True,
                   timeout=120)
    _check(act, (tmp_path / "y.bin").read_bytes())
