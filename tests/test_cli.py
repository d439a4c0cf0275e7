"""The real `xfc` console script, run in a subprocess."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

XFC = shutil.which("xfc", path=str(Path(sys.executable).parent)) or "xfc"


def run(*args, cwd=None):
    env = {k: v for k, v in os.environ.items() if k != "XFC_DEBUG"}
    return subprocess.run([XFC, *args], capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


def assert_clean_error(proc, code=2, contains=""):
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("xfc: error")]
    assert len(lines) == 1, proc.stderr
    assert contains in lines[0], lines[0]


def test_version():
    proc = run("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("xfc ")


@pytest.mark.parametrize("argv", [[], ["hw"], ["hw", "list"], ["hw", "show"], ["hw", "validate"], ["synth"],
                                  ["devices"], ["bench"]])
def test_help_on_every_command(argv):
    proc = run(*argv, "--help")
    assert proc.returncode == 0, proc.stderr
    assert "usage:" in proc.stdout


def test_hw_list_counts():
    proc = run("hw", "list", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    layers = [r["layer"] for r in rows]
    assert layers.count("cpu") >= 10 and layers.count("gpu") >= 7 and layers.count("soc") >= 9
    assert "host" in [r["name"] for r in rows]
    table = run("hw", "list")
    assert table.returncode == 0 and "snapdragon-865" in table.stdout and "host" in table.stdout


def test_hw_show_snapdragon_yaml_prints_clusters_gpu_and_peaks():
    proc = run("hw", "show", "snapdragon.yaml")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for needle in ("CPU clusters", "GFLOP/s", "GPU:", "adreno", "prime", "little", "balance"):
        assert needle in out, needle
    data = json.loads(run("hw", "show", "snapdragon.yaml", "--json").stdout)
    assert data["derived"]["gpu_peak_fp32_gflops"] > 0 and len(data["clusters"]) >= 3


def test_hw_validate_reports_each_file(tmp_path):
    good = Path(__file__).resolve().parent.parent / "hardware_descriptions" / "cpu" / "cortex-a76.yaml"
    bad = tmp_path / "broken.yaml"
    bad.write_text("kind: cpu_core\nname: broken\n  - : [\n")
    proc = run("hw", "validate", str(good), str(bad))
    assert proc.returncode == 2
    assert "OK" in proc.stdout and "ERROR" in proc.stdout and "broken.yaml" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("content", ["", "\x00\x01binary", "kind: [", "kind: cpu_core\nname: x\n",
                                     "!!python/object/apply:os.system ['true']\n"])
def test_broken_hw_file_for_synth_exits_2_one_line(tmp_path, content):
    path = tmp_path / "x.yaml"
    path.write_text(content)
    proc = run("synth", "matmul", "--hw", str(path), "--shape", "m=4,n=4,k=4")
    assert_clean_error(proc, 2, "x.yaml")


@pytest.mark.parametrize("argv,contains", [
    (["synth", "softmax", "--hw", "host", "--shape", "m=1"], "invalid choice"),
    (["synth", "matmul", "--hw", "host", "--shape", "m=4,n=4"], "missing k"),
    (["synth", "matmul", "--hw", "host", "--shape", "m=4,n=0,k=4"], "'n' must be >= 1"),
    (["synth", "matmul", "--hw", "host", "--shape", "m=4,n=x,k=4"], "not an integer"),
    (["synth", "matmul", "--hw", "host", "--shape", "m=4,n=4,k=4,q=2"], "'q' is not used"),
    (["synth", "conv2d", "--hw", "host", "--shape", "c=3,h=4,w=4,k=8,r=7,s=7"], "does not fit"),
    (["synth", "conv2d", "--hw", "host", "--shape", "c=3,h=8,w=8,k=8,r=3,s=3", "--pad", "1,2,3"], "--pad takes"),
    (["synth", "matmul", "--hw", "no-such-soc", "--shape", "m=4,n=4,k=4"], "unknown hardware"),
    (["synth", "matmul", "--hw", "host", "--shape", "m=4,n=4,k=4", "--threads", "64"], "exceeds"),
    (["synth", "matmul", "--hw", "snapdragon-855", "--shape", "m=4,n=4,k=4", "--cluster", "mid"], "no 'mid' cluster"),
    (["synth", "matmul", "--hw", "cortex-a76", "--shape", "m=4,n=4,k=4", "--target", "gpu"], "no GPU"),
    (["synth", "matmul", "--hw", "host", "--shape", "m=4,n=4,k=4", "--dtype", "fp16"], "fp16"),
])
def test_bad_requests_exit_2_with_one_line(argv, contains):
    assert_clean_error(run(*argv), 2, contains)


def test_synth_host_matmul_json_report(tmp_path):
    out = tmp_path / "k"
    proc = run("synth", "matmul", "--hw", "host", "--shape", "m=37,n=45,k=29", "--bias", "--activation", "relu6",
               "--verify", "--json", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["verified"] is True and report["synthesis_seconds"] < 1.0
    assert (out / "report.json").is_file()
    kernel_sources = list(out.glob("*.c"))
    assert kernel_sources and "xfc" in kernel_sources[0].read_text()[:400]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "staging directory left behind"


@pytest.mark.parametrize("hw", ["mali-g78", "snapdragon-865"])
def test_synth_gpu_target_verifies_on_pocl_and_explains(hw, tmp_path):
    proc = run("synth", "conv2d", "--hw", hw, "--target", "gpu", "--shape", "c=5,h=11,w=13,k=7,r=3,s=3",
               "--pad", "1", "--bias", "--activation", "relu", "--verify", "--explain", "-o", str(tmp_path / "g"))
    assert proc.returncode == 0, proc.stderr
    assert "verified: yes" in proc.stdout and "PoCL on the host CPU" in proc.stdout
    assert "not a measurement" in proc.stdout
    assert ("NOT on chip" in proc.stdout) == (hw == "mali-g78")
