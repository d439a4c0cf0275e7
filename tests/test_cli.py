"""The `xfc` command line and its promises: exit codes with one-line messages (asserted, not only
the code), the reports of `synth` (--verify on the host and under qemu, --bench, the default output
directory, the text summary, the host ISA override), `hw` and its subcommands.

Most tests call `xfc.cli.main([...])` in-process (fast); one runs the installed console script.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import support
import xfc
from support import ALL_HOST_ISAS, RUNNABLE_ISAS, needs_arm, needs_opencl
from support.cli import run
from xfc.ops.spec import make_spec

XFC = shutil.which("xfc", path=str(Path(sys.executable).parent)) or "xfc"
SHIPPED = Path(__file__).resolve().parent.parent / "hardware_descriptions"


def assert_clean_error(result, code, contains):
    rc, out, err = result
    assert rc == code, (rc, out, err)
    assert "Traceback" not in out + err
    lines = [ln for ln in err.splitlines() if ln.startswith("xfc: error")]
    assert len(lines) == 1, err
    assert contains in lines[0], lines[0]


# ---------------------------------------------------------------------------------------------
# The console script, help, hw
# ---------------------------------------------------------------------------------------------

@pytest.mark.subprocess
def test_console_script_version_and_exit_code():
    env = {k: v for k, v in os.environ.items() if k != "XFC_DEBUG"}
    proc = subprocess.run([XFC, "--version"], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0 and proc.stdout.startswith(f"xfc {xfc.__version__}")
    bad = subprocess.run([XFC, "synth", "matmul", "--hw", "no-such-soc", "--shape", "m=4,n=4,k=4"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert bad.returncode == 2 and bad.stderr.count("xfc: error") == 1 and "unknown hardware" in bad.stderr


@pytest.mark.unit
@pytest.mark.parametrize("argv", [[], ["hw"], ["hw", "list"], ["hw", "show"], ["hw", "validate"], ["synth"],
                                  ["devices"], ["bench"]], ids=lambda a: "-".join(a) or "xfc")
def test_help_on_every_command(argv, capfd):
    code, out, _ = run([*argv, "--help"], capfd)
    assert code == 0 and out.startswith("usage: xfc")


@pytest.mark.unit
def test_no_command_and_hw_without_subcommand_print_usage(capfd):
    code, out, _ = run([], capfd)
    assert code == 2 and "usage: xfc" in out and "synth" in out
    code, out, _ = run(["hw"], capfd)
    assert code == 2 and "usage: xfc hw" in out
    for sub in ("list", "show", "validate"):
        assert sub in out


def console(*args):
    """The installed console script in a subprocess (what a user runs: the entry point, argv, exit status)."""
    env = {k: v for k, v in os.environ.items() if k != "XFC_DEBUG"}
    return subprocess.run([XFC, *args], capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.subprocess
def test_hw_list_counts(capfd):
    code, out, _ = run(["hw", "list", "--json"], capfd)
    assert code == 0
    rows = json.loads(out)
    layers = [r["layer"] for r in rows]
    assert layers.count("cpu") >= 10 and layers.count("gpu") >= 7 and layers.count("soc") >= 9
    assert "host" in [r["name"] for r in rows]
    proc = console("hw", "list")
    assert proc.returncode == 0 and "snapdragon-865" in proc.stdout
    assert any(ln.split()[:2] == ["host", "host"] for ln in proc.stdout.splitlines()), proc.stdout


@pytest.mark.subprocess
def test_hw_show_snapdragon_yaml_prints_clusters_gpu_and_peaks(capfd):
    proc = console("hw", "show", "snapdragon.yaml")
    assert proc.returncode == 0, proc.stderr
    for needle in ("CPU clusters", "GFLOP/s", "GPU:", "adreno", "prime", "little", "balance"):
        assert needle in proc.stdout, needle
    rows = [ln.split() for ln in proc.stdout.splitlines()]
    assert {"prime", "big", "mid", "little"} <= {r[0] for r in rows if r}   # one table row per cluster
    code, out, _ = run(["hw", "show", "snapdragon.yaml", "--json"], capfd)
    data = json.loads(out)
    assert data["derived"]["gpu_peak_fp32_gflops"] > 0 and len(data["clusters"]) == 4


@pytest.mark.host
def test_hw_show_host_and_forced_isas(capfd):
    code, out, _ = run(["hw", "show", "host", "--json"], capfd)
    assert code == 0
    data = json.loads(out)
    assert data["kind"] == "host" and data["target_arch"] == "x86_64"
    assert data["clusters"][0]["count"] == support.host_cpus()
    widths = {"avx512": 512, "avx2": 256, "generic": 128}
    for isa in ALL_HOST_ISAS:
        result = run(["hw", "show", f"host:{isa}", "--json"], capfd)
        if isa not in RUNNABLE_ISAS:
            assert_clean_error(result, 2, f"--hw host:{isa}: this CPU cannot run {isa} code")
            continue
        data = json.loads(result[1])
        core = data["clusters"][0]["core"]
        assert data["name"] == f"host:{isa}" and core["vector_bits"] == widths[isa]
        assert core["vector_registers"] == (32 if isa == "avx512" else 16)
        assert core["gcc_march"] == {"avx512": "x86-64-v4", "avx2": "x86-64-v3", "generic": "x86-64"}[isa]
    code, out, _ = run(["hw", "show", f"host:{RUNNABLE_ISAS[-1]}"], capfd)
    assert code == 0 and out.startswith(f"host:{RUNNABLE_ISAS[-1]}: ") and "limited to" in out


@pytest.mark.host
def test_host_isa_environment_variable(capfd, monkeypatch):
    narrowest = RUNNABLE_ISAS[-1]           # generic: every x86-64 CPU has it
    monkeypatch.setenv("XFC_HOST_ISA", narrowest)
    code, out, _ = run(["hw", "show", "host", "--json"], capfd)
    assert code == 0 and json.loads(out)["name"] == f"host:{narrowest}"
    assert_clean_error(run(["hw", "show", "host:avx512"], capfd), 2,
                       "this CPU cannot run avx512 code")
    monkeypatch.setenv("XFC_HOST_ISA", "sse4")
    assert_clean_error(run(["hw", "show", "host"], capfd), 2, "XFC_HOST_ISA=sse4: unknown host ISA 'sse4'")


@pytest.mark.unit
def test_hw_validate_reports_each_file(tmp_path, capfd):
    good = SHIPPED / "cpu" / "cortex-a76.yaml"
    bad = tmp_path / "broken.yaml"
    bad.write_text("kind: cpu_core\nname: broken\n  - : [\n")
    code, out, err = run(["hw", "validate", str(good), str(bad)], capfd)
    assert code == 2
    lines = out.splitlines()
    assert lines[0].startswith("OK    ") and "cortex-a76" in lines[0]
    assert lines[1].startswith("ERROR ") and "broken.yaml" in lines[1] and len(lines) == 2
    assert "Traceback" not in out + err


# ---------------------------------------------------------------------------------------------
# Errors: exit 2 with one line that names the problem
# ---------------------------------------------------------------------------------------------

@pytest.mark.unit
@pytest.mark.parametrize("content", ["", "\x00\x01binary", "kind: [", "kind: cpu_core\nname: x\n",
                                     "!!python/object/apply:os.system ['true']\n"],
                         ids=["empty", "binary", "yaml-error", "missing-fields", "python-tag"])
def test_broken_hw_file_for_synth_exits_2_one_line(tmp_path, content, capfd):
    path = tmp_path / "x.yaml"
    path.write_text(content)
    assert_clean_error(run(["synth", "matmul", "--hw", str(path), "--shape", "m=4,n=4,k=4"], capfd), 2, "x.yaml")


TOO_MANY_THREADS = support.host_cpus() + 1

BAD_REQUESTS = [
    (["synth", "softmax", "--hw", "host", "--shape", "m=1"], "invalid choice 'softmax'"),
    (["synth", "matmul", "--hw", "host", "--shape", "m=4,n=4"], "missing k"),
    (["synth", "matmul", "--hw", "host", "--shape", "m=4,n=0,k=4"], "'n' must be >= 1"),
    (["synth", "matmul", "--hw", "host", "--shape", "m=4,n=x,k=4"], "not an integer"),
    (["synth", "matmul", "--hw", "host", "--shape", "m=4,n=4,k=4,q=2"], "'q' is not used"),
    (["synth", "conv2d", "--hw", "host", "--shape", "c=3,h=4,w=4,k=8,r=7,s=7"], "does not fit"),
    (["synth", "conv2d", "--hw", "host", "--shape", "c=3,h=8,w=8,k=8,r=3,s=3", "--pad", "1,2,3"], "--pad takes"),
    (["synth", "matmul", "--hw", "no-such-soc", "--shape", "m=4,n=4,k=4"], "--hw no-such-soc: unknown hardware"),
    (["synth", "matmul", "--hw", "", "--shape", "m=4,n=4,k=4"], "--hw: empty hardware name"),
    (["synth", "matmul", "--hw", "host:sse", "--shape", "m=4,n=4,k=4"], "unknown host ISA 'sse'"),
    (["synth", "matmul", "--hw", "host:", "--shape", "m=4,n=4,k=4"], "name an ISA after 'host:'"),
    (["synth", "matmul", "--hw", "host", "--shape", "m=4,n=4,k=4", "--threads", str(TOO_MANY_THREADS)],
     f"--threads {TOO_MANY_THREADS} exceeds the {TOO_MANY_THREADS - 1} cores"),
    (["synth", "matmul", "--hw", "snapdragon-855", "--shape", "m=4,n=4,k=4", "--cluster", "mid"], "no 'mid' cluster"),
    (["synth", "matmul", "--hw", "cortex-a76", "--shape", "m=4,n=4,k=4", "--target", "gpu"],
     "--target gpu: cortex-a76 describes no GPU"),
    (["synth", "matmul", "--hw", "host", "--shape", "m=4,n=4,k=4", "--dtype", "fp16"],
     "no fp16 CPU kernels for host"),
    (["synth", "matmul", "--hw", "host", "--shape", "m=4,n=4,k=4", "--threads", "0"], "positive"),
    (["bench", "matmul", "--hw", "host", "--shape", "m=4,n=4,k=4", "--device", "qemu"],
     "xfc bench runs ARM kernels on a device or QEMU"),
    (["bench", "matmul", "--hw", "cortex-a76", "--shape", "m=4,n=4,k=4", "--device", "qemu", "--repeat", "0"],
     "--repeat must be >= 1, got 0"),
    # Numbers out of range are refused while parsing, naming the option (a negative seed reached numpy
    # as an internal error; --timeout 0 was a device error after the build; a port past 65535 went to adb).
    (["bench", "matmul", "--hw", "cortex-a76", "--shape", "m=4,n=4,k=4", "--device", "qemu", "--seed", "-1"],
     "xfc bench: argument --seed: must be an integer >= 0, got '-1'"),
    (["bench", "matmul", "--hw", "cortex-a76", "--shape", "m=4,n=4,k=4", "--device", "qemu", "--timeout", "0"],
     "argument --timeout: must be a number > 0, got '0'"),
    (["bench", "matmul", "--hw", "cortex-a76", "--shape", "m=4,n=4,k=4", "--device", "qemu", "--warmup", "-1"],
     "argument --warmup: must be an integer >= 0"),
    (["bench", "matmul", "--hw", "cortex-a76", "--shape", "m=4,n=4,k=4", "--device", "X", "--adb-port", "99999"],
     "argument --adb-port: must be a TCP port 1-65535, got '99999'"),
    (["model", "net.onnx", "--hw", "cortex-a76", "--verify", "--seed", "-1"], "xfc model: argument --seed: must be an integer >= 0"),
    (["model", "net.onnx", "--hw", "cortex-a76", "--seed", "3"], "--seed seeds the random inputs of --verify and --bench"),
    (["model", "net.onnx", "--hw", "cortex-a76", "--repeat", "3"], "--repeat sets the timed runs of --bench"),
    (["model", "net.onnx", "--hw", "cortex-a76", "--bench", "--thread-wait", "passive"],
     "--thread-wait sets how the benchmark program's threads wait: add --emit lib --bench"),
    # An option the subcommand does not know is named against the subcommand's help.
    (["bench", "matmul", "--hw", "cortex-a76", "--shape", "m=4,n=4,k=4", "--device", "qemu", "--bogus"],
     "xfc bench: unrecognized arguments: --bogus (see 'xfc bench --help')"),
    # A matmul has no window: a stride, pad or dilation would have been ignored.
    (["synth", "matmul", "--hw", "cortex-a76", "--shape", "m=4,n=4,k=4", "--pad", "1"],
     "--pad 1: applies to conv2d and depthwise, not matmul"),
    (["synth", "matmul", "--hw", "cortex-a76", "--shape", "m=4,n=4,k=4", "--stride", "2"],
     "--stride 2: applies to conv2d and depthwise, not matmul"),
]


def _kind(argv):
    """`--hw host` loads the host as the FMA probe measures it (gcc + a run, once per cache): host."""
    return pytest.mark.host if argv[argv.index("--hw") + 1] == "host" else pytest.mark.unit


@pytest.mark.parametrize("argv,contains", [pytest.param(a, c, marks=_kind(a)) for a, c in BAD_REQUESTS],
                         ids=[f"{i:02d}" for i in range(len(BAD_REQUESTS))])
def test_bad_requests_exit_2_with_one_line(argv, contains, capfd):
    assert_clean_error(run(argv, capfd), 2, contains)


@pytest.mark.host
def test_bad_requests_leave_no_output_directory(tmp_path, capfd, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run(["synth", "matmul", "--hw", "host", "--shape", "m=4,n=0,k=4"], capfd)
    run(["synth", "matmul", "--hw", "host", "--shape", "m=4,n=4,k=4", "--threads", str(TOO_MANY_THREADS)], capfd)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# synth on the host: --verify, --bench, the summary, the default directory, forced ISAs
# ---------------------------------------------------------------------------------------------

@pytest.mark.host
def test_synth_host_matmul_json_report(tmp_path, capfd):
    out_dir = tmp_path / "k"
    code, out, err = run(["synth", "matmul", "--hw", "host", "--shape", "m=37,n=45,k=29", "--bias", "--activation",
                          "relu6", "--verify", "--json", "-o", str(out_dir)], capfd)
    assert code == 0, err
    report = json.loads(out)
    assert report["verified"] is True and report["verified_on"] == "host (native)"
    assert report["error_to_bound_ratio"] <= 1.0 and report["hardware"] == xfc.load_hardware("host").name
    assert json.loads((out_dir / "report.json").read_text())["verified"] is True
    kernel_sources = list(out_dir.glob("*.c"))
    assert kernel_sources and "xfc" in kernel_sources[0].read_text()[:400]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "staging directory left behind"
    support.assert_clamps_for_seed(make_spec("matmul", dict(m=37, n=45, k=29), bias=True, activation="relu6"), 0)


@pytest.mark.host
@pytest.mark.parametrize("isa", ALL_HOST_ISAS)
def test_synth_bench_follows_the_host_isa(isa, tmp_path, capfd):
    """--hw host:<isa> end to end: the plan's ISA, the -march in build.sh, verification and the two
    timings (every sample > 0: the minimum is). An ISA the CPU lacks is exit 2, one line."""
    argv = ["synth", "conv2d", "--hw", f"host:{isa}", "--shape", "c=5,h=11,w=13,k=9,r=3,s=3", "--pad", "1",
            "--bias", "--activation", "relu", "--verify", "--bench", "--repeat", "4", "--json", "-o", str(tmp_path / "o")]
    result = run(argv, capfd)
    if isa not in RUNNABLE_ISAS:
        assert_clean_error(result, 2, f"--hw host:{isa}: this CPU cannot run {isa} code")
        return
    code, out, err = result
    assert code == 0, err
    report = json.loads(out)
    march = support.host_march(isa)
    assert report["hardware"] == f"host:{isa}" and report["isa"] == isa and report["verified"] is True
    assert f"-march={march}" in (tmp_path / "o" / "build.sh").read_text()
    m, per_call = report["measurement"], report["measurement_packing_per_call"]
    assert m["repeats"] == 4 and m["min_s"] > 0 and m["min_s"] <= m["median_s"] <= m["max_s"]
    assert "pre-packed" in m["where"] and m["weights"].startswith("pre-packed")
    assert per_call["repeats"] == 4 and per_call["median_s"] > 0 and per_call["weights"] == "packed inside every call"
    support.record(isa, "ran")


@pytest.mark.host
@pytest.mark.parametrize("isa", ALL_HOST_ISAS)
def test_xfc_host_isa_drives_the_console_script(isa, tmp_path):
    """XFC_HOST_ISA through the real console script: plain '--hw host' becomes that core for
    synthesis, the gcc -march, verification and timing; an ISA the CPU lacks is exit 2."""
    env = {k: v for k, v in os.environ.items() if k != "XFC_DEBUG"}
    argv = [XFC, "synth", "matmul", "--hw", "host", "--shape", "m=19,n=37,k=23", "--bias", "--activation", "relu6",
            "--verify", "--bench", "--repeat", "2", "--json", "-o", str(tmp_path / "o")]
    cap = support.host_isa_cap()
    if isa not in RUNNABLE_ISAS:
        if cap is not None and isa in support.supported_by_cpu():
            # this run poses as a smaller machine (XFC_HOST_ISA=cap): asking for more is refused
            argv[argv.index("host")] = f"host:{isa}"
            expected = f"--hw host:{isa}: this CPU cannot run {isa} code (XFC_HOST_ISA={cap} limits the host to {cap}"
        else:
            env["XFC_HOST_ISA"] = isa
            expected = f"XFC_HOST_ISA={isa}: this CPU cannot run {isa} code"
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 2 and proc.stderr.count("xfc: error") == 1, proc.stderr
        assert expected in proc.stderr and not (tmp_path / "o").exists()
        return
    env["XFC_HOST_ISA"] = isa
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["hardware"] == f"host:{isa}" and report["isa"] == isa and report["verified"] is True
    assert f"-march={support.host_march(isa)}" in (tmp_path / "o" / "build.sh").read_text()
    assert report["measurement"]["min_s"] > 0 and report["measurement_packing_per_call"]["median_s"] > 0
    support.record(isa, "ran")


@pytest.mark.host
def test_synth_text_summary(tmp_path, capfd):
    code, out, err = run(["synth", "depthwise", "--hw", "host", "--shape", "c=6,h=13,w=11,r=3,s=3", "--pad", "1",
                          "--verify", "--bench", "--repeat", "3", "-o", str(tmp_path / "d")], capfd)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"xfc synth depthwise for {xfc.load_hardware('host').name} (cpu): depthwise")
    for prefix in ("  tiles: ", "  synthesis: ", "  predicted: ", "  verified: yes on host (native)", "  measured: ",
                   "            ", f"  output: {tmp_path / 'd'}"):
        assert any(ln.startswith(prefix) for ln in lines), (prefix, out)
    assert "static cost model; not a measurement" in out and "packed inside every call" in out
    assert "[xfc] synthesized in" in err and "[xfc] built in" in err


@pytest.mark.host
def test_synth_default_output_directory(tmp_path, capfd, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(["synth", "matmul", "--hw", "host", "--shape", "m=9,n=10,k=11", "--json"], capfd)
    assert code == 0, err
    report = json.loads(out)
    spec = make_spec("matmul", dict(m=9, n=10, k=11))
    hw = xfc.load_hardware("host")
    cores = hw.cluster().count
    expected = Path("xfc-out") / f"{hw.name}-cpu" / f"{spec.key()}-fp32-{hw.cluster().role}-t{cores}"
    assert report["output_dir"] == str(expected)
    assert (tmp_path / expected / "report.json").is_file() and (tmp_path / expected / "build.sh").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["xfc-out"]


@pytest.mark.host
def test_default_output_directories_of_different_kernels_do_not_collide(tmp_path, capfd, monkeypatch):
    """Issue 35 item 1: an int8 run, a one-thread run and a forced lowering of the same shape each get
    their own default folder; none replaces the fp32 kernel written first."""
    monkeypatch.chdir(tmp_path)
    base = ["synth", "conv2d", "--hw", "host", "--shape", "c=16,h=14,w=14,k=16,r=3,s=3", "--pad", "1", "--json"]
    variants = ([], ["--dtype", "int8"], ["--threads", "1"], ["--lowering", "direct"],
                ["--dtype", "int8", "--quant", "act=int8"])
    dirs = []
    for extra in variants:
        code, out, err = run(base + extra, capfd)
        assert code == 0, (extra, err)
        dirs.append(json.loads(out)["output_dir"])
    assert len(set(dirs)) == len(variants), dirs
    assert "-int8-" in dirs[1] and "-t1" in dirs[2] and dirs[3].endswith("-direct")
    for d in dirs:   # every output is still there, whole
        assert (tmp_path / d / "report.json").is_file(), d
    first = json.loads((tmp_path / dirs[0] / "report.json").read_text())
    assert first.get("dtype", "fp32") == "fp32" and "int8" not in json.dumps(first.get("tiles"))


@pytest.mark.unit
def test_a_local_description_gets_its_own_default_folder(tmp_path):
    """A user's copy of a shipped SoC with other L2 sizes wrote into the shipped one's default folder
    (xfc-out/snapdragon-865-cpu/...), each replacing the other: a description from the user's own
    file adds a digest of what it describes; the same description always gives the same folder."""
    from xfc.cli.hardware import output_folder_name
    from xfc.hardware import SHIPPED_ROOT
    shipped = xfc.load_hardware("snapdragon-865")
    assert output_folder_name(shipped) == "snapdragon-865"
    text = (SHIPPED_ROOT / "soc" / "snapdragon-865.yaml").read_text()
    for folder, body in (("a", text), ("b", text), ("edited", text.replace("l2_kib: 512", "l2_kib: 256", 1))):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "snapdragon-865.yaml").write_text(body)    # a description's name is its file's
    assert "l2_kib: 512" in text
    same, again, edited = (output_folder_name(xfc.load_hardware(str(tmp_path / folder / "snapdragon-865.yaml")))
                           for folder in ("a", "b", "edited"))
    assert same == again and same.startswith("snapdragon-865-") and same != "snapdragon-865"
    assert edited.startswith("snapdragon-865-") and edited != same


@pytest.mark.host
def test_synth_replaces_its_own_output_directory(tmp_path, capfd):
    out_dir = tmp_path / "k"
    for shape in ("m=5,n=6,k=7", "m=8,n=6,k=7"):
        code, out, err = run(["synth", "matmul", "--hw", "host", "--shape", shape, "--json", "-o", str(out_dir)], capfd)
        assert code == 0, err
    assert json.loads((out_dir / "report.json").read_text())["shape"].startswith("matmul M=8")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k"]


# ---------------------------------------------------------------------------------------------
# synth on ARM descriptions (qemu) and --cluster
# ---------------------------------------------------------------------------------------------

@pytest.mark.emulated
@needs_arm
@pytest.mark.parametrize("hw,cluster,threads,qemu", [
    ("cortex-a53", None, None, "cortex-a53"),                 # in-order Armv8.0
    ("snapdragon.yaml", "little", "3", "max"),                # Armv9 A510 cluster, 3 threads
    ("snapdragon-865", "big", "2", "cortex-a76"),
])
def test_synth_verify_on_arm_descriptions(hw, cluster, threads, qemu, tmp_path, capfd):
    """--verify on an ARM description runs both entry points under qemu with the description's
    -cpu model; --cluster / --threads pick the cores the plan is for."""
    argv = ["synth", "conv2d", "--hw", hw, "--shape", "c=5,h=11,w=13,k=9,r=3,s=3", "--stride", "2", "--pad", "1",
            "--bias", "--activation", "relu6", "--verify", "--json", "-o", str(tmp_path / "o")]
    argv += (["--cluster", cluster] if cluster else []) + (["--threads", threads] if threads else [])
    code, out, err = run(argv, capfd)
    assert code == 0, err
    report = json.loads(out)
    assert report["verified"] is True and report["verified_on"] == f"qemu-aarch64 -cpu {qemu}"
    if cluster:
        hw_desc = xfc.load_hardware(hw)
        assert report["cluster"] == cluster and report["core"] == hw_desc.cluster(cluster).core.name
    if threads:
        assert report["threads"] == int(threads)
    assert (tmp_path / "o" / "build_arm.sh").is_file()
    support.assert_clamps_for_seed(make_spec("conv2d", dict(c=5, h=11, w=13, k=9, r=3, s=3), stride=2, pad=1,
                                             bias=True, activation="relu6"), 0)
    support.record("neon (qemu)", "ran")


# ---------------------------------------------------------------------------------------------
# synth --target gpu (PoCL)
# ---------------------------------------------------------------------------------------------

GPU_CONV = ["conv2d", "--target", "gpu", "--shape", "c=5,h=11,w=13,k=7,r=3,s=3", "--pad", "1", "--bias",
            "--activation", "relu"]


@pytest.mark.opencl
@needs_opencl
@pytest.mark.parametrize("hw", ["mali-g78", "snapdragon-865"])
def test_synth_gpu_target_verifies_on_pocl_and_explains(hw, tmp_path, capfd):
    code, out, err = run(["synth", GPU_CONV[0], "--hw", hw, *GPU_CONV[1:], "--verify", "--explain",
                          "-o", str(tmp_path / "g")], capfd)
    assert code == 0, err
    assert "verified: yes" in out and "PoCL on the host CPU" in out
    assert "not a measurement" in out
    assert ("NOT on chip" in out) == (hw == "mali-g78")
    support.assert_clamps_for_seed(make_spec("conv2d", dict(c=5, h=11, w=13, k=7, r=3, s=3), pad=1, bias=True,
                                             activation="relu"), 0)
    support.record("opencl (PoCL)", "ran")


@pytest.mark.opencl
@needs_opencl
def test_synth_gpu_fp16_runs_the_fp16_storage_variant(tmp_path, capfd):
    code, out, err = run(["synth", GPU_CONV[0], "--hw", "adreno-650", *GPU_CONV[1:], "--dtype", "fp16", "--verify",
                          "--bench", "--json", "-o", str(tmp_path / "h")], capfd)
    assert code == 0, err
    report = json.loads(out)
    assert report["run_variant"] == "fp16_storage" and report["verified"] is True
    assert report["measurement"]["median_s"] > 0 and all(s > 0 for s in report["measurement"]["samples_s"])
    half = list((tmp_path / "h").glob("*.fp16.cl"))
    assert len(half) == 1 and "#pragma OPENCL EXTENSION cl_khr_fp16 : enable" in half[0].read_text()
    support.record("opencl (PoCL)", "ran")


# ---------------------------------------------------------------------------------------------
# Issue 35: argument errors as one line with the closest name; one host description everywhere;
# effective GFLOP/s labelled next to the peak
# ---------------------------------------------------------------------------------------------

@pytest.mark.unit
@pytest.mark.parametrize("argv, contains", [
    (["synth", "matmu", "--hw", "x", "--shape", "m=1"], "did you mean 'matmul'?"),
    (["synth", "matmul", "--hw", "x", "--shape", "m=1", "--dtype", "fp61"], "did you mean 'fp16'?"),
    (["synth", "matmul", "--hw", "x", "--shape", "m=1", "--activation", "rleu6"], "did you mean 'relu6'?"),
    (["sinth", "matmul"], "did you mean 'synth'?"),
    (["synth", "matmul", "--hw", "snapdragon-856", "--shape", "m=4,n=4,k=4"], "did you mean 'snapdragon-865'?"),
    (["synth", "matmul", "--shape", "m=4,n=4,k=4"], "the following arguments are required: --hw"),
    (["synth", "matmul", "--hw", "cortex-a76", "--shape", "m=4,n=4,k=4", "--threds", "1"], "unrecognized arguments"),
])
def test_argument_errors_are_one_line_with_the_closest_name(argv, contains, capfd):
    """Issue 35 item 9: no usage block before the error, and a mistyped name gets the closest valid one."""
    code, out, err = run(argv, capfd)
    assert code == 2 and "Traceback" not in err and out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("xfc: error: ") and contains in err, err


@pytest.mark.host
def test_hw_list_and_hw_show_describe_the_host_alike(capfd):
    """Issue 35 item 6: 'xfc hw list' used the assumed host (two full-width FMAs per cycle) where
    'xfc hw show host' used the probed one: 166 vs 118 GFLOP/s per core on one machine."""
    code, out, err = run(["hw", "list", "--json"], capfd)
    assert code == 0, err
    row = next(r for r in json.loads(out) if r["name"] == "host")
    code, out, err = run(["hw", "show", "host", "--json"], capfd)
    assert code == 0, err
    shown = json.loads(out)["derived"]["clusters"][0]["peak_gflops_per_core"]
    assert row["clusters"][0]["peak_gflops_per_core"] == shown


@pytest.mark.host
def test_winograd_gflops_are_labelled_effective_next_to_the_peak(tmp_path, capfd):
    """Issue 35 item 8: a Winograd plan's GFLOP/s count the direct convolution's FLOPs and may exceed
    the cores' peak; the report says which basis it uses and gives the peak beside it."""
    argv = ["synth", "conv2d", "--hw", "host", "--shape", "c=64,h=28,w=28,k=64,r=3,s=3", "--pad", "1",
            "--threads", "1", "--bench", "--repeat", "3"]
    code, out, err = run(argv + ["--lowering", "winograd", "-o", str(tmp_path / "w")], capfd)
    assert code == 0, err
    assert "effective GFLOP/s (" in out and "measured:" in out and "effective GFLOP/s, median" in out
    assert "may exceed the peak of" in out
    report = json.loads((tmp_path / "w" / "report.json").read_text())
    hw = xfc.load_hardware("host")
    assert report["gflops_basis"] == "effective" and report["peak_gflops"] > 0
    code, out, err = run(argv + ["--lowering", "direct", "--json", "-o", str(tmp_path / "d")], capfd)
    direct = json.loads(out)
    assert code == 0 and direct["gflops_basis"] == "executed" and direct["peak_gflops"] == report["peak_gflops"]
    assert hw.cluster().count >= 1
