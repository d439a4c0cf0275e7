"""benchmarks/stream_past_cache.py: reads a buffer sized from the L3 on one thread and on every CPU
and writes their rates (issue 34's past-L3 stream). Host: it builds and runs a small C program."""
from __future__ import annotations

import json
import platform
import shutil

import pytest

from support import benchmark_with_siblings
from xfc.hardware.host import read_caches

pytestmark = [pytest.mark.host,
              pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or shutil.which("gcc") is None
                                 or "L3" not in read_caches(), reason="x86-64 with gcc and an L3")]


@pytest.fixture(scope="module")
def tool():
    with benchmark_with_siblings("stream_past_cache", ("machine",), "xfc_benchmark_stream_past_cache") as module:
        yield module


def test_it_writes_one_row_per_size_with_both_rates(tool, tmp_path):
    out = tmp_path / "stream.json"
    assert tool.main(["--sizes", "0.05,0.1", "--repeats", "1", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["machine"]["cpu_model"] and data["l3_bytes"] > 0
    assert [row["l3_multiple"] for row in data["rows"]] == [0.05, 0.1]
    for row in data["rows"]:
        rates = row["gbps_by_threads"]
        assert "1" in rates and all(rate > 0 for rate in rates.values())
        assert row["all_over_one"] == pytest.approx(rates[str(data["cpus"])] / rates["1"], rel=0.01)


def test_bad_sizes_are_one_line(tool):
    with pytest.raises(SystemExit) as exc:
        tool.main(["--sizes", "a,b"])
    assert "--sizes" in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(SystemExit) as exc:
        tool.main(["--sizes", "0,1"])
    assert "positive" in str(exc.value)
