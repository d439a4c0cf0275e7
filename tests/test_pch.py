"""The precompiled ISA header (xfc.toolchain.pch): it only saves time. A kernel built with it is
byte-identical to one built without it, on the host and for aarch64; a broken .gch in the cache
changes nothing; XFC_PCH=off and a cache that cannot be written mean compiling without it."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from support import conv, dw, host_march, host_plan, needs_arm
from xfc.cpu.codegen import render_cpu_kernel
from xfc.toolchain import pch
from xfc.toolchain.cpu import build_arm, build_host


def _sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.mark.unit
def test_the_header_is_the_one_a_source_includes():
    assert pch.header_for(["#include <stdint.h>\n#include <immintrin.h>\n", "int main(void);"]) == "immintrin.h"
    assert pch.header_for(["#include <arm_neon.h>\n"]) == "arm_neon.h"
    assert pch.header_for(["#include <math.h>\n"]) is None and pch.header_for([]) is None


@pytest.mark.unit
def test_off_means_no_header():
    source = ["#include <immintrin.h>\n"]
    assert pch.include_flags("gcc", ["-O3"], source, environ={"XFC_PCH": "off"}) == []
    assert pch.include_flags("no-such-compiler-xfc", ["-O3"], source, environ={}) == []


@pytest.mark.host
def test_host_kernel_is_byte_identical_with_and_without_and_a_broken_gch_changes_nothing(tmp_path, monkeypatch):
    spec = conv(5, 13, 11, 7, 3, 3, pad=1, bias=True, act="relu6")
    rendered = render_cpu_kernel(host_plan(spec, "avx2", 1))
    monkeypatch.setenv("XFC_CACHE_DIR", str(tmp_path / "cache"))
    built = {}
    for setting in ("off", "on"):
        monkeypatch.setenv("XFC_PCH", setting)
        built[setting] = build_host(rendered, tmp_path / setting)
    assert built["on"].name == built["off"].name and _sha(built["on"]) == _sha(built["off"])
    gch, = (tmp_path / "cache" / "pch").glob(f"*/{pch.HEADER_NAME}.gch")
    assert gch.read_bytes()[:4] == b"gpch"         # gcc's precompiled header, not assembly or an empty file
    gch.write_bytes(b"not a precompiled header")     # gcc ignores it and parses the header
    again = build_host(rendered, tmp_path / "broken")
    assert _sha(again) == _sha(built["off"])


@pytest.mark.host
def test_an_unwritable_cache_builds_without(tmp_path, monkeypatch):
    rendered = render_cpu_kernel(host_plan(dw(3, 9, 9, 3, 3, pad=1), "avx2", 1))
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache directory would go")
    monkeypatch.setenv("XFC_CACHE_DIR", str(blocker))
    monkeypatch.setenv("XFC_PCH", "on")
    assert build_host(rendered, tmp_path / "k").exists() and blocker.read_text().startswith("a file")


@needs_arm
@pytest.mark.emulated
def test_aarch64_binary_is_byte_identical_with_and_without(tmp_path, monkeypatch):
    import xfc
    from xfc.cpu.synth import synthesize_cpu
    hw = xfc.load_hardware("snapdragon-865")
    plan = synthesize_cpu(conv(7, 9, 9, 12, 3, 3, pad=1), hw, hw.cluster("big").role, 1).plan
    rendered = render_cpu_kernel(plan)
    monkeypatch.setenv("XFC_CACHE_DIR", str(tmp_path / "cache"))
    built = {}
    for setting in ("off", "on"):
        monkeypatch.setenv("XFC_PCH", setting)
        built[setting] = build_arm(rendered, tmp_path / setting)
    assert _sha(built["on"]) == _sha(built["off"])
    assert list((tmp_path / "cache" / "pch").glob(f"*/{pch.HEADER_NAME}.gch"))
