"""Stride-2 staging (the depthwise row blocks, a strided convolution's staged image) copies every
second float of an input row with whole deinterleaved vectors and, where the dialect has masks, one
masked vector for the rest. Neither may read past the row's last float it needs: the last row of
the input can end where its memory does. Run on an input whose last float is the last of a page
followed by an unreadable page (a read past it is a segmentation fault), in a child process."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import support

pytestmark = pytest.mark.host

CHILD = textwrap.dedent("""
    import ctypes, mmap, sys
    import numpy as np
    import xfc
    from xfc.ops.reference import make_inputs, reference
    from xfc.ops.spec import make_spec
    op, shape, stride = sys.argv[1], eval(sys.argv[2]), int(sys.argv[3])
    spec = make_spec(op, shape, stride=stride, bias=True)
    kernel = xfc.compile(spec, xfc.load_hardware("host"), threads=1)
    x, w, b = make_inputs(spec, seed=4)
    page = mmap.PAGESIZE
    pages = -(-x.nbytes // page) + 1
    region = mmap.mmap(-1, (pages + 1) * page, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mprotect(ctypes.c_void_p(base + pages * page), page, 0) == 0   # PROT_NONE
    end = pages * page
    tight = np.frombuffer(region, np.float32, count=x.size, offset=end - x.nbytes).reshape(x.shape)
    tight[...] = x
    got = kernel(tight, w, b)
    want = reference(spec, x, w, b)
    assert np.allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max()))), "wrong values"
    print("ok")
""")

CASES = [("depthwise", dict(c=3, h=5, w=65, r=3, s=3)), ("depthwise", dict(c=2, h=6, w=64, r=3, s=3)),
         ("depthwise", dict(c=2, h=5, w=33, r=5, s=5)), ("conv2d", dict(c=2, h=5, w=64, k=5, r=1, s=1)),
         ("conv2d", dict(c=3, h=7, w=65, k=4, r=3, s=3))]


@pytest.mark.parametrize("op,shape", CASES, ids=[f"{o}-{s['w']}-r{s['r']}" for o, s in CASES])
def test_stride2_staging_reads_nothing_past_the_input(op, shape):
    proc = subprocess.run([sys.executable, "-c", CHILD, op, repr(shape), "2"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", \
        f"exit {proc.returncode} (-11: a read past the input's last float)\\n{proc.stderr[-2000:]}"
